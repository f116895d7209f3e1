"""CENSOR (Zhang et al., NDSS 2025, Alg. 1, Eq. 12, §V-E).

For each of T trials and every layer l: draw a proposal g_r, remove its component
along the true layer gradient g_l, g_o = g_r - (<g_r, g_l> / <g_l, g_l>) g_l
(Eq. 12), and rescale g_o to ||g_l|| (Alg. 1, NORMALIZE_GRAD). Each candidate is
scored by the client's batch loss after one step theta - eta * g~ (eval mode,
eta = 1e-4 as in the official code); the candidate with the lowest loss wins.

Three readings of Alg. 1 (``variant``), which disagree on what is uploaded:

- ``orthogonal`` (default; the paper's §IV argument that the upload reveals nothing
  of the private gradient): the best of the T trials is always uploaded, so every
  upload is orthogonal to the true gradient layer by layer.
- ``algorithm1`` (Alg. 1 as printed): the incumbent starts as the clean gradient G0
  with the loss at theta (lines 10-11) and a trial replaces it only if its loss is
  strictly lower (line 17); when none is, the clean gradient is uploaded.
- ``official`` (the official code): Eq. 12 divided by ||g|| instead of
  ||g||^2 (not orthogonal unless ||g|| = 1), and the same clean-gradient fallback.

Every upload records in ``Update.info["fallback"]`` whether it is the clean gradient. The
adaptive attacker (EOT over Eq. 12's draws) tells a fallback upload from a candidate by
softmax cross-entropy's signature, an output-layer bias gradient summing to zero
(sum_c (p_c - y_c) = 0 for every example), which an orthogonalised normal proposal lacks.
``scope: model`` orthogonalises the whole gradient as one vector instead of layer by layer
(Table VII's comparison).

Proposals (``proposal``): ``normal`` draws g_r ~ N(0, I) (Alg. 1 line 27, the
paper's default); ``public`` uses the gradient of a random batch of public
labelled images, the alternative of §V-E ("sampling from a public dataset other
than a normal distribution", Fig. 10); ``public_class`` keeps the public images of one
class only (Fig. 10: "random gradient vectors constructed from 'Black grouse' images",
which mislead GGL into inverting black grouse). An orthogonal upload has no first-order
effect on the client's loss: the projection also removes the part of a public
gradient that the private one shares, most of its descent (docs/censor.md has the
accuracies each variant gives).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from gradleak.defenses.base import Defense, DefenseContext, register
from gradleak.needs import Need
from gradleak.types import Update
from gradleak.utils.modes import eval_mode


def orthogonalise(proposal: torch.Tensor, g: torch.Tensor, official: bool = False
                  ) -> torch.Tensor:
    """``proposal`` minus its component along ``g`` (Eq. 12), rescaled to ``||g||``; with
    ``official``, the official code's division by ``||g||`` instead of ``||g||^2``."""
    denom = g.norm() if official else (g * g).sum()
    if denom == 0:
        return torch.zeros_like(g)
    o = proposal - (proposal * g).sum() / denom * g
    return o * (g.norm() / (o.norm() + 1e-12))


def is_clean_gradient(upload: Update, model: nn.Module, tolerance: float = 1e-4) -> bool:
    """Whether ``upload``'s output-layer bias gradient sums to zero, as a cross-entropy
    gradient's does, within ``tolerance`` of its L1 norm; false without such a bias."""
    weights = [n for n, p in model.named_parameters() if p.ndim == 2]
    bias = weights[-1].removesuffix("weight") + "bias" if weights else None
    if bias not in upload:
        return False
    g = upload[bias].detach()
    return float(g.sum().abs()) <= tolerance * float(g.abs().sum())


