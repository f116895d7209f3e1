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
from fedleak.types import Need, Update
from fedleak.utils.modes import eval_mode


def orthogonalise(proposal: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``proposal`` minus its component along ``g`` (Eq. 12), rescaled to ``||g||``."""
    denom = (g * g).sum()
    if denom == 0:
        return torch.zeros_like(g)
    o = proposal - (proposal * g).sum() / denom * g
    return o * (g.norm() / (o.norm() + 1e-12))


def orthogonal_like(g: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    """A random normal direction orthogonal to ``g`` with the norm of ``g``."""
    return orthogonalise(torch.randn(g.shape, generator=rng).to(g.device), g)


@register("censor")
class Censor(Defense):
    needs = {"public": Need("public_data", when={"proposal": ("public",)})}

    def __init__(self, *, trials: int, step: float, proposal: str,
                 public: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        if proposal == "public" and (public is None or len(public[0]) == 0):
            raise ValueError("censor proposal 'public' needs public= labelled images (x, y), "
                             "got none")
        self.trials, self.step, self.proposal = int(trials), step, proposal
        self.public = public

    def candidate(self, true: Update, model: nn.Module, batch_size: int,
                  rng: torch.Generator) -> Update:
        """One proposal, made orthogonal to ``true`` and rescaled, layer by layer."""
        if self.proposal == "normal":
            return true.map(lambda g: orthogonal_like(g, rng))
        x, y = self.public
        idx = torch.randperm(len(x), generator=rng)[:batch_size]
        device = next(model.parameters()).device
        with torch.enable_grad():
            proposal = Update.of(model, x[idx].to(device), y[idx].to(device))
        return Update({k: orthogonalise(proposal[k].detach(), g) for k, g in true.items()})

    def sample(self, trial: Update, ctx: DefenseContext) -> Update:
        """EOT's sample (CENSOR §V-D): one orthogonalised, rescaled proposal of ``trial``,
        without the loss-based choice among trials (not differentiable)."""
        return self.candidate(trial, ctx.model, len(ctx.x), ctx.rng)

    def __call__(self, ctx: DefenseContext) -> Update:
        true = ctx.true_gradient()
        params = {n: p.detach() for n, p in ctx.model.named_parameters()}
        best, best_loss = None, float("inf")
        with eval_mode(ctx.model), torch.no_grad():
            for _ in range(self.trials):
                candidate = self.candidate(true, ctx.model, len(ctx.x), ctx.rng)
                stepped = {k: params[k] - self.step * candidate[k] for k in params}
                loss = float(F.cross_entropy(functional_call(ctx.model, stepped, (ctx.x,)), ctx.y))
                if loss < best_loss:
                    best, best_loss = candidate, loss
        return best
