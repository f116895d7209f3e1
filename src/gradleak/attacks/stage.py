"""What an attack optimises, stated once: a :class:`Stage` (its variables' draw, render,
distance, regularisers, prior, projection, schedule and stopper), the :class:`Solution` a
solved stage gives, and the types the engine passes between them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from gradleak.attacks.early_stopping import Stopper
from gradleak.attacks.label_inference import infer_labels
from gradleak.attacks.objectives import DISTANCES, FORMED_DISTANCES
from gradleak.attacks.optimization import last_recorded
from gradleak.types import Observation

Variables = list[torch.Tensor]
# A gradient transformation T: (one problem's trial gradient, name -> (*shape), its images)
# -> the transformed gradient (GGL's adaptive T, estimated from the received gradient).
Transform = Callable[[Mapping[str, torch.Tensor], torch.Tensor], Mapping[str, torch.Tensor]]
# restart r -> the transformation of that restart's trial gradients (EOT's defense samples)
RestartTransforms = Callable[[int], Transform]
Moments = list[tuple[torch.Tensor, torch.Tensor]]
# an attack's own term: (images (P, B, ...), the BatchNorm input moments (P, C) of the last
# forward, computed when called) -> (P,); called once per evaluation
Prior = Callable[[torch.Tensor, Callable[[], Moments]], torch.Tensor]
# a misfit that is no gradient distance: one victim's cost of its restarts' images
# (R, B, C, H, W) -> (R,), differentiable in them (R-GAP's residual of a layer's system)
Cost = Callable[[torch.Tensor], torch.Tensor]
Loss = Callable[..., torch.Tensor]

@dataclass
class Stage:
    """One optimisation of an attack. P problems' variables are tensors (P, ...), the last
    ``fixed`` of them constants (GI-w's codes); ``draw(obs, rng)`` gives one restart's.
    ``render`` maps them to images (P, B, C, H, W) (None: the first variable is the images;
    a rendered stage's regularisers see its first variable as the latent). The loss is
    ``distance`` between each trial gradient (cross-entropy against ``labels(obs)`` or
    ``soft_labels(variables)``, changed by ``transform(obs)``) and ``target(obs)`` (default:
    the observed gradient), plus ``prior(observations, restarts)``'s term and the weighted
    ``regularizers``; ``distance`` is one of ``objectives.DISTANCES`` or, of formed trial
    gradients, ``FORMED_DISTANCES``. A stage whose misfit is no gradient distance gives
    ``cost(obs)``, victim ``obs``'s :data:`Cost`, in place of the distance (``distance``
    None; no trial gradient, so no labels, target, transformation or prior): its loss is
    that cost of the rendered images plus the regularisers. Adam, AdamW (on the gradient's
    sign when ``signed``; with ``lookahead`` alpha, the look-ahead step of
    ``optimization.optimize``, its second gradient where ``probe`` says) or L-BFGS runs
    ``iterations`` at ``lr``, times 0.1 at each fraction in ``milestones`` or
    ``lr_factor(t)``; after each step ``boxed`` clamps the first variable to [0, 1] and
    ``project(variable, start)`` replaces it. ``stopper`` is copied to every problem, or
    with ``joint`` to every victim, whose restarts then form one problem (their sum)."""

    distance: str | None
    lr: float
    iterations: int
    draw: Callable[[Observation, torch.Generator], Variables] | None = None
    regularizers: Mapping[str, float] = field(default_factory=dict)
    render: Callable[[Variables], torch.Tensor] | None = None
    labels: Callable[[Observation], torch.Tensor] = infer_labels
    soft_labels: Callable[[Variables], torch.Tensor] | None = None
    target: Callable[[Observation], Mapping[str, torch.Tensor]] | None = None
    transform: Callable[[Observation], Transform] | None = None
    prior: Callable[[list[Observation], int], Prior] | None = None
    optimizer: str = "adam"
    lookahead: float = 0.0
    probe: str = "descent"
    signed: bool = False
    milestones: Sequence[float] = ()
    lr_factor: Callable[[int], float] | None = None
    boxed: bool = False
    project: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    stopper: Stopper | None = None
    joint: bool = False
    fixed: int = 0
    cost: Callable[[Observation], Cost] | None = None

    def __post_init__(self) -> None:
        if self.cost is not None:
            given = [name for name in ("distance", "soft_labels", "target", "transform", "prior")
                     if getattr(self, name) is not None]
            if given:
                raise ValueError(f"a stage with a cost has no trial gradient; expected no "
                                 f"{', '.join(given)}, got {given[0]} {getattr(self, given[0])!r}")
            return
        if self.distance not in DISTANCES and self.distance not in FORMED_DISTANCES:
            raise ValueError(f"distance must be one of {sorted([*DISTANCES, *FORMED_DISTANCES])}"
                             f", got {self.distance!r}")
        if self.lookahead and self.optimizer == "lbfgs":
            raise ValueError(f"a look-ahead step (lookahead {self.lookahead}) is Adam's; "
                             f"expected optimizer 'adam' or 'adamw', got 'lbfgs'")

    def images(self, variables: Variables) -> torch.Tensor:
        """The images (N, B, C, H, W) of N problems' variables (each (N, ...))."""
        return variables[0] if self.render is None else self.render(variables)


@dataclass
class Solution:
    """A solved stage for V victims x R restarts: the final (last finite) ``variables``,
    each (V, R, ...); ``loss_trace`` (T, V, R), of which problem (v, r) recorded the first
    ``iterations[v, r]`` entries; why each stopped; the images at the asked iterations;
    ``evaluations`` (V, R): each problem's objective evaluations (``Trajectory``)."""

    stage: Stage
    variables: Variables
    loss_trace: torch.Tensor
    iterations: torch.Tensor
    stop_reasons: list[list[str]]
    snapshots: dict[int, torch.Tensor] = field(default_factory=dict)
    evaluations: torch.Tensor | None = None

    def final_loss(self) -> torch.Tensor:
        """(V, R) the last recorded loss of each problem; inf where none was recorded."""
        return last_recorded(self.loss_trace, self.iterations)

    def best_restart(self) -> torch.Tensor:
        """(V,) each victim's restart of lowest final loss (the first on ties)."""
        return self.final_loss().argmin(dim=1)

    def trace(self, victim: int, restart: int) -> list[float]:
        return self.loss_trace[:int(self.iterations[victim, restart]), victim, restart].tolist()

    def chosen(self, restarts: torch.Tensor) -> Variables:
        """The variables (V, ...) of restart ``restarts[v]`` of each victim v."""
        return [v[torch.arange(len(restarts), device=v.device), restarts.to(v.device)]
                for v in self.variables]

    def images(self) -> torch.Tensor:
        """The images (V, R, B, C, H, W) of every problem (not clamped)."""
        grid = self.variables[0].shape[:2]
        with torch.no_grad():
            return self.stage.images([v.flatten(0, 1) for v in self.variables]).unflatten(0, grid)


def image_start(obs: Observation, rng: torch.Generator) -> Variables:
    """A restart's images, from N(0, 1) (Inverting Gradients, iDLG, GI-x, GradInversion)."""
    return [obs.randn((obs.batch_size, *obs.input_shape), rng)]

