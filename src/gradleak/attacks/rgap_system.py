"""R-GAP's linear system of one convolution (Zhu and Blaschko, ICLR 2021, Eqs. 9-10, as
GIAS App. C writes it) and its cost for the latent search (GIAS Eq. 11): the rows, the
numerical rank (§4's rank analysis), the solution, and the last systems solved, which R-GAP
with and without a prior share. The recursion that chains them is :mod:`.rgap`."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def layer_system(conv: nn.Conv2d, weight, grad, bias, k, z, in_shape):
    """A_r (sparse) and b_r of Eq. 9 for the input x_r of convolution ``conv``: the gradient
    rows dW_r = k_r U(x_r)^T over |k_r|, the forward rows W_r U(x_r) = z_r - bias over |W_r|;
    the unknowns are x_r without its zero padding."""
    n, (out, fan) = int(np.prod(in_shape)), weight.flatten(1).shape
    index = torch.arange(1, n + 1, dtype=torch.float64).reshape(1, *in_shape)
    index = F.unfold(index, conv.kernel_size, padding=conv.padding, stride=conv.stride)[0]
    q, p = (index > 0).nonzero(as_tuple=True)
    columns, positions = (index[q, p].round().long() - 1).repeat(out), index.shape[1]
    k, w = k.reshape(out, positions), weight.reshape(out, fan)
    scale_k, scale_w = float(k.norm()), float(w.norm())
    f = torch.arange(out)[:, None]
    rows = torch.cat([(f * fan + q).flatten(), (out * fan + f * positions + p).flatten()])
    values = torch.cat([(k[:, p] / scale_k).flatten(), (w[:, q] / scale_w).flatten()])
    from scipy import sparse  # imported on use

    a = sparse.csr_matrix((values.numpy(), (rows.numpy(), torch.cat([columns, columns]).numpy())),
                          shape=(out * fan + out * positions, n))
    target = z - (0 if bias is None else bias[:, None, None])
    b = np.concatenate([(grad.flatten() / scale_k).numpy(), (target.flatten() / scale_w).numpy()])
    return a, b, {"unknowns": n, "gradient_constraints": out * fan,
                  "forward_constraints": out * positions}


def numerical_rank(gram: torch.Tensor, factor: torch.Tensor | None, rcond: float) -> int:
    """The numerical rank of A from its Gram matrix: its singular values above ``rcond`` x
    the largest. With a Cholesky factor, LAPACK's estimate of 1/kappa_1(A^T A) (``dpocon``,
    O(n^2)) comes first: kappa_2 <= kappa_1 for a symmetric matrix, and the 1,000x margin
    over the cutoff rcond^2 covers the estimate's error (it bounds |(A^T A)^-1|_1 from
    below, in practice within 3x), so a clear estimate gives full rank without the O(n^3)
    eigendecomposition (the same counts, docs/measurements.md m58); otherwise every
    eigenvalue."""
    n = gram.shape[0]
    if factor is not None:
        from scipy.linalg.lapack import dpocon

        estimate, info = dpocon(factor.numpy(), float(gram.abs().sum(0).max()), uplo="L")
        if info == 0 and estimate > 1000 * rcond**2:
            return n
    singular = torch.linalg.eigvalsh(gram).clamp(min=0).sqrt()  # of A, ascending
    return int((singular > rcond * singular[-1]).sum())


def normal_equations(conv: nn.Conv2d, weight, grad, bias, k, z, in_shape):
    """A_r^T A_r, A_r^T b_r, A_r's report (:func:`layer_system`) and the Gram matrix's Cholesky
    factor (None: not positive definite)."""
    a, b, report = layer_system(conv, weight, grad, bias, k, z, in_shape)
    gram = torch.from_numpy((a.T @ a).toarray())
    factor, failed = torch.linalg.cholesky_ex(gram)
    return gram, torch.from_numpy(a.T @ b), (a, b, report), None if failed else factor


def system_digest(conv: nn.Conv2d, weight, grad, bias, k, z, in_shape, rcond) -> str:
    """A layer system's identity: its convolution, tensors, input shape and cutoff."""
    h = hashlib.sha256(repr((conv.kernel_size, conv.stride, conv.padding, tuple(in_shape),
                             rcond)).encode())
    for t in (weight, grad, bias, k, z):
        h.update(b"none" if t is None else repr(tuple(t.shape)).encode()
                 + t.contiguous().numpy().tobytes())
    return h.hexdigest()


