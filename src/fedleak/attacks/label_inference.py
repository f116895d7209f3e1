"""Label inference from the last layer's gradient (iDLG, Zhao et al., 2020, §3.1).

For a single image and cross-entropy, dL/dW_i = (p_i - 1[i = c]) * r: only the
true class c has a negative factor, so its row of the last-layer weight gradient
has the smallest (negative) sum while the features r are non-negative (Sigmoid,
ReLU). The same rule is used by EPAFL (Alg. 1, line 2).
"""

from __future__ import annotations

import torch

from fedleak.attacks.base import Observation, last_linear_weight


def idlg_label(obs: Observation) -> torch.Tensor:
    """The iDLG label for a batch of one: argmin over classes of the row sums."""
    if obs.batch_size != 1:
        raise ValueError(f"iDLG label inference needs batch_size 1, got {obs.batch_size}")
    _, weight_grad = last_linear_weight(obs)
    return weight_grad.sum(dim=1).argmin().reshape(1)
