"""R-GAP, the Recursive Gradient Attack on Privacy (Zhu and Blaschko, ICLR 2021, §3,
Eqs. 6-15 and Alg. 1; rank analysis §4), as GIAS App. C writes it (Eqs. 9-10): closed
form, layer by layer from the output to the input.

For a network of R-GAP's standard form (convolutions, then one Linear layer; activations
LeakyReLU, Sigmoid or none; no pooling or normalisation) and one image:

1. Last layer. dL/dW = g x^T with g = softmax(z) - e_y. With a bias, g = dL/db; without
   one (CNN6), x = a d with d = -dW_y / |dW_y| and the scale a > 0 solves
   a (softmax(a W d) - e_y) = dW d (the C-class counterpart of R-GAP's inversion of
   mu l'(mu) = <W, dW> for its one-logit logistic loss). The label y is the observed one
   when the attacker knows it, else the row of dW whose inner products with all the
   others are negative (only g_y < 0).
2. Each convolution r, from the top, takes its recovered output a_r (the next layer's
   input) and k_r = dL/dz_r = (W_{r+1}^T k_{r+1}) * sigma'(z_r), and solves A_r x_r = b_r
   (Eq. 9): the gradient constraints dW_r = k_r U(x_r)^T (U: im2col) stacked on the forward
   constraints W_r U(x_r) = sigma^{-1}(a_r) - bias, in the least-squares sense (Eq. 10)
   by the pseudo-inverse with relative singular-value cutoff ``rcond``.

Departures from the official code, each leaving the solution of an exact system
unchanged: float64 throughout (the official float32 loses the deeper layers); the input's
zero padding is left out of the unknowns instead of pinned by extra rows; each block of
rows is divided by the norm of its coefficients (k_r or W_r), so the gradient block is not
lost beside the forward block; the system is solved through A^T A (A is sparse; A itself
would take up to 1 GB per layer on CNN6). ``rcond`` defaults to 1e-7 (the official
``numpy.linalg.lstsq(rcond=None)`` on float32 cuts at 1.2e-7 x max(rows, columns)).
``extra["layers"]``: per layer, input first, its rank analysis (unknowns, gradient and
forward constraints, numerical rank), residual and how it was solved; ``extra["inputs"]``:
each layer's recovered input, for :func:`gradleak.metrics.layer_errors` (both recorded).

R-GAP with a generative model (GIAS App. C, Eq. 11; Fig. A1). ``prior_layers`` = k > 0
replaces the recursion for the k convolutions nearest the input, counted from the input
side (GIAS: "a substantial gain from using the generative model for a few layers (one or
two)", the rank-deficient second convolution of Fig. A1 among them; k = the number of
convolutions is "every layer"). The convolutions above them are solved as above; the
system A_k x_k = b_k of convolution k, whose unknown x_k is its input, is then solved by
the latent space search min_z |A_k f_{theta,k}(G(z)) - b_k|^2 over z only (as for Fig.
A1), f_{theta,k} the network from the image to x_k (GIAS's f_{theta,r}, the output of
layer r = k - 1; the identity for k = 1). Once x_k =
f_{theta,k}(G(z*)), the image that gives it is G(z*), and every layer below is
f_{theta,r}(G(z*)): the generator fixes the whole input, so the rows of the lower systems
could only move it off the prior's range (and a pseudo-inverse would put back exactly the
minimum-norm component the prior is there to choose in a rank-deficient layer). Their
errors are those of f_{theta,r}(G(z*)). The search is GIAS's latent stage (App. H), run
by the engine as every attack's stage (``RGAP.stage``, a ``stage.Stage`` whose ``cost``
is this system's, no gradient distance): Adam with eta_z = 3e-2, lr x0.1 at 3/8, 5/8 and
7/8 of ``latent_iterations`` (1,500, §5.1), z ~ N(0, I) drawn from the attack's seed, the
best of ``latent_restarts`` (4) by the cost at their final codes, on the model's device in
float32; the cost is the squared residual of the row-scaled system above relative to
|b_k|^2. The generator is the GAN prior of ``prior_dataset`` (None: ``gan.dataset``;
``needs_for``: only when prior_layers > 0);
the reconstruction is G(z*). ``loss_trace``: the closed-form layers' residuals from the
top, then the latent cost per step and its final value (``final_loss``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gradleak.attacks.base import Attack, register
from gradleak.attacks.gias import MILESTONES
from gradleak.attacks.prior import frozen_copy, latent_dim, rendered
from gradleak.attacks.reconstruction import Reconstruction
from gradleak.attacks.rgap_system import analysed, solve, system_cost
from gradleak.attacks.stage import Stage
from gradleak.attacks.victims import Victims
from gradleak.config import ConfigError
from gradleak.metrics.layers import layer_errors
from gradleak.needs import Need, artifact
from gradleak.types import Observation

__all__ = ["RGAP", "layer_errors", "recover", "standard_form"]

ACTIVATIONS = (nn.LeakyReLU, nn.Sigmoid)


def standard_form(model: nn.Module) -> list[tuple[str, nn.Module, nn.Module | None]]:
    """(name, layer, activation) of R-GAP's standard form, input first; ValueError else."""
    where = f"R-GAP needs a model of its standard form (Conv2d layers, then one Linear; " \
            f"LeakyReLU, Sigmoid or no activation; no pooling or normalisation): " \
            f"{type(model).__name__} has"
    chain: list = []
    for name, m in model.named_modules():
        if list(m.children()) or isinstance(m, (nn.Identity, nn.Flatten)):
            continue
        if isinstance(m, nn.LeakyReLU) and m.negative_slope <= 0:
            raise ValueError(f"{where} {name}: LeakyReLU of slope {m.negative_slope} "
                             "(not invertible)")
        if isinstance(m, ACTIVATIONS) and chain and chain[-1][2] is None:
            chain[-1][2] = m
        elif isinstance(m, nn.Conv2d) and m.groups == m.dilation[0] == m.dilation[1] == 1 \
                and m.padding_mode == "zeros" and not isinstance(m.padding, str) \
                or isinstance(m, nn.Linear):
            chain.append([name, m, None])
        else:
            raise ValueError(f"{where} {name}: {type(m).__name__}")
    if not chain or not isinstance(chain[-1][1], nn.Linear) or chain[-1][2] is not None \
            or any(isinstance(m, nn.Linear) for _, m, _ in chain[:-1]):
        raise ValueError(f"{where} layers {[type(m).__name__ for _, m, _ in chain]}; "
                         "expected Conv2d layers then one final Linear without activation")
    return [tuple(link) for link in chain]


