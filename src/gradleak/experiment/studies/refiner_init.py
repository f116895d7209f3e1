"""Refiner (Fan et al.) Fig. 6, §3.4: why Refiner starts x* from the noise-blended image.
Optimising Eq. 2 from x itself (Fig. 6(a) -> (b)) makes an adversarial example: x* hardly
moves from x, yet the evaluation network scores it noisy; from the blend (1 - alpha) x +
alpha v, alpha = 0.5 ((c) -> (d)) x* stays noise that carries no trace of x. Both runs are
the defense's own optimisation (``Refiner.refine``, 10 steps at lr 1 with the configured
label's parameters) on the first ``images`` test images under a freshly initialised model
(the attacked round 0). Rows: (init, iteration) -> the evaluation network's ``noise_ratio``
of x*, ``mse`` and ``ssim`` to x; arrays: the first image's x* at every iteration, one row
per init. Runs on the CPU (one small batch)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gradleak import data, defenses, metrics, models
from gradleak.config import registered_name
from gradleak.experiment import paths
from gradleak.experiment.studies.registry import StudyResult, register
from gradleak.models.evalnet import load_evaluation_network

INITS = {"x": "from x", "blend": "from the blend"}


@register("refiner_init", evalnets=lambda params: [params["dataset"]])
def refiner_init(config: dict, results: Path, params: dict) -> StudyResult:
    test = data.load_prepared(paths.data_dir(results, params["dataset"]), "test")
    if params["images"] > len(test.x):
        raise ValueError(f"refiner_init study: 'images' {params['images']} is more than the "
                         f"{len(test.x)} test images of {params['dataset']!r}")
    x, y = test.x[:params["images"]], test.y[:params["images"]]
    evalnet = load_evaluation_network(paths.evalnet_file(results, params["dataset"]))
    label = params["defense"]
    defense = defenses.build(registered_name(config, "defenses", label), evalnet=evalnet,
                             **config["defenses"][label]["params"])
    options = {"uniform_init": params["uniform_init"]} if params["model"] == "lenet" else {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(params["seed"])
        model = models.build(params["model"], x.shape[1], test.num_classes, x.shape[-1],
                             input_shape=tuple(x.shape[1:]), **options)
    ctx = defenses.DefenseContext(model, x, y, torch.Generator().manual_seed(params["seed"]))
    starts = {"x": x, "blend": defense.start(ctx)}
    rows, shown, titles = [], [], []
    for init, start in starts.items():
        path = [start, *defense.refine(ctx, start)] if defense.iterations else [start]
        for iteration, robust in enumerate(path):
            rows.append({"init": init, "iteration": iteration,
                         "noise_ratio": float(metrics.noise_ratio(robust, evalnet)),
                         "mse": float(((robust - x) ** 2).mean()),
                         "ssim": float(metrics.ssim(robust, x))})
        shown.append(torch.stack([robust[0] for robust in path]))
        titles.append([f"{INITS[init] if i == 0 else f'step {i}'}\nPM {row['noise_ratio']:.2f}"
                       for i, row in enumerate(rows[-len(path):])])
    return StudyResult(rows, {"images": torch.stack(shown).numpy(),
                              "images_titles": np.array(titles),
                              "images_rows": np.array([INITS[k] for k in starts])})
