"""Phase ``train_evalnet``: Refiner's evaluation network (§3.3, App. D) for the images of
one dataset, trained on ``evalnet.dataset``'s public photos. Declares the ``evalnet``
artifact, which Refiner's defense and the noise-ratio metric load."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

from gradleak import data, models
from gradleak.data.image_data import resized
from gradleak.experiment import cost, paths
from gradleak.experiment.phase import Kind, Output, Phase, always
from gradleak.utils.device import select
from gradleak.utils.io import save_torch, write_json
from gradleak.utils.seeding import seed_everything


def train_evalnet(config: dict, results: Path, dataset: str) -> None:
    """Refiner's evaluation network for the images of ``dataset``, trained on public photos."""
    spec = config["evalnet"]
    device = select(config["device"])
    seed_everything(spec["seed"], config["threads"])
    target = data.load_prepared(paths.data_dir(results, dataset), "test").to(device)
    public = data.load_prepared(paths.data_dir(results, spec["dataset"]), "train").to(device)
    images = resized(data.datasets.to_channels(public.x, target.x.shape[1]), target.x.shape[-2:])
    net, losses = models.evalnet.train_evaluation_network(
        images, epochs=spec["epochs"], batch_size=spec["batch_size"], lr=spec["lr"],
        seed=spec["seed"], widths=spec["widths"])
    rows = models.evalnet.monotonicity(net, target.x, seed=spec["seed"])
    predictions = [r["prediction"] for r in rows]
    error = max(abs(r["prediction"] - r["ratio"]) for r in rows)
    if error > spec["max_error"]:
        print(f"warning: the evaluation network for {dataset} predicts a noise ratio up to "
              f"{error:.3f} from the truth (evalnet.max_error {spec['max_error']}); expected "
              f"more training: raise evalnet.epochs", file=sys.stderr)
    out = paths.evalnet_file(results, dataset)
    save_torch(out, net.state_dict())
    write_json(out.with_suffix(".json"), {
        "dataset": dataset, "trained_on": spec["dataset"], "widths": spec["widths"],
        "input_shape": list(target.x.shape[1:]), "epoch_losses": losses, "monotonicity": rows,
        "monotonic": bool(np.all(np.diff(predictions) > 0)),
        "ratio_error": error, "max_error": spec["max_error"],
    })


def _work(config: dict, results: Path, job: dict) -> dict[str, int]:
    """Epochs x batches of the public split, each one step of the network at its batch."""
    spec = config["evalnet"]
    size = cost.split_size(config, results, spec["dataset"], "train")
    (c, h, w), _ = cost.shape(config, results, job["dataset"])
    return {f"evalnet_step:{c}x{h}x{w}:{spec['widths']}:b{spec['batch_size']}":
            spec["epochs"] * math.ceil(size / spec["batch_size"])}


def _time_step(parts: list[str], batch: int, device, gen):
    """One epoch of the network on one batch of random images (``evalnet_step:<CxHxW>:
    <widths>``)."""
    import torch

    c, h, w = (int(v) for v in parts[0].split("x"))
    widths = tuple(int(v) for v in parts[1].strip("[]").split(","))
    images = torch.rand((batch, c, h, w), generator=gen).to(device)
    return lambda: models.evalnet.train_evaluation_network(
        images, epochs=1, batch_size=batch, lr=1e-4, seed=0, widths=widths, progress=False)


def _file(job) -> Path:
    return paths.evalnet_file(job.results, job.dataset)


KINDS = {"evalnet": Kind(
    lambda job, _of: [_file(job)],
    lambda job, _model, _of: models.evalnet.load_evaluation_network(_file(job)))}

PHASE = Phase(
    name="train_evalnet",
    summary="train Refiner's evaluation network for a dataset",
    wildcards=("dataset",),
    folders=("evalnet",),
    reads=("prepare_data",),
    outputs=lambda config, results, jobs=None: {
        "model": Output(paths.evalnet_file(results, "{dataset}")),
        "meta": Output(paths.evalnet_file(results, "{dataset}").with_suffix(".json"))},
    run=train_evalnet,
    inputs=lambda config, results, job: [
        paths.data_manifest(results, config["evalnet"]["dataset"]),
        paths.data_manifest(results, job["dataset"])],
    params=lambda config, results, job: config["evalnet"],
    gpu=always,
    work=_work,
    units={"evalnet_step": _time_step},
    kinds=KINDS,
)
