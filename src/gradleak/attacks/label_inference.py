"""Label inference from the last layer's gradient (iDLG, Zhao et al., 2020, §3.1).

For a single image and cross-entropy, dL/dW_i = (p_i - 1[i = c]) * r: only the
true class c has a negative factor, so its row of the last-layer weight gradient
has the smallest (negative) sum while the features r are non-negative (Sigmoid,
ReLU). The same rule is used by EPAFL (Alg. 1, line 2).

For a batch of B > 1 images with distinct labels (Yin et al., CVPR 2021, §3.2;
GGL's implementation) the B rows with the smallest sums are the labels present.

A batch of more images than classes repeats labels; then each class's count is estimated
(Dimitrov et al., "Data Leakage in Federated Averaging", TMLR 2022, §4.3, after Geng et
al.'s zero-shot count): with mean cross-entropy the row sum of the last-layer weight
gradient is s_c = (1/B) sum_i (p_ic - 1[y_i = c]) O_i, O_i the sum of image i's features.
With p_ic and O_i replaced by their means over random images through the attacked model,
n_c = B (p_c - s_c / O), rounded to integers that sum to B (largest remainders). A FedAvg
upload U of K local steps sums K such gradients, each at the client's weights of that step,
estimated as Dimitrov et al. do by interpolating along the upload, theta_k = theta_0 -
(k / K) eta U: then n_c = B (sum_k O_k p_kc - s_c) / sum_k O_k.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gradleak.attacks.bn_statistics import preserved_buffers
from gradleak.types import Observation

COUNT_SAMPLES = 256  # random images whose mean softmax and feature sum stand in for the batch's


def idlg_label(obs: Observation) -> torch.Tensor:
    """The iDLG label for a batch of one: argmin over classes of the row sums."""
    if obs.batch_size != 1:
        raise ValueError(f"iDLG label inference needs batch_size 1, got {obs.batch_size}")
    _, weight_grad = obs.classifier_gradient()
    return weight_grad.sum(dim=1).argmin().reshape(1)


def batch_labels(obs: Observation) -> torch.Tensor:
    """The ``batch_size`` classes with the smallest row sums, sorted (distinct labels); for a
    batch of more images than classes, :func:`counted_labels`."""
    _, weight_grad = obs.classifier_gradient()
    if obs.batch_size > weight_grad.shape[0]:
        return counted_labels(obs)
    if obs.batch_size == 1:
        return idlg_label(obs)
    return weight_grad.sum(dim=1).argsort()[:obs.batch_size].sort().values


def counted_labels(obs: Observation, seed: int = 0) -> torch.Tensor:
    """The batch's labels, sorted, from each class's estimated count (module docstring)."""
    name, weight_grad = obs.classifier_gradient()
    layer = obs.model.get_submodule(name.rpartition(".")[0])
    features: list[torch.Tensor] = []
    hook = layer.register_forward_hook(lambda _m, inputs, _out: features.append(inputs[0]))
    generator = torch.Generator().manual_seed(seed)
    dummy = torch.rand((COUNT_SAMPLES, *obs.input_shape), generator=generator).to(obs.device)
    weights = dict(obs.model.named_parameters())
    weighted, totals = 0.0, 0.0  # sum_k O_k p_k and sum_k O_k over the client's steps
    try:
        with torch.no_grad(), preserved_buffers(obs.model):
            for k in range(obs.local_steps):
                step = {n: w - k / obs.local_steps * (obs.local_lr or 0.0) * obs.gradient[n]
                        for n, w in weights.items()}
                logits = torch.func.functional_call(obs.model, step, (dummy,))
                total = features.pop().flatten(1).sum(1).mean().double()
                weighted = weighted + total * F.softmax(logits, dim=-1).mean(0).double()
                totals = totals + total
    finally:
        hook.remove()
    rows = weight_grad.detach().double().sum(1)
    estimate = (obs.batch_size * (weighted - rows) / totals).clamp(min=0).cpu()
    counts = estimate.floor().long()
    short = obs.batch_size - int(counts.sum())
    if short > 0:  # the largest remainders get one more
        counts[(estimate - counts).argsort(descending=True)[:short]] += 1
    while short < 0:  # rounding gave too many: the largest counts give one back
        counts[counts.argmax()] -= 1
        short += 1
    return torch.repeat_interleave(torch.arange(len(counts)), counts).to(obs.device)


def infer_labels(obs: Observation) -> torch.Tensor:
    """The observed labels when the attacker knows them, else :func:`batch_labels`."""
    return obs.labels.to(obs.device) if obs.labels is not None else batch_labels(obs)
