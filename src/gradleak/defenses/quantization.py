"""Gradient quantisation (GQ) with the QSGD low-precision quantiser
(Alistarh et al., NeurIPS 2017, §3.1; used by FedPAQ, the GQ baseline of Refiner §5.1).

Per tensor v with s = 2^bits - 1 levels: Q(v_i) = ||v||_2 * sign(v_i) * xi_i / s,
where xi_i = l + 1 with probability |v_i| s / ||v|| - l and l otherwise,
l = floor(|v_i| s / ||v||). Unbiased; fewer bits is a stronger defense (default 8).
``rounding: nearest`` rounds |v_i| s / ||v|| to the nearest level instead: deterministic and
biased (elements under half a level vanish), the other reading of Refiner's unnamed GQ
(docs/measurements.md m93); its adaptive attacker applies it to the trial, straight through.

The adaptive attacker (decisions 0072 and 0097) matches the upload's expectation over Q's draws,
which for an unbiased quantiser is the trial gradient itself (E[Q(v)] = v, QSGD Lemma
3.1): the plain attack, so knowing the defense never costs the attacker anything. The
earlier reading, a fresh straight-through draw of Q(trial) at every step (GGL, Li et al.
CVPR 2022 §3.3), compares two independent draws and was weaker than ignoring the defense
(docs/decisions/0097-qsgd-adaptive-expectation.md).
"""

from __future__ import annotations

import torch

from gradleak.defenses.base import Defense, DefenseContext, register
from gradleak.types import Update


def qsgd(v: torch.Tensor, bits: int, rng: torch.Generator) -> torch.Tensor:
    levels = 2**bits - 1
    norm = v.norm()
    if norm == 0:
        return v.clone()
    scaled = v.abs() / norm * levels
    lower = scaled.floor()
    up = torch.rand(v.shape, generator=rng).to(v.device) < (scaled - lower)
    return norm * v.sign() * (lower + up.to(v.dtype)) / levels


def nearest(v: torch.Tensor, bits: int) -> torch.Tensor:
    levels = 2**bits - 1
    norm = v.norm()
    if norm == 0:
        return v.clone()
    return norm * v.sign() * torch.round(v.abs() / norm * levels) / levels


@register("quantization")
class Quantization(Defense):
    deterministic = True  # the adaptive attacker's transformation draws nothing

    def __init__(self, *, bits: int, rounding: str) -> None:
        self.bits, self.rounding = int(bits), rounding

    def __call__(self, ctx: DefenseContext) -> Update:
        if self.rounding == "nearest":
            return ctx.true_gradient().map(lambda g: nearest(g, self.bits))
        return ctx.true_gradient().map(lambda g: qsgd(g, self.bits, ctx.rng))

    def adaptive(self, trial: Update, ctx: DefenseContext, received: Update) -> Update:
        """E[Q(trial)] = trial where QSGD is unbiased; the nearest level, with the identity's
        gradient (straight through), where it is not."""
        if self.rounding == "nearest":
            return trial.map(lambda g: g + (nearest(g.detach(), self.bits) - g.detach()))
        return trial