def _invert(act: nn.Module | None, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The pre-activation z = sigma^{-1}(a) and sigma'(z), from the activation's output a."""
    if isinstance(act, nn.LeakyReLU):
        slope = act.negative_slope
        return torch.where(a < 0, a / slope, a), torch.where(a < 0, slope, 1.0).to(a)
    if isinstance(act, nn.Sigmoid):
        a = a.clamp(1e-12, 1 - 1e-12)
        return torch.log(a / (1 - a)), a * (1 - a)
    return a, torch.ones_like(a)


def _head(weight, grad, bias_grad, label):
    """(x, g, y): the last layer's input, dL/dz and the label (step 1 of the docstring)."""
    if label is None:
        sign = (grad @ grad.T < 0).sum(1) if bias_grad is None else -bias_grad
        label = int(sign.argmax())
    if bias_grad is not None:
        return grad.T @ bias_grad / bias_grad.square().sum(), bias_grad, label
    d = -grad[label] / grad[label].norm()
    h, w = (grad @ d).numpy(), (weight @ d).numpy()
    onehot = np.eye(len(h))[label]

    def misfit(log_a: float) -> float:
        a = np.exp(log_a)
        return float(np.square(a * (np.exp(a * w - np.logaddexp.reduce(a * w)) - onehot) - h).sum())

    grid = np.log(np.linalg.norm(h)) + np.linspace(-1.0, 25.0, 2001)
    best = int(np.argmin([misfit(t) for t in grid]))
    bounds = (grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)])
    from scipy import optimize  # imported on use: slow to import, and every job imports rgap

    found = optimize.minimize_scalar(misfit, bounds=bounds, method="bounded",
                                     options={"xatol": 1e-12})
    a = float(np.exp(found.x))
    return a * d, torch.from_numpy(h) / a, label


def _forward(chain, image: torch.Tensor, count: int) -> list[torch.Tensor]:
    """The inputs of the first ``count`` layers of ``chain`` on ``image`` (image first)."""
    xs = [image]
    for _, layer, act in chain[:count - 1]:
        y = F.conv2d(xs[-1], layer.weight.detach().to(image), None if layer.bias is None
                     else layer.bias.detach().to(image), stride=layer.stride,
                     padding=layer.padding)
        xs.append(y if act is None else act(y))
    return xs


