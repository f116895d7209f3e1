"""GIML: gradient inversions to meta-learn a generator (Jeon et al., NeurIPS 2021, §4.2, Alg. 2).

From a set S = {(theta_i, g_i)} of observed gradients only, starting from an
arbitrary (random) generator w, each outer step takes the next N tasks of S
(consecutive seeded permutations) and

1. per task, searches latent codes z_i* = argmin_z c(G_w(z); theta_i, g_i)
   + lambda sum_j ||z_ij||_2 from the current meta generator (Alg. 2, line 6);
2. adapts one copy w' of the generator to the N tasks at once, z* fixed:
   argmin_w' sum_i c(G_w'(z_i*); theta_i, g_i) (line 9);
3. moves w toward w' by one step of ``meta_optimizer`` on ||w - w'||^2 / 2
   (line 11): "adam" as the official code, or "sgd", whose step with lr beta is
   line 11's w <- w - beta (w - w') (Reptile).

The registered attack ``giml`` then runs GIAS (GI-z/w by default) with the
meta-learned generator. The cost c is GIAS's (its ``stage``): cosine gradient
distance + lambda_TV TV.

Defaults (the official meta-training script): 200 outer steps,
N = 1 task per step, 1,000 latent iterations (Adam, eta_z = 3e-2) and 500
parameter iterations (Adam, eta_w = 1e-3), both with lr x0.1 at 3/8, 5/8, 7/8,
lambda_TV = 1e-4, lambda = 1e-3, meta Adam lr 1e-2, one random start per task.
The paper gives no beta. Measured on digits with 8 outer steps: Adam lr 1e-2
moves every weight by about lr per step whatever its adaptation (Adam's early
steps are sign-like), and the reconstructions got worse after 2-3 steps on one
of two victim draws, while "sgd" with beta = 0.5 improved steadily on three.
Departure from Alg. 2: the inner searches use Adam with that schedule, as the
official code, instead of plain gradient steps. The FL model's slow change
between tasks (the official script takes an SGD step every 50 tasks) belongs to
how S is collected: each Observation carries its own model.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from gradleak.attacks.base import register
from gradleak.attacks.bn_statistics import preserved_buffers
from gradleak.attacks.gias import GIAS, MILESTONES
from gradleak.attacks.optimization import last_recorded, optimize
from gradleak.attacks.prior import frozen_copy, latent_dim, rendered, to_model_input
from gradleak.attacks.stage import Stage
from gradleak.attacks.victims import Victims
from gradleak.config import ConfigError
from gradleak.data.datasets import split_capacity
from gradleak.needs import Need, artifact
from gradleak.types import Observation

Callback = Callable[[int, nn.Module, dict], None]
META_OPTIMIZERS = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}


def _task_order(count: int, steps: int, per_step: int, rng: torch.Generator) -> list[list[int]]:
    """``steps`` groups of ``per_step`` task indices from consecutive seeded permutations."""
    flat: list[int] = []
    while len(flat) < steps * per_step:
        flat.extend(torch.randperm(count, generator=rng).tolist())
    return [flat[t * per_step:(t + 1) * per_step] for t in range(steps)]


def adapt(meta: nn.Module, tasks: Sequence[Observation], *, latent_iterations: int,
          parameter_iterations: int, lr_z: float, lr_w: float, z_norm: float, tv: float,
          distance: str, rng: torch.Generator) -> tuple[nn.Module, dict]:
    """Alg. 2 lines 4-10: regularised latent searches per task, then one integrated w'."""
    frozen = frozen_copy(meta, tasks[0].device)
    regularizers = {"tv": tv, **({"latent_norm": z_norm} if z_norm > 0 else {})}
    latents, latent_losses, costs = [], [], []
    for obs in tasks:
        task = Victims([obs], restarts=1, seed=0, stacked=False)
        search = task.solve(Stage(distance, lr_z, latent_iterations, regularizers=regularizers,
                                  render=rendered(frozen, obs.input_shape),
                                  milestones=MILESTONES),
                            [obs.randn((obs.batch_size, meta.latent_dim), rng)[None, None]])
        latents.append(search.variables[0][0, 0])
        latent_losses.append(float(search.final_loss()[0, 0]))
        costs.append(task.loss(Stage(distance, lr_w, parameter_iterations,
                                     regularizers={"tv": tv})))
    adapted = copy.deepcopy(frozen).eval().requires_grad_(True)

    def integrated_cost() -> torch.Tensor:  # (1,): one problem
        return sum(cost(to_model_input(adapted(z), obs.input_shape).unsqueeze(0))
                   for obs, cost, z in zip(tasks, costs, latents))

    trajectory = optimize(list(adapted.parameters()), integrated_cost, optimizer="adam",
                          lr=lr_w, iterations=parameter_iterations, milestones=MILESTONES)
    return adapted, {"latent_loss": latent_losses,
                     "parameter_loss": float(last_recorded(trajectory.loss_trace,
                                                           trajectory.iterations)[0])}


