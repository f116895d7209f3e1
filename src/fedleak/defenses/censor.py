"""CENSOR (Zhang et al., NDSS 2025, Alg. 1, Eq. 12).

For each of T trials and every layer l: draw g_r ~ N(0, I), remove its component
along the true layer gradient g_l, g_o = g_r - (<g_r, g_l> / <g_l, g_l>) g_l
(Eq. 12), and rescale g_o to ||g_l||. Each candidate is scored by the client's
batch loss after one step theta - eta * g~ (eval mode, eta = 1e-4 as in the
official code); the candidate with the lowest loss is uploaded. Every upload is
orthogonal to the true gradient layer by layer. Alg. 1 initialises the best with
the clean gradient (line 11) and the official code sends it when no trial beats
the original loss; here the best trial is always sent, as the paper's
orthogonality argument (§IV) requires. The official code also divides by ||g||
instead of ||g||^2 in Eq. 12 (not orthogonal unless ||g|| = 1): we follow the paper.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedleak.defenses.base import Defense, DefenseContext, register
from fedleak.fl.client import Update


def orthogonal_like(g: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A random direction orthogonal to ``g`` with the norm of ``g`` (Eq. 12)."""
    r = torch.randn(g.shape, generator=generator).to(g.device)
    denom = (g * g).sum()
    if denom == 0:
        return torch.zeros_like(g)
    o = r - (r * g).sum() / denom * g
    return o * (g.norm() / (o.norm() + 1e-12))


@register("censor")
class Censor(Defense):
    knob = "trials"
    stronger_when = "lower"  # fewer trials: a less utility-optimised orthogonal upload

    def __init__(self, trials: int = 20, step: float = 1e-4) -> None:
        if int(trials) != trials or trials < 1:
            raise ValueError(f"censor trials must be an integer >= 1, got {trials}")
        if step <= 0:
            raise ValueError(f"censor step must be > 0, got {step}")
        self.trials, self.step = int(trials), step

    def __call__(self, ctx: DefenseContext) -> Update:
        true = ctx.true_gradient()
        params = {n: p.detach() for n, p in ctx.model.named_parameters()}
        was_training = ctx.model.training
        ctx.model.eval()
        best, best_loss = None, float("inf")
        with torch.no_grad():
            for _ in range(self.trials):
                candidate = {k: orthogonal_like(g, ctx.generator) for k, g in true.items()}
                stepped = {k: params[k] - self.step * candidate[k] for k in params}
                loss = float(F.cross_entropy(functional_call(ctx.model, stepped, (ctx.x,)), ctx.y))
                if loss < best_loss:
                    best, best_loss = candidate, loss
        ctx.model.train(was_training)
        return best