@register("censor")
class Censor(Defense):
    needs = {"public": Need("public_data", when={"proposal": ("public",)})}

    def __init__(self, *, trials: int, step: float, proposal: str, variant: str, scope: str,
                 public_class: int | None,
                 public: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        if proposal == "public" and (public is None or len(public[0]) == 0):
            raise ValueError("censor proposal 'public' needs public= labelled images (x, y), "
                             "got none")
        if public_class is not None:
            if proposal != "public":
                raise ValueError(f"censor public_class {public_class} chooses public images, "
                                 f"but proposal is {proposal!r}; expected proposal 'public'")
            keep = public[1] == public_class
            if not bool(keep.any()):
                present = sorted(set(public[1].tolist()))
                raise ValueError(f"censor public_class {public_class}: the public images have "
                                 f"no image of that class; expected one of their "
                                 f"{len(present)} classes {present[:10]}"
                                 f"{' ...' if len(present) > 10 else ''}")
            public = (public[0][keep], public[1][keep])
        self.trials, self.step, self.proposal = int(trials), step, proposal
        self.variant, self.scope, self.public = variant, scope, public

    def _proposal(self, true: Update, model: nn.Module, batch_size: int,
                  rng: torch.Generator) -> Update:
        """g_r: N(0, I) per layer, or the gradient of a random batch of public images."""
        if self.proposal == "normal":
            return true.map(lambda g: torch.randn(g.shape, generator=rng).to(g.device))
        x, y = self.public
        idx = torch.randperm(len(x), generator=rng)[:batch_size]
        device = next(model.parameters()).device
        with torch.enable_grad():
            return Update.of(model, x[idx].to(device), y[idx].to(device)).detached()

    def candidate(self, true: Update, model: nn.Module, batch_size: int,
                  rng: torch.Generator) -> Update:
        """One proposal made orthogonal to ``true`` and rescaled to its norm: layer by layer
        (Alg. 1), or over the whole gradient as one vector (``scope: model``, Table VII)."""
        official = self.variant == "official"
        proposal = self._proposal(true, model, batch_size, rng)
        if self.scope == "layer":
            return Update({k: orthogonalise(proposal[k], g, official) for k, g in true.items()})
        whole = orthogonalise(torch.cat([proposal[k].flatten() for k in true]),
                              torch.cat([g.flatten() for g in true.values()]), official)
        parts = whole.split([g.numel() for g in true.values()])
        return Update({k: part.view_as(g) for (k, g), part in zip(true.items(), parts)})

    def sample(self, trial: Update, ctx: DefenseContext) -> Update:
        """EOT's sample (CENSOR §V-D): one orthogonalised, rescaled proposal of ``trial``,
        without the loss-based choice among trials (not differentiable)."""
        return self.candidate(trial, ctx.model, len(ctx.x), ctx.rng)

    def adaptive(self, trial: Update, ctx: DefenseContext, received: Update) -> Update:
        """A draw of Eq. 12 (:meth:`sample`), or ``trial`` itself where ``received`` is the
        clean gradient (Alg. 1's fallback, told by :func:`is_clean_gradient`). Public
        proposals are gradients themselves and carry the same signature, so with them every
        upload is taken for a candidate."""
        if self.variant != "orthogonal" and self.proposal == "normal" and \
                is_clean_gradient(received, ctx.model):
            return trial
        return self.sample(trial, ctx)

    def __call__(self, ctx: DefenseContext) -> Update:
        true = ctx.true_gradient()
        params = {n: p.detach() for n, p in ctx.model.named_parameters()}

        def loss_after(step: Update) -> float:
            stepped = {k: params[k] - self.step * step[k] for k in params}
            return float(F.cross_entropy(functional_call(ctx.model, stepped, (ctx.x,)), ctx.y))

        with eval_mode(ctx.model), torch.no_grad():
            # Alg. 1 lines 10-11: the clean gradient and the loss at theta, unless orthogonal
            best, best_loss = ((None, float("inf")) if self.variant == "orthogonal" else
                               (true, float(F.cross_entropy(ctx.model(ctx.x), ctx.y))))
            for _ in range(self.trials):
                candidate = self.candidate(true, ctx.model, len(ctx.x), ctx.rng)
                loss = loss_after(candidate)
                if loss < best_loss:
                    best, best_loss = candidate, loss
        return Update(best, fallback=best is true)
