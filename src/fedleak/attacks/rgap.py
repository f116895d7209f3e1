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
``extra["layers"]`` holds, input layer first, each layer's rank analysis (unknowns,
gradient and forward constraints, numerical rank) and relative residual; the recovered
input of every layer is in ``extra["inputs"]`` for :func:`layer_errors`.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F
from scipy import optimize, sparse
from torch import nn

from fedleak.attacks.base import Reconstruction, register
from fedleak.attacks.engine import Attack, Victims
from fedleak.types import Observation

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
    found = optimize.minimize_scalar(misfit, bounds=bounds, method="bounded",
                                     options={"xatol": 1e-12})
    a = float(np.exp(found.x))
    return a * d, torch.from_numpy(h) / a, label


def _solve(conv: nn.Conv2d, weight, grad, bias, k, z, in_shape, rcond):
    """x_r from A_r x_r = b_r (Eqs. 9-10) and its rank analysis."""
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
    a = sparse.csr_matrix((values.numpy(), (rows.numpy(), torch.cat([columns, columns]).numpy())),
                          shape=(out * fan + out * positions, n))
    target = z - (0 if bias is None else bias[:, None, None])
    b = np.concatenate([(grad.flatten() / scale_k).numpy(), (target.flatten() / scale_w).numpy()])
    gram, rhs = torch.from_numpy((a.T @ a).toarray()), torch.from_numpy(a.T @ b)
    singular = torch.linalg.eigvalsh(gram).clamp(min=0).sqrt()  # of A, ascending
    rank = int((singular > rcond * singular[-1]).sum())
    factor, failed = torch.linalg.cholesky_ex(gram)
    if rank == n and not failed:  # Cholesky: 7x faster than the eigenvectors at n = 3468
        x = torch.cholesky_solve(rhs[:, None], factor)[:, 0]
    else:  # the pseudo-inverse: minimum-norm least squares on the kept singular values
        eigenvalues, vectors = torch.linalg.eigh(gram)
        kept = vectors[:, n - rank:]
        x = kept @ ((kept.T @ rhs) / eigenvalues[n - rank:])
    residual = float(np.linalg.norm(a @ x.numpy() - b) / max(np.linalg.norm(b), 1e-300))
    return x.reshape(in_shape), {"unknowns": n, "gradient_constraints": out * fan,
                                 "forward_constraints": out * positions,
                                 "rank": rank, "residual": residual}


def recover(model: nn.Module, gradient, input_shape, label: int | None, rcond: float):
    """(recovered inputs of every layer, input first; their layer reports; the label)."""
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
                             "residual": float((grad - torch.outer(k, x)).norm() / grad.norm())}]
    for (name, conv, act), (shape, out_shape) in zip(reversed(chain[:-1]), reversed(shapes)):
        z, slope = _invert(act, inputs[0].reshape(out_shape))
        w_up = upper.weight.detach().cpu().double()
        if isinstance(upper, nn.Linear):
            d_out = (w_up.T @ k).reshape(out_shape)
        else:
            d_out = torch.nn.grad.conv2d_input((1, *out_shape), w_up, k.unsqueeze(0),
                                               stride=upper.stride, padding=upper.padding)[0]
        k = d_out * slope
        x, report = _solve(conv, conv.weight.detach().cpu().double(), observed(conv.weight),
                           None if conv.bias is None else conv.bias.detach().cpu().double(),
                           k, z, shape, rcond)
        inputs.insert(0, x)
        reports.insert(0, {"name": name, **report})
        upper = conv
    return inputs, reports, label


def layer_errors(model: nn.Module, x_true: torch.Tensor, inputs: list[torch.Tensor]
                 ) -> list[float]:
    """|x_r - x_r*| / |x_r*| of every layer's recovered input against the true one (one
    image ``x_true`` (1, C, H, W)), input layer first (GIAS Fig. A2)."""
    chain, true, x = standard_form(model), [], x_true.detach().cpu().double()
    with torch.no_grad():
        for _, layer, act in chain:
            weight = layer.weight.detach().cpu().double()
            bias = None if layer.bias is None else layer.bias.detach().cpu().double()
            if isinstance(layer, nn.Linear):
                x = x.flatten(1)
                true.append(x[0])
                break
            true.append(x[0])
            x = F.conv2d(x, weight, bias, stride=layer.stride, padding=layer.padding)
            x = x if act is None else act(x)
    return [float((r.reshape(t.shape) - t).norm() / t.norm()) for r, t in zip(inputs, true)]


@register("rgap")
class RGAP(Attack):
    """R-GAP (module docstring); closed form, one victim at a time, no restarts."""

    vectorisable = False
    records_snapshots = False

    def __init__(self, *, rcond: float, seed: int = 0) -> None:
        self.rcond, self.seed = rcond, seed  # seed: unused (deterministic), kept for the API

    def check(self, obs: Observation) -> None:
        standard_form(obs.model)
        if obs.batch_size != 1:
            raise ValueError(f"R-GAP recovers one image from its gradient; got batch_size "
                             f"{obs.batch_size} for {type(obs.model).__name__}")

    def reconstruct(self, victims: Victims) -> list[Reconstruction]:
        for obs in victims.observations:
            self.check(obs)
        out = []
        for obs in victims.observations:
            start, param = time.perf_counter(), next(obs.model.parameters())
            known = None if obs.labels is None else int(obs.labels[0])
            inputs, reports, label = recover(obs.model, obs.gradient, obs.input_shape, known,
                                             self.rcond)
            image = inputs[0].reshape(1, *obs.input_shape).to(param)
            trace = [r["residual"] for r in reversed(reports)]
            out.append(Reconstruction(
                image.clamp(0, 1), torch.tensor([label], device=param.device), trace,
                len(trace), time.perf_counter() - start, "closed_form",
                extra={"layers": reports, "inputs": [x.float() for x in inputs]}))
        return out