def recover(model: nn.Module, gradient, input_shape, label: int | None, rcond: float,
            prior_layers: int = 0):
    """(recovered inputs, input first; their layer reports; the label; the latent search's
    cost, None without one). Without a prior, every layer's input. With ``prior_layers`` = k
    > 0 the recursion stops at convolution k: the inputs and reports of the layers above it,
    convolution k's report first (its rank analysis) and Eq. 11's cost of its input
    (:func:`system_cost`, on the model's device), which the latent search minimises through
    the generator (module docstring; :func:`searched` completes the layers below)."""
    chain = standard_form(model)
    shapes, x = [], torch.zeros(1, *input_shape, dtype=torch.float64)
    for _, layer, _ in chain[:-1]:  # each convolution's (input, output) shape
        y = F.conv2d(x, layer.weight.detach().cpu().double(), stride=layer.stride,
                     padding=layer.padding)
        shapes.append((tuple(x.shape[1:]), tuple(y.shape[1:])))
        x = y
    params = {id(p): n for n, p in model.named_parameters()}

    def observed(p):
        return None if p is None else gradient[params[id(p)]].detach().cpu().double()

    name, upper, _ = chain[-1]
    grad = observed(upper.weight)
    x, k, label = _head(upper.weight.detach().cpu().double(), grad, observed(upper.bias), label)
    inputs, reports = [x], [{"name": name, "unknowns": x.numel(), "gradient_constraints":
                             grad.numel(), "forward_constraints": len(k), "rank": x.numel(),
                             "residual": float((grad - torch.outer(k, x)).norm() / grad.norm()),
                             "solved": "head"}]
    for r, ((name, conv, act), (shape, out_shape)) in reversed(list(enumerate(zip(
            chain[:-1], shapes)))):
        z, slope = _invert(act, inputs[0].reshape(out_shape))
        w_up = upper.weight.detach().cpu().double()
        if isinstance(upper, nn.Linear):
            d_out = (w_up.T @ k).reshape(out_shape)
        else:
            d_out = torch.nn.grad.conv2d_input((1, *out_shape), w_up, k.unsqueeze(0),
                                               stride=upper.stride, padding=upper.padding)[0]
        k = d_out * slope
        system = (conv, conv.weight.detach().cpu().double(), observed(conv.weight),
                  None if conv.bias is None else conv.bias.detach().cpu().double(), k, z)
        if r + 1 == prior_layers:  # Eq. 11: x_r = f_{theta,r}(G(z*)), and every layer below
            reports.insert(0, {"name": name, **analysed(*system, shape, rcond),
                               "solved": "latent search"})
            return inputs, reports, label, system_cost(
                *system, device=next(model.parameters()).device)
        x, report = solve(*system, shape, rcond)
        inputs.insert(0, x)
        reports.insert(0, {"name": name, **report})
        upper = conv
    return inputs, reports, label, None


def searched(model: nn.Module, image: torch.Tensor, cost: float, prior_layers: int,
             inputs: list, reports: list[dict]) -> tuple[list, list[dict]]:
    """Every layer's input and report once the latent search found G(z*) = ``image`` (1, C,
    H, W) at ``cost``, from :func:`recover`'s for the layers above (``inputs``) and from
    convolution k = ``prior_layers`` up (``reports``): the k lowest inputs f_{theta,r}(G(z*))
    (float64), convolution k's residual sqrt(cost)."""
    chain = standard_form(model)
    below = _forward(chain, image.detach().cpu().double(), prior_layers)
    shapes = [tuple(x.shape[1:]) for x in below]
    report = {**reports[0], "residual": float(np.sqrt(max(cost, 0.0)))}
    lower = [{"name": n, "unknowns": int(np.prod(s)), "solved": "G(z*)"}
             for (n, _, _), s in zip(chain[:prior_layers - 1], shapes)]
    return [each[0] for each in below] + inputs, lower + [report] + reports[1:]


