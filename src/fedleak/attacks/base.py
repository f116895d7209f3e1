"""Reconstruction, the attack registry and the per-victim driver (DESIGN §3).

An attack is ``attack(obs, stopper=None) -> Reconstruction``; ``build`` fills its
parameters from the schema's defaults (the papers').
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from fedleak.attacks.early_stopping import Stopper
from fedleak.attacks.stacked_gradients import forming_pays, unsupported
from fedleak.types import Observation
from fedleak.utils.registry import Registry


@dataclass
class Reconstruction:
    images: torch.Tensor  # (B, C, H, W) in [0, 1]
    labels: torch.Tensor  # (B,)
    loss_trace: list[float]
    iterations: int
    wall_time: float
    stop_reason: str
    restart: int = 0
    extra: dict = field(default_factory=dict)
    snapshots: dict[int, torch.Tensor] = field(default_factory=dict)  # iteration -> images


Attack = Callable[..., Reconstruction]
_REGISTRY = Registry("attacks")
register = _REGISTRY.register
available = _REGISTRY.available
needs = _REGISTRY.needs
registered = _REGISTRY.get  # the attack class of a name


def build(name: str, **params) -> Attack:
    """An attack by registered name; ``params`` override its schema defaults (the papers')."""
    return _REGISTRY.build(name, **params)


def reconstruct_all(attack: Attack, observations: list[Observation],
                    snapshots: Collection[int] = (), progress: str | None = None
                    ) -> list[Reconstruction]:
    """One Reconstruction per observation (victim), vectorised when possible (DESIGN §7).

    Victim v is attacked with seed ``attack.seed + v`` (when the attack has a ``seed``),
    as if built with that seed on its own. ``attack.reconstruct_many`` runs all victims
    at once when the attack has it and the problems vectorise: one model object with
    parameters only in layers ``stacked_gradients`` stacks (Conv2d, Linear, BatchNorm), the
    same batch size and input shape, no snapshots (a stopper stacks: each stacked
    problem, or a victim's joint seeds, stops on its own; DLG/iDLG run their own L-BFGS
    and stopper, their objectives evaluated together), Adam unless the attack says
    otherwise, more than one problem (one problem loops faster), the attack's
    ``vectorisable`` (when it has one:
    GGA with Adam; GIAS/GIML but the sparsified cost) and, when the attack's
    ``forms_gradients`` (each problem's trial gradient is formed, for an L2 distance or
    a transformation, and that was measured to pay only on small models), a model for
    which it pays (:func:`~fedleak.attacks.stacked_gradients.forming_pays`, up to the
    attack's ``stacked_parameters`` when it has its own measured limit), with a progress
    bar over victims (per chunk of victims stacked together). Otherwise (CMA-ES, the
    sparsified GIAS cost, other layers, large models under formed gradients)
    each victim is attacked in turn with ``attack(obs)``, with a progress bar (per
    victim, with an ETA) labelled ``progress``.
    ``snapshots`` asks for the reconstructions at those iterations (attacks whose
    ``__call__`` takes ``snapshots``; ValueError for the others).
    """
    if not observations:
        return []
    if snapshots and "snapshots" not in inspect.signature(attack.__call__).parameters:
        raise ValueError(f"{type(attack).__name__} cannot record snapshots; expected "
                         f"attack.snapshots: [] for it (dlg, idlg and inverting_gradients can)")
    first = observations[0]
    vectorisable = (
        hasattr(attack, "reconstruct_many")
        and getattr(attack, "vectorisable", True)
        and not snapshots
        and len(observations) * getattr(attack, "restarts", 1) > 1  # one problem: loop is faster
        and getattr(attack, "optimizer", "adam") == "adam"
        and not unsupported(first.model)
        and (not getattr(attack, "forms_gradients", False)
             or forming_pays(first.model, getattr(attack, "stacked_parameters", None)))
        and all(obs.model is first.model and obs.batch_size == first.batch_size
                and obs.input_shape == first.input_shape for obs in observations))
    if vectorisable:
        return attack.reconstruct_many(observations, progress=progress)
    extra = {"snapshots": snapshots} if snapshots else {}
    victims = tqdm(list(enumerate(observations)), desc=progress, unit="victim",
                   disable=progress is None, leave=False)
    return [_for_victim(attack, v)(obs, **extra) for v, obs in victims]


def _for_victim(attack: Attack, victim: int) -> Attack:
    """``attack`` with seed ``attack.seed + victim`` (a shallow copy), or ``attack`` itself."""
    if victim == 0 or not isinstance(getattr(attack, "seed", None), int):
        return attack
    seeded = copy.copy(attack)
    seeded.seed = attack.seed + victim
    return seeded


def stopper_from(spec: dict | Stopper | None) -> Stopper | None:
    """A Stopper from its configuration mapping (None: run every iteration)."""
    if spec is None or isinstance(spec, Stopper):
        return spec
    return Stopper(**spec)
