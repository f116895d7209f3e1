"""Label inference from the last layer's gradient (iDLG, Zhao et al., 2020, §3.1).

For a single image and cross-entropy, dL/dW_i = (p_i - 1[i = c]) * r: only the
true class c has a negative factor, so its row of the last-layer weight gradient
has the smallest (negative) sum while the features r are non-negative (Sigmoid,
ReLU). The same rule is used by EPAFL (Alg. 1, line 2).

For a batch of B > 1 images with distinct labels (Yin et al., CVPR 2021, §3.2;
GGL's implementation) the B rows with the smallest sums are the labels present.
"""

from __future__ import annotations

import torch

from fedleak.types import Observation


def idlg_label(obs: Observation) -> torch.Tensor:
    """The iDLG label for a batch of one: argmin over classes of the row sums."""
    if obs.batch_size != 1:
        raise ValueError(f"iDLG label inference needs batch_size 1, got {obs.batch_size}")
    _, weight_grad = obs.classifier_gradient()
    return weight_grad.sum(dim=1).argmin().reshape(1)


def batch_labels(obs: Observation) -> torch.Tensor:
    """The ``batch_size`` classes with the smallest row sums, sorted (distinct labels)."""
    _, weight_grad = obs.classifier_gradient()
    if obs.batch_size > weight_grad.shape[0]:
        raise ValueError(f"batch label inference needs batch_size <= {weight_grad.shape[0]} "
                         f"classes, got {obs.batch_size}")
    if obs.batch_size == 1:
        return idlg_label(obs)
    return weight_grad.sum(dim=1).argsort()[:obs.batch_size].sort().values


def infer_labels(obs: Observation) -> torch.Tensor:
    """The observed labels when the attacker knows them, else :func:`batch_labels`."""
    return obs.labels.to(obs.device) if obs.labels is not None else batch_labels(obs)