@register("rgap")
class RGAP(Attack):
    """R-GAP (module docstring); closed form (no restarts), one victim at a time; with
    ``prior_layers`` > 0, R-GAP with a generative model (GIAS Eq. 11), whose latent search
    is the engine's :meth:`stage`, ``latent_restarts`` restarts."""

    vectorisable = False
    records_snapshots = False
    needs = {"generator": Need("gan")}

    @classmethod
    def budget(cls, params: Mapping[str, Any]) -> int:
        """Closed form: one solve, or the latent search's restarts with a generative model."""
        return params["latent_iterations"] * params["latent_restarts"] \
            if params["prior_layers"] else 1

    @classmethod
    def check_config(cls, params: Mapping[str, Any], config: Mapping, where: str) -> None:
        """``prior_layers`` > 0 needs a DCGAN trained here (a ``prior_dataset`` of none)."""
        gan, of = config["gan"], params.get("prior_dataset")
        if params.get("prior_layers") and gan["kind"] != "dcgan" and of in (
                None, gan["dataset"], *gan["by_dataset"]):
            raise ConfigError(f"invalid config: '{where}.prior_layers': R-GAP's latent search "
                              f"needs a DCGAN trained here; the prior of {of or gan['dataset']!r}"
                              f" is pretrained (gan.kind {gan['kind']}); expected 0, or a "
                              f"prior_dataset of none pretrained, got {params['prior_layers']!r}",
                              key=f"{where}.prior_layers")

    @classmethod
    def needs_for(cls, params: Mapping[str, Any]) -> dict[str, str]:
        """The GAN prior (of ``prior_dataset``; None: the configuration's GAN dataset), only
        when some layers are solved through it."""
        if params["prior_layers"] == 0:
            return {}
        return {"generator": artifact("gan", params.get("prior_dataset"))}

    def __init__(self, *, rcond: float, prior_layers: int, latent_iterations: int,
                 lr_z: float, latent_restarts: int, prior_dataset: str | None,
                 generator: nn.Module | None = None, seed: int = 0) -> None:
        if prior_layers > 0:
            latent_dim(generator)
        self.rcond, self.prior_layers, self.generator = rcond, prior_layers, generator
        self.prior_dataset = prior_dataset
        self.latent_iterations, self.lr_z, self.latent_restarts = (latent_iterations, lr_z,
                                                                   latent_restarts)
        self.restarts = latent_restarts if prior_layers > 0 else 1  # the latent search's
        self.seed = seed  # draws the latent codes (the closed form is deterministic)

    def check(self, obs: Observation) -> None:
        convs = len(standard_form(obs.model)) - 1
        if self.prior_layers > convs:
            raise ValueError(f"R-GAP prior_layers {self.prior_layers} exceeds the {convs} "
                             f"convolution layers of {type(obs.model).__name__}; expected "
                             f"0 .. {convs}")
        if obs.batch_size != 1:
            raise ValueError(f"R-GAP recovers one image from its gradient; got batch_size "
                             f"{obs.batch_size} for {type(obs.model).__name__}")

    def stage(self, victims: Victims, costs: Mapping[int, Callable[[torch.Tensor], torch.Tensor]]
              ) -> Stage:
        """Eq. 11 over z only, GIAS's latent stage (App. H): each victim's restarts minimise
        ``costs[id(obs)]`` (its convolution k's :func:`system_cost`) of f_{theta,k}(G(z)),
        from z ~ N(0, I); Adam at ``lr_z``, x0.1 at 3/8, 5/8 and 7/8."""
        frozen = frozen_copy(self.generator, victims.device)
        dim, depth = latent_dim(frozen), self.prior_layers
        chain = standard_form(victims.model)
        return Stage(None, self.lr_z, self.latent_iterations, milestones=MILESTONES,
                     draw=lambda obs, rng: [obs.randn((1, dim), rng)],
                     render=rendered(frozen, victims.observations[0].input_shape),
                     cost=lambda obs: lambda images: costs[id(obs)](
                         _forward(chain, images[:, 0], depth)[-1]))

    def reconstruct(self, victims: Victims) -> list[Reconstruction]:
        for obs in victims.observations:
            self.check(obs)
        recovered = [recover(obs.model, obs.gradient, obs.input_shape,
                             None if obs.labels is None else int(obs.labels[0]), self.rcond,
                             self.prior_layers) for obs in victims.observations]
        if self.prior_layers:  # the latent search of every victim's restarts, then its layers
            stage = self.stage(victims, {id(obs): cost for obs, (*_, cost) in zip(
                victims.observations, recovered)})
            solution = victims.solve(stage)
            images = solution.images()
            final = torch.nan_to_num(victims.distances(stage, images), nan=math.inf).cpu()
            best = final.argmin(1)
        out = []
        for v, (obs, (inputs, reports, label, _)) in enumerate(zip(victims.observations,
                                                                    recovered)):
            closed = [r["residual"] for r in reversed(reports) if r["solved"] in (
                "head", "pseudo-inverse")]
            latent, restart = [], 0
            if self.prior_layers:
                restart = int(best[v])
                latent = solution.trace(v, restart) + [float(final[v, restart])]
                inputs, reports = searched(obs.model, images[v, restart], latent[-1],
                                           self.prior_layers, inputs, reports)
            param = next(obs.model.parameters())
            image = inputs[0].reshape(1, *obs.input_shape).to(param)
            trace = closed + latent
            out.append(Reconstruction(
                image.clamp(0, 1), torch.tensor([label], device=param.device), trace,
                len(trace), 0.0, "closed_form" if not latent else "closed_form+latent_search",
                restart=restart, extra={"layers": reports, "inputs": [x.float() for x in inputs]}))
        return out
