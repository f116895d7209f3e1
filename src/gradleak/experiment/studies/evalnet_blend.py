"""Refiner (Fan et al.) Figs. 4 and 5, §3.3: the evaluation network predicts the share of
uniform noise blended into an image, (1 - r) x + r v with v ~ U(0, 1), on datasets it never
saw. Fig. 4: the mean prediction over 1,000 samples each of SVHN, CIFAR-10 and CIFAR-100 at
r = 0.1 ... 0.9 (the network trained on TinyImageNet, App. D); Fig. 5: one image of each
blended at every ratio with its own prediction (the paper prints those, 0.079 ... 0.920 for
its SVHN image). Rows: (dataset, ratio) -> ``noise_ratio``, the mean prediction; arrays:
``images`` (datasets, ratios, C, H, W), the first drawn image of each dataset at every
ratio, ``images_titles`` its predictions and ``images_rows`` the datasets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from gradleak import data
from gradleak.experiment import paths
from gradleak.experiment.studies.registry import StudyResult, register
from gradleak.models.evalnet import EvaluationNetwork, blend, load_evaluation_network
from gradleak.utils.device import select
from gradleak.utils.seeding import derived_seed

CHUNK = 500  # images per forward pass of the evaluation network


def blend_predictions(net: EvaluationNetwork, images: torch.Tensor, ratios: list[float],
                      generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``images`` (N, C, H, W) blended at each ratio with noise drawn by ``generator`` (on
    ``images``' device), run through ``net`` (on its device): the first image's blends
    (R, C, H, W) and every prediction (R, N)."""
    device = next(net.parameters()).device
    first, predictions = [], []
    with torch.no_grad():
        for ratio in ratios:
            mixed = blend(images, ratio, generator)
            first.append(mixed[0])
            predictions.append(torch.cat([net(chunk.to(device)).cpu()
                                          for chunk in mixed.split(CHUNK)]))
    return torch.stack(first), torch.stack(predictions)


def _drawn(results: Path, params: dict) -> dict[str, torch.Tensor]:
    """``images`` test images of each dataset, drawn by ``seed`` (a permutation's head, so
    the first is the same image whatever ``images`` is); every dataset checked first."""
    drawn = {}
    for name in params["datasets"]:
        images = data.load_prepared(paths.data_dir(results, name), "test").x
        if params["images"] > len(images):
            raise ValueError(f"evalnet_blend study: 'images' {params['images']} is more than "
                             f"the {len(images)} test images of {name!r}")
        order = np.random.default_rng(params["seed"]).permutation(len(images))
        drawn[name] = images[torch.from_numpy(order[:params["images"]])]
    return drawn


def _shown(strip: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A strip in the first dataset's image ``shape``, to stack the datasets' strips."""
    if tuple(strip.shape[1:]) == tuple(shape):
        return strip
    strip = data.datasets.to_channels(strip, shape[0])
    return F.interpolate(strip, size=tuple(shape[1:]), mode="bilinear", align_corners=False)


@register("evalnet_blend", evalnets=lambda params: list(params["datasets"]),
          device="runs")
def evalnet_blend(config: dict, results: Path, params: dict) -> StudyResult:
    drawn = _drawn(results, params)
    device = select(config["device"])
    rows, strips, titles = [], [], []
    for index, (name, images) in enumerate(drawn.items()):
        net = load_evaluation_network(paths.evalnet_file(results, name)).to(device)
        generator = torch.Generator().manual_seed(derived_seed(params["seed"], index))
        strip, predictions = blend_predictions(net, images, params["ratios"], generator)
        rows += [{"dataset": name, "ratio": ratio, "noise_ratio": float(p.mean())}
                 for ratio, p in zip(params["ratios"], predictions, strict=True)]
        strips.append(_shown(strip, tuple(next(iter(drawn.values())).shape[1:])))
        titles.append([f"{ratio:g}: {float(p[0]):.3f}"
                       for ratio, p in zip(params["ratios"], predictions, strict=True)])
    return StudyResult(rows, {"images": torch.stack(strips).numpy(),
                              "images_titles": np.array(titles),
                              "images_rows": np.array(list(drawn))})
