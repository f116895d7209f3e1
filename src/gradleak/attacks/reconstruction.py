"""What an attack returns for one victim: its images and labels, how it got there (loss
trace, iterations, wall time, why it stopped, the restart kept) and, on request, the images
at chosen iterations."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Reconstruction:
    images: torch.Tensor  # (B, C, H, W) in [0, 1]
    labels: torch.Tensor  # (B,)
    loss_trace: list[float]
    iterations: int
    wall_time: float
    stop_reason: str
    restart: int = 0
    extra: dict = field(default_factory=dict)
    snapshots: dict[int, torch.Tensor] = field(default_factory=dict)  # iteration -> images
