"""Refiner's evaluation network (Fan et al., §3.3 and App. D).

Three 3x3 convolutions with stride 2 and padding 1 (128, 256, 512 kernels),
ReLU after each, flattened into one Linear unit and a sigmoid: the predicted
proportion of uniform noise blended into the input (the privacy metric PM).
"""

from __future__ import annotations

import torch
from torch import nn


class EvaluationNetwork(nn.Module):
    def __init__(self, channels: int = 3, image_size: int = 32,
                 widths: tuple[int, int, int] = (128, 256, 512)) -> None:
        super().__init__()
        self.input_shape = (channels, image_size, image_size)
        layers, in_ch, side = [], channels, image_size
        for width in widths:
            layers += [nn.Conv2d(in_ch, width, 3, stride=2, padding=1), nn.ReLU()]
            in_ch, side = width, (side + 1) // 2
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(in_ch * side * side, 1)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).flatten(1)).squeeze(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.logits(x))


RATIOS = tuple(round(0.1 * i, 1) for i in range(11))


def blend(x: torch.Tensor, ratio: float | torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    """(1 - r) x + r v with v ~ U(0, 1) per pixel (Refiner §3.3), drawn by ``rng`` on
    ``x``'s device."""
    noise = torch.rand(x.shape, generator=rng, device=x.device)
    return (1 - ratio) * x + ratio * noise


def train_evaluation_network(images: torch.Tensor, *, epochs: int, batch_size: int, lr: float,
                             seed: int, widths: tuple[int, int, int], progress: bool = True
                             ) -> tuple[EvaluationNetwork, list[float]]:
    """Train as in Refiner App. D: each batch is blended with noise at the eleven ratios
    0, 0.1, ..., 1 (the ratio is the target), Adam; App. D's lr 1e-4, batch 128, 20 epochs
    and widths 128/256/512 are the schema's defaults (``evalnet:``).

    The loss is binary cross-entropy against the soft target, the likelihood form of
    Eq. 5 (the paper does not name its loss). ``seed`` sets the initial weights (the global
    RNG left untouched) and the shuffles and noise, drawn on ``images``' device, where it
    trains. Returns the network and the mean loss per epoch.
    """
    from tqdm import tqdm

    device = images.device
    rng = torch.Generator(device=device).manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = EvaluationNetwork(images.shape[1], images.shape[-1], tuple(widths)).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    ratios = torch.tensor(RATIOS, device=device)
    losses = []
    for _ in tqdm(range(epochs), desc="evalnet", disable=not progress, leave=False):
        order = torch.randperm(len(images), generator=rng, device=device)
        total, count = 0.0, 0
        for start in range(0, len(images), batch_size):
            batch = images[order[start:start + batch_size]]
            target = ratios.repeat_interleave(len(batch))
            mixed = blend(batch.repeat(len(ratios), 1, 1, 1), target.view(-1, 1, 1, 1), rng)
            loss = nn.functional.binary_cross_entropy_with_logits(net.logits(mixed), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, count = total + loss.item() * len(batch), count + len(batch)
        losses.append(total / count)
    return net.eval(), losses


def monotonicity(net: EvaluationNetwork, images: torch.Tensor, seed: int = 0,
                 ratios: tuple[float, ...] = RATIOS[1:-1]) -> list[dict]:
    """Mean prediction on ``images`` blended at each ratio (Refiner Fig. 4/5), on
    ``images``' device."""
    rng = torch.Generator(device=images.device).manual_seed(seed)
    rows = []
    with torch.no_grad():
        for ratio in ratios:
            prediction = float(net(blend(images, ratio, rng)).mean())
            rows.append({"ratio": ratio, "prediction": prediction})
    return rows


def load_evaluation_network(path) -> EvaluationNetwork:
    """The network saved by ``gradleak train-evalnet`` (weights, its ``.json`` sizes), eval mode."""
    from pathlib import Path

    from gradleak.utils.io import REMEDY, ArtifactError, load_state, load_torch, read_json

    meta_path = Path(path).with_suffix(".json")
    if not meta_path.is_file():
        raise FileNotFoundError(f"evaluation network sizes not found: {meta_path} (written "
                                f"beside {path} by gradleak train-evalnet)")
    meta = read_json(meta_path)
    try:
        channels, size, _ = meta["input_shape"]
        net = EvaluationNetwork(channels, size, tuple(meta["widths"]))
    except (KeyError, TypeError, ValueError) as err:
        raise ArtifactError(f"{meta_path} is not an evaluation network's description "
                            f"(bad or missing {err}); {REMEDY}") from None
    return load_state(net, load_torch(path), path, "the evaluation network").eval()
