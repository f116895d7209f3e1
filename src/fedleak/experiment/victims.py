"""The victims of an attack job beyond the default random training images: the split and
images they are (``data.victims``: CENSOR's every 1,000th validation image, victims of
one class), checked against the prepared data before any job runs, and with
``attack.mixed`` the model of the attacked round after the victim's and another client's
rounds (``fl.mixed``, CENSOR Fig. 2)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedleak import data, metrics
from fedleak.data.victims import problem
from fedleak.experiment import paths, plan
from fedleak.experiment.artifacts import Job
from fedleak.fl.mixed import two_client_rounds
from fedleak.utils.seeding import derived_seed


def class_counts(results: Path, dataset: str) -> dict[str, list[int]] | None:
    """Split -> images per class of a prepared dataset (None: not prepared yet)."""
    if not paths.data_manifest(results, dataset).is_file():
        return None
    manifest = data.read_manifest(paths.data_dir(results, dataset))
    return {split: entry["class_counts"] for split, entry in manifest["splits"].items()}


def problems(config: dict, results: Path, dataset: str | None = None) -> list[str]:
    """Why planned attack jobs (of ``dataset``'s cases, or all) cannot draw their victims
    from the prepared data, one message per distinct reason (empty: all can, or no data is
    prepared yet)."""
    found: dict[str, str] = {}
    counts: dict[str, dict | None] = {}
    for case, setting in plan.attack_jobs(config):
        name = plan.find_case(config, case)["dataset"]
        if dataset not in (None, name):
            continue
        if name not in counts:
            counts[name] = class_counts(results, name)
        if counts[name] is None:
            continue
        why = problem(plan.resolve(config, setting)["attack"], counts[name], name)
        if why:
            found.setdefault(why, f"setting {setting.text!r} of case {case!r}: {why}")
    return list(found.values())


def split_data(job: Job, train: data.ImageData) -> data.ImageData:
    """The prepared split the job's victims are drawn from (``attack.split``)."""
    split = job.resolved["attack"]["split"]
    return train if split == "train" else data.load_prepared(job.data_dir, split)


def mixed_model(job: Job, model: nn.Module, train: data.ImageData, victim: tuple,
                taken: np.ndarray, defense, seeds: dict, v: int) -> nn.Module:
    """Victim ``v``'s model at ``attack.round`` with ``attack.mixed``: the round-0 model
    after that many rounds of the victim (its batch ``victim``) and another client whose
    batches of ``attack.mixed.batch_size`` are drawn afresh each round and local step
    (seeded by victim, round and step) from the train images outside ``taken`` (the
    victims' own, when they are training images)."""
    spec, fl = job.resolved["attack"], job.resolved["fl"]
    rounds = spec["round"]
    if not rounds:
        return model
    device = next(model.parameters()).device
    others = np.setdiff1d(np.arange(len(train)), taken)
    size = spec["mixed"]["batch_size"]

    def other(r: int, step: int) -> tuple:
        rng = np.random.default_rng(derived_seed(seeds["victims"], 2, v, r, step))
        idx = torch.from_numpy(np.sort(rng.choice(others, size, replace=False)))
        batch = (train.x[idx].to(device), train.y[idx].to(device))
        return (*batch, {a: values[idx] for a, values in train.attributes.items()}) \
            if train.attributes else batch

    noise = torch.Generator().manual_seed(derived_seed(seeds["defense"], v, 1))
    trained, _ = two_client_rounds(model, victim, other, rounds, fl["local_steps"],
                                   fl["local_lr"], fl["server_optimizer"], fl["server_lr"],
                                   defense, noise)
    return trained


def add_likeness(records: list[dict], matched: list[torch.Tensor], truths: list) -> None:
    """CENSOR Fig. 3 (victims of one class): GGL's reconstructions "are similar to each
    other, and notably distinct from the ground-truth image". Each victim's record gets
    ``pairwise_ssim``, the mean SSIM of its reconstruction to every other victim's, and
    ``truth_pairwise_ssim``, the same between the true images (how alike the inputs
    are); NaN with one victim."""

    def mean_to_others(images: list[torch.Tensor], v: int) -> float:
        values = [float(metrics.ssim(images[v], images[w]))
                  for w in range(len(images)) if w != v]
        return float(np.mean(values)) if values else float("nan")

    truth_images = [t[1] for t in truths]
    for v, record in enumerate(records):
        record["pairwise_ssim"] = mean_to_others(list(matched), v)
        record["truth_pairwise_ssim"] = mean_to_others(truth_images, v)