# The last systems solved, by digest: R-GAP's rows with and without a prior share them.
SOLVED: OrderedDict[str, tuple[torch.Tensor, dict]] = OrderedDict()
SOLVED_KEPT = 64


def solve(conv: nn.Conv2d, weight, grad, bias, k, z, in_shape, rcond):
    """x_r from A_r x_r = b_r (Eqs. 9-10) and its rank analysis (a system solved before:
    its solution again, from ``SOLVED``)."""
    key = system_digest(conv, weight, grad, bias, k, z, in_shape, rcond)
    if key in SOLVED:
        SOLVED.move_to_end(key)
        return SOLVED[key][0].clone(), dict(SOLVED[key][1])
    gram, rhs, (a, b, report), factor = normal_equations(conv, weight, grad, bias, k, z,
                                                         in_shape)
    n, rank = report["unknowns"], numerical_rank(gram, factor, rcond)
    if rank == n and factor is not None:  # Cholesky: 7x faster than the eigenvectors
        x = torch.cholesky_solve(rhs[:, None], factor)[:, 0]
    else:  # the pseudo-inverse: minimum-norm least squares on the kept singular values
        eigenvalues, vectors = torch.linalg.eigh(gram)
        kept = vectors[:, n - rank:]
        x = kept @ ((kept.T @ rhs) / eigenvalues[n - rank:])
    residual = float(np.linalg.norm(a @ x.numpy() - b) / max(np.linalg.norm(b), 1e-300))
    report = {**report, "rank": rank, "residual": residual, "solved": "pseudo-inverse"}
    SOLVED[key] = (x.reshape(in_shape).clone(), dict(report))
    if len(SOLVED) > SOLVED_KEPT:
        SOLVED.popitem(last=False)
    return x.reshape(in_shape), report


def analysed(conv: nn.Conv2d, weight, grad, bias, k, z, in_shape, rcond) -> dict:
    """The rank analysis of A_r without solving (a layer that the prior solves); a system
    solved before: its analysis, from ``SOLVED``."""
    key = system_digest(conv, weight, grad, bias, k, z, in_shape, rcond)
    if key in SOLVED:
        return {n: v for n, v in SOLVED[key][1].items() if n not in ("residual", "solved")}
    gram, _, (_, _, report), factor = normal_equations(conv, weight, grad, bias, k, z,
                                                       in_shape)
    return {**report, "rank": numerical_rank(gram, factor, rcond)}


def system_cost(conv: nn.Conv2d, weight, grad, bias, k, z, *, device, dtype=torch.float32
                ) -> Callable[[torch.Tensor], torch.Tensor]:
    """|A_r x - b_r|^2 / |b_r|^2 of the row-scaled system of :func:`layer_system` for a batch of
    inputs x (R, C, H, W) of convolution ``conv`` -> (R,), differentiable (Eq. 11's cost):
    the gradient rows through the patches U(x), the forward rows through the convolution
    (its zero padding is the padding the unknowns leave out)."""
    out = weight.shape[0]
    w = weight.to(device, dtype)
    kk = k.reshape(out, -1).to(device, dtype)
    scale_k, scale_w = float(kk.norm()), float(w.norm())
    g = grad.reshape(out, -1).to(device, dtype) / scale_k
    target = (z - (0 if bias is None else bias[:, None, None])).to(device, dtype) / scale_w
    norm = float(g.square().sum() + target.square().sum())

    def cost(x: torch.Tensor) -> torch.Tensor:
        patches = F.unfold(x, conv.kernel_size, padding=conv.padding, stride=conv.stride)
        dw = torch.einsum("op,rfp->rof", kk, patches) / scale_k
        forward = F.conv2d(x, w, stride=conv.stride, padding=conv.padding) / scale_w
        return ((dw - g).square().sum((1, 2))
                + (forward - target).square().flatten(1).sum(1)) / norm

    return cost