def _outer_step(meta: nn.Module, meta_opt: torch.optim.Optimizer,
                tasks: Sequence[Observation], rng: torch.Generator, **inner) -> dict:
    """Alg. 2 lines 4-11: adapt w' to the tasks, then one Adam step on ||w' - w||^2."""
    adapted, entry = adapt(meta, tasks, rng=rng, **inner)
    meta_opt.zero_grad()
    half_gap = sum(((p - q.detach()) ** 2).sum() for p, q in zip(meta.parameters(),
                                                                adapted.parameters())) / 2
    half_gap.backward()  # d/dw = w - w': SGD with lr beta is Alg. 2 line 11
    meta_opt.step()
    entry["meta_gap"] = float((2 * half_gap.detach()).sqrt())
    return entry


def meta_learn_generator(observations: Sequence[Observation], generator: nn.Module, *,
                         outer_steps: int, tasks_per_step: int, latent_iterations: int,
                         parameter_iterations: int, lr_z: float, lr_w: float,
                         meta_optimizer: str, meta_lr: float, tv: float, z_norm: float,
                         seed: int, distance: str = "cosine", callback: Callback | None = None,
                         keep: Callable[[dict], None] | None = None,
                         resume_from: dict | None = None) -> tuple[nn.Module, list[dict]]:
    """Alg. 2: a generator meta-learned from ``observations``; returns it (eval mode) and a log.

    The keyword arguments are the configuration's ``giml:`` block (its schema holds the
    defaults). ``generator`` (e.g. a randomly initialised DCGAN with a ``latent_dim``) is
    not modified. After each outer step ``callback(step, generator, entry)`` sees the
    current meta generator and the step's log entry; ``keep(state)`` the whole state
    after it, from which ``resume_from`` continues (``experiment.resume``).
    """
    if not observations:
        raise ValueError("meta_learn_generator needs at least one observation, got none")
    if outer_steps < 1:
        raise ValueError(f"outer_steps must be >= 1, got {outer_steps}")
    if not 1 <= tasks_per_step <= len(observations):
        raise ValueError(f"tasks_per_step must be in [1, {len(observations)}], "
                         f"got {tasks_per_step}")
    if meta_optimizer not in META_OPTIMIZERS:
        raise ValueError(f"meta_optimizer must be one of {sorted(META_OPTIMIZERS)}, "
                         f"got {meta_optimizer!r}")
    latent_dim(generator)
    rng = torch.Generator().manual_seed(seed)
    meta = copy.deepcopy(generator).to(observations[0].device).eval().requires_grad_(True)
    meta_opt = META_OPTIMIZERS[meta_optimizer](meta.parameters(), lr=meta_lr)
    inner = dict(latent_iterations=latent_iterations, parameter_iterations=parameter_iterations,
                 lr_z=lr_z, lr_w=lr_w, z_norm=z_norm, tv=tv, distance=distance)
    log: list[dict] = []
    order = _task_order(len(observations), outer_steps, tasks_per_step, rng)
    done = 0
    if resume_from is not None:
        done = resume_from["step"]
        meta.load_state_dict(resume_from["meta"])
        meta_opt.load_state_dict(resume_from["meta_opt"])
        rng.set_state(resume_from["rng"])
        log += resume_from["log"]
    with ExitStack() as stack:  # train-mode BatchNorm would update the models' running stats
        for model in {id(obs.model): obs.model for obs in observations}.values():
            stack.enter_context(preserved_buffers(model))
        steps = tqdm(enumerate(order[done:], start=done + 1), desc="giml", initial=done,
                     total=outer_steps, unit="step", leave=False)
        for step, tasks in steps:
            entry = _outer_step(meta, meta_opt, [observations[i] for i in tasks], rng, **inner)
            entry.update(step=step, tasks=tasks)
            log.append(entry)
            if callback is not None:
                callback(step, meta, entry)
            if keep is not None:
                keep({"step": step, "meta": meta.state_dict(), "rng": rng.get_state(),
                      "meta_opt": meta_opt.state_dict(), "log": log})
    return meta.eval().requires_grad_(False), log


