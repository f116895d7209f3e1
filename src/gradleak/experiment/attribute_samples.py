"""What RecUP-FL's attribute track (Cui et al., §5.4) draws and learns from, shared by its
phases (``train_zoo``, ``fit_adversaries``, ``attribute``): D_train, the public samples
the defender models and the adversaries learn from, their clean gradient features, and the
digest that ties fitted adversaries to the model they learnt under."""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from gradleak import data
from gradleak.adversaries.features import features_of, gradient_features
from gradleak.experiment import plan
from gradleak.experiment.job import Job
from gradleak.types import Update
from gradleak.utils.device import select
from gradleak.utils.seeding import child_seeds, seed_everything

ADVERSARIES_FORMAT = "gradleak.adversaries"


def clean_attribute_spec(spec: dict) -> dict:
    """``attribute.*`` less ``adaptive``: the model zoo and the paper's adversaries learn
    from clean gradients whatever it is (toggling it re-runs only the attribute jobs)."""
    return {k: v for k, v in spec.items() if k != "adaptive"}


def d_train(config: dict, data_dir) -> data.ImageData:
    """D_train: the first ``attribute.train_samples`` of the public split (seeded order)."""
    public = data.load_prepared(data_dir, "public")
    count = min(config["attribute"]["train_samples"], len(public))
    order = np.random.default_rng(config["attribute"]["seed"]).permutation(len(public))
    return public.subset(torch.from_numpy(np.sort(order[:count])))


def seeds(seed: int) -> dict[str, int]:
    """One seed per concern; ``public`` draws the defense's randomness on D_train's uploads
    (the adaptive adversary's training data), apart from the victims' ``defense``."""
    return child_seeds(seed, ["samples", "defense", "adversary", "public"])


def model_digest(model: torch.nn.Module) -> str:
    """sha256 of the model's weights and buffers (names, dtypes, shapes and values)."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def with_attributes(images: data.ImageData, names: list[str]) -> data.ImageData:
    return data.ImageData(images.x, images.y, images.num_classes,
                          {a: images.attributes[a] for a in names})


def started(config: dict, results, case: str, setting, seed: int):
    """An attribute-track job's start: its ``Job``, ``attribute`` section, attributes,
    seeds and device (torch seeded for its adversaries), and D_train with those attributes
    on that device."""
    job = Job(config, results, case, setting, seed)
    own, names = seeds(seed), plan.attributes(config, case)
    device = select(config["device"])
    seed_everything(own["adversary"], config["threads"])
    public = with_attributes(d_train(config, job.data_dir), names).to(device)
    return job, job.resolved["attribute"], names, own, device, public


def majority(values: torch.Tensor) -> int:
    """The most frequent value (the smallest on ties): one upload's attribute label."""
    return int(torch.bincount(values).argmax())


def train_features(model: torch.nn.Module, samples: data.ImageData, spec: dict
                   ) -> tuple[torch.Tensor, dict[str, np.ndarray]]:
    """Clean features of ``samples`` in uploads of ``attribute.batch_size`` samples, and
    each upload's attribute labels."""
    size = spec["batch_size"]
    if size == 1:
        return (features_of(model, samples.x, samples.y, spec["feature_size"]),
                {a: v.cpu().numpy() for a, v in samples.attributes.items()})
    features, labels = [], {a: [] for a in samples.attributes}
    for g in range(len(samples) // size):
        part = samples.subset(torch.arange(g * size, (g + 1) * size))
        features.append(gradient_features(Update.of(model, part.x, part.y).detached(),
                                          spec["feature_size"]))
        for a, values in part.attributes.items():
            labels[a].append(majority(values))
    return torch.stack(features), {a: np.array(v) for a, v in labels.items()}
