"""Refiner (Fan et al.) Fig. 3, §3.3: why MSE is no privacy measure. An image shifted by a
pixel toward the top left and one with its intensities scaled look like the original to a
person yet are far from it in MSE (the paper: 0.025 and 0.106), while uniform noise hides
more at a small MSE (0.004). Rows: the MSE of each perturbation, mean over ``images`` test
images; arrays: the first image and its three perturbations."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gradleak import data
from gradleak.experiment import paths
from gradleak.experiment.studies.registry import StudyResult, register


def perturbations(x: torch.Tensor, shift: int, scale: float, noise: float,
                  generator: torch.Generator) -> dict[str, torch.Tensor]:
    """The three perturbations of images ``x`` (N, C, H, W) in [0, 1]. The shift moves the
    content up and left, repeating the last row and column into the space it leaves."""
    shifted = torch.cat([x[..., shift:, :], x[..., -1:, :].expand(
        *x.shape[:-2], shift, x.shape[-1])], dim=-2)
    shifted = torch.cat([shifted[..., shift:], shifted[..., -1:].expand(
        *x.shape[:-1], shift)], dim=-1)
    uniform = (torch.rand(x.shape, generator=generator) * 2 - 1) * noise
    return {"shift": shifted, "scale": (x * scale).clamp(0, 1),
            "noise": (x + uniform).clamp(0, 1)}


@register("perturbation")
def perturbation_mse(config: dict, results: Path, params: dict) -> StudyResult:
    images = data.load_prepared(paths.data_dir(results, params["dataset"]), "test").x
    if params["images"] > len(images):
        raise ValueError(f"perturbation study: 'images' {params['images']} is more than the "
                         f"{len(images)} test images of {params['dataset']!r}")
    x = images[:params["images"]]
    if params["shift"] >= min(x.shape[-2:]):
        raise ValueError(f"perturbation study: 'shift' {params['shift']} must be smaller than "
                         f"the images' {tuple(x.shape[-2:])} pixels")
    generator = torch.Generator().manual_seed(params["seed"])
    perturbed = perturbations(x, params["shift"], params["scale"], params["noise"], generator)
    rows = [{"perturbation": name, "mse": float(((p - x) ** 2).mean())}
            for name, p in perturbed.items()]
    shown = torch.stack([x[0], *(p[0] for p in perturbed.values())])
    titles = ["original", *(f"{r['perturbation']}: MSE {r['mse']:.3f}" for r in rows)]
    return StudyResult(rows, {"images": shown.numpy(), "images_titles": np.array(titles)})