def steps(giml: Mapping) -> list[int]:
    """The outer steps whose generator is kept: ``giml.checkpoints`` and the final one."""
    return sorted({*giml["checkpoints"], giml["outer_steps"]})


@register("giml")
class GIML(GIAS):
    """GIAS with the generator produced by :func:`meta_learn_generator` (GI-z/w by default):
    the one of outer step ``step`` (one of ``giml.checkpoints``; 0: the random start; None:
    the final step), Fig. 6."""

    needs = {"generator": Need("giml_generator")}

    @classmethod
    def check_config(cls, params: Mapping[str, Any], config: Mapping, where: str) -> None:
        """``step`` one that 'giml.checkpoints' keeps (or null: the final step); no
        ``prior_dataset`` (the generator is meta-learned from the case's gradients); each
        case's train split holds the ``giml.observations`` x ``giml.batch_size`` images it
        observes."""
        step, kept = params.get("step"), steps(config["giml"])
        if step is not None and step not in kept:
            raise ConfigError(f"invalid config: '{where}.step': GIML step {step!r} is not kept; "
                              f"expected one of {kept} ('giml.checkpoints' "
                              f"{config['giml']['checkpoints']} and the final step "
                              f"'giml.outer_steps' {config['giml']['outer_steps']}) or null (the "
                              f"final step)", key=f"{where}.step")
        if params.get("prior_dataset") is not None:
            raise ConfigError(f"invalid config: '{where}.prior_dataset': giml's generator is "
                              f"meta-learned from the case's gradients, of no dataset; expected "
                              f"null, got {params['prior_dataset']!r}",
                              key=f"{where}.prior_dataset")
        giml = config["giml"]
        for case in config["cases"]:  # its clients' distinct observed images
            name = case["dataset"]
            capacity = split_capacity(name, config["datasets"].get(name, {}))
            if capacity is not None and giml["observations"] * giml["batch_size"] > capacity:
                raise ConfigError(f"invalid config: 'giml.observations' x 'giml.batch_size' = "
                                  f"{giml['observations']} x {giml['batch_size']} distinct "
                                  f"images, but the train split of {name!r} holds at most "
                                  f"{capacity}; expected fewer")

    @classmethod
    def needs_for(cls, params: Mapping[str, Any]) -> dict[str, str]:
        """Its meta-learned generator at ``step`` (asked for before any job runs)."""
        if params.get("prior", "trained") != "trained":
            raise ValueError(f"giml's generator is the meta-learned one; expected prior "
                             f"'trained', got {params['prior']!r} (gias takes 'untrained')")
        if params.get("prior_dataset") is not None:
            raise ValueError(f"giml's generator is meta-learned from the case's gradients, of "
                             f"no dataset; expected prior_dataset null, got "
                             f"{params['prior_dataset']!r} (gias takes one)")
        return {"generator": artifact("giml_generator", params.get("step"))}
