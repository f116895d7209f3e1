"""CENSOR (Zhang et al., NDSS 2025, Alg. 1, Eq. 12, §V-E).

For each of T trials and every layer l: draw a proposal g_r, remove its component
along the true layer gradient g_l, g_o = g_r - (<g_r, g_l> / <g_l, g_l>) g_l
(Eq. 12), and rescale g_o to ||g_l|| (Alg. 1, NORMALIZE_GRAD). Each candidate is
scored by the client's batch loss after one step theta - eta * g~ (eval mode,
eta = 1e-4 as in the official code); the candidate with the lowest loss is
uploaded. Every upload is orthogonal to the true gradient layer by layer.

Proposals (``proposal``): ``normal`` draws g_r ~ N(0, I) (Alg. 1 line 27, the
paper's default); ``public`` uses the gradient of a random batch of public
labelled images, the alternative of §V-E ("sampling from a public dataset other
than a normal distribution", Fig. 10). Either way the upload has no first-order
effect on the client's loss: the projection also removes the part of a public
gradient that the private one shares, most of its descent (docs/decisions.md has
the FL accuracies this gives).

Alg. 1 initialises the best with the clean gradient (line 11) and the official
code sends it when no trial beats the original loss; here the best trial is
always sent, as the paper's orthogonality argument (§IV) requires. The official
code also divides by ||g|| instead of ||g||^2 in Eq. 12 (not orthogonal unless
||g|| = 1): we follow the paper.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedleak.defenses.base import Defense, DefenseContext, register
from fedleak.fl.client import Update, gradient

PROPOSALS = ("normal", "public")


def orthogonalise(proposal: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``proposal`` minus its component along ``g`` (Eq. 12), rescaled to ``||g||``."""
    denom = (g * g).sum()
    if denom == 0:
        return torch.zeros_like(g)
    o = proposal - (proposal * g).sum() / denom * g
    return o * (g.norm() / (o.norm() + 1e-12))


def orthogonal_like(g: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A random normal direction orthogonal to ``g`` with the norm of ``g``."""
    return orthogonalise(torch.randn(g.shape, generator=generator).to(g.device), g)


@register("censor")
class Censor(Defense):
    knob = "trials"
    stronger_when = "lower"  # fewer trials: a less utility-optimised orthogonal upload

    def __init__(self, trials: int = 20, step: float = 1e-4, proposal: str = "normal",
                 public: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        if int(trials) != trials or trials < 1:
            raise ValueError(f"censor trials must be an integer >= 1, got {trials}")
        if step <= 0:
            raise ValueError(f"censor step must be > 0, got {step}")
        if proposal not in PROPOSALS:
            raise ValueError(f"censor proposal must be one of {PROPOSALS}, got {proposal!r}")
        if proposal == "public" and (public is None or len(public[0]) == 0):
            raise ValueError("censor proposal 'public' needs public labelled images (x, y)")
        self.trials, self.step, self.proposal = int(trials), step, proposal
        self.public = public

    def candidate(self, true: Update, model: nn.Module, batch_size: int,
                  generator: torch.Generator) -> Update:
        """One proposal, made orthogonal to ``true`` and rescaled, layer by layer."""
        if self.proposal == "normal":
            return {k: orthogonal_like(g, generator) for k, g in true.items()}
        x, y = self.public
        idx = torch.randperm(len(x), generator=generator)[:batch_size]
        device = next(model.parameters()).device
        with torch.enable_grad():
            proposal = gradient(model, x[idx].to(device), y[idx].to(device))
        return {k: orthogonalise(proposal[k].detach(), g) for k, g in true.items()}

    def __call__(self, ctx: DefenseContext) -> Update:
        true = ctx.true_gradient()
        params = {n: p.detach() for n, p in ctx.model.named_parameters()}
        was_training = ctx.model.training
        ctx.model.eval()
        best, best_loss = None, float("inf")
        with torch.no_grad():
            for _ in range(self.trials):
                candidate = self.candidate(true, ctx.model, len(ctx.x), ctx.generator)
                stepped = {k: params[k] - self.step * candidate[k] for k in params}
                loss = float(F.cross_entropy(functional_call(ctx.model, stepped, (ctx.x,)), ctx.y))
                if loss < best_loss:
                    best, best_loss = candidate, loss
        ctx.model.train(was_training)
        return best
