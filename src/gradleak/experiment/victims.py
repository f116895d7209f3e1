"""The victims of an attack job: which images they are (disjoint random batches, B
different labels each with ``attack.victims.distinct_labels``, CENSOR's every 1,000th validation
image or victims of one class as ``data.victims`` draws them) and what the attacker
observes of each, their uploads made as FL clients make theirs (``fl.client_update``:
local steps, then the defense). With ``attack.protocol.mixed`` a victim's model is the attacked
round's after the victim's and another client's rounds (``fl.mixed``, CENSOR Fig. 2); with
``attack.protocol.sequence`` a victim is seen through several uploads (GIAS App. D)."""

from __future__ import annotations

import copy
from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from gradleak import data, defenses
from gradleak.attacks.bn_statistics import batch_statistics
from gradleak.attacks.epoch_copies import EpochCopies
from gradleak.attacks.gradient_sequence import ObservedSequence
from gradleak.data import victims as victim_images
from gradleak.experiment.job import Job, build_model
from gradleak.fl import batch_schedule, client_update, local_update, rows_of
from gradleak.fl.mixed import two_client_rounds
from gradleak.types import Observation
from gradleak.utils.seeding import derived_seed


def victim_batches(labels: np.ndarray, spec: dict, rng: np.random.Generator
                    ) -> list[np.ndarray]:
    """``attack.victims.count`` disjoint batches of ``attack.protocol.batch_size`` indices
    of the victims' split (``attack.victims.split``), sorted; with ``distinct_labels`` each
    batch's labels differ (drawn without replacement per class, the classes of a batch drawn
    at random); with ``stride`` or ``class`` the images ``data.victims`` names (CENSOR
    §V-B, Fig. 3)."""
    count, size = spec["victims"]["count"], spec["protocol"]["batch_size"]
    if spec["victims"]["stride"]:
        return victim_images.strided(labels, spec)
    if spec["victims"]["class"] is not None:
        return victim_images.of_class(labels, spec, rng)
    if not spec["victims"]["distinct_labels"]:
        chosen = rng.choice(len(labels), count * size, replace=False)
        return [np.sort(chosen[v * size:(v + 1) * size]) for v in range(count)]
    classes = np.unique(labels)
    if size > len(classes):
        raise ValueError(f"attack.protocol.batch_size {size} with "
                         f"attack.victims.distinct_labels needs at least {size} classes; the "
                         f"data have {len(classes)}")
    pools = {c: list(rng.permutation(np.flatnonzero(labels == c))) for c in classes}
    batches = []
    for v in range(count):
        left = [c for c in classes if pools[c]]
        if len(left) < size:
            raise ValueError(f"attack.victims.count {count} x batch_size {size} with distinct "
                             f"labels exhausts the training split after {v} victims")
        picked = rng.choice(left, size, replace=False)
        batches.append(np.sort([pools[c].pop() for c in picked]))
    return batches


def observations(job: Job, model: torch.nn.Module, train: data.ImageData,
                 defense: defenses.Defense, seeds: dict) -> tuple[list, list]:
    """The observations (defended uploads) of ``attack.victims.count`` client batches, and the
    truths. Each victim's upload is made as FL clients make theirs (``fl.local_steps``
    SGD steps on its batch, or ``fl.local_epochs`` over it, then the defense), which the
    attacks match by unrolling those steps (:func:`local_protocol`; over several epochs'
    mini-batches through a copy of the images per epoch, ``attack.attacker.epoch_copies``).
    With
    ``attack.protocol.mixed`` each victim's model is its own: the round-0 model after
    ``attack.protocol.round`` rounds of the victim and another client (CENSOR Fig. 2)."""
    spec, fl = job.resolved["attack"], job.resolved["fl"]
    device = next(model.parameters()).device
    source = split_data(job, train)
    batches = victim_batches(source.y.numpy(), spec, np.random.default_rng(seeds["victims"]))
    taken = (np.concatenate(batches) if spec["victims"]["split"] == "train"
             else np.zeros(0, np.int64))
    observed, truths = [], []
    for v, batch in enumerate(batches):
        idx = torch.from_numpy(batch)
        x, y = source.x[idx].to(device), source.y[idx].to(device)
        # attribute tasks: the batch's sensitive attributes, which RecUP-FL protects
        batch = (x, y, {a: values[idx] for a, values in source.attributes.items()}) \
            if source.attributes else (x, y)
        attacked = (mixed_model(job, model, train, batch, taken, defense, seeds, v)
                    if spec["protocol"]["mixed"]["batch_size"] else model)
        steps = batch_schedule(len(idx), fl["local_steps"], fl["local_epochs"],
                               fl["client_batch_size"],
                               np.random.default_rng(derived_seed(seeds["victims"], 3, v)))
        upload = client_update(attacked, lambda k, b=batch, s=steps: rows_of(b, s[k]),
                               len(steps), fl["local_lr"], defense,
                               torch.Generator().manual_seed(seeds["defense"] + v))
        obs = Observation(
            model=attacked, gradient=upload, batch_size=len(idx),
            labels=y if spec["attacker"]["known_labels"] else None,
            bn_statistics=batch_statistics(attacked, x) or None,  # BN_exact: the client's
            **local_protocol(fl, spec))
        copied = spec["attacker"]["epoch_copies"] and obs.local_batches > 1
        observed.append(EpochCopies.of(obs, spec["attacker"]["epoch_prior"]) if copied else obs)
        truths.append((idx, x.cpu(), y.cpu()))
    return observed, truths


def local_protocol(fl: Mapping, attack: Mapping) -> dict:
    """The client's local steps, learning rate and mini-batches per epoch as the attack
    knows them: FedAvg's ``fl.local_steps`` at ``fl.local_lr``, or ``fl.local_epochs`` over
    the batch of ``attack.protocol.batch_size`` in mini-batches of ``fl.client_batch_size``,
    unrolled in each trial (``attack.attacker.unrolled``); else one step, the
    single-gradient objective."""
    size = attack["protocol"]["batch_size"]
    batches = size // min(fl["client_batch_size"], size) if fl["local_epochs"] else 1
    steps = fl["local_epochs"] * batches or fl["local_steps"]
    if steps == 1 or not attack["attacker"]["unrolled"]:
        return {}
    return {"local_steps": steps, "local_lr": fl["local_lr"], "local_batches": batches}


def swept_problem(config: Mapping, name: str, section: Mapping) -> str | None:
    """Why a sweep's copy ``section`` of the configuration's section ``name`` cannot run
    (:func:`epochs_problem`, :func:`labels_problem`); None when it can."""
    if name not in ("attack", "fl"):
        return None
    return epochs_problem({**config, name: section}) or (
        labels_problem(config, section) if name == "attack" else None)


def epochs_problem(config: Mapping) -> str | None:
    """Why ``fl.local_epochs`` cannot run with the configuration, naming the keys; None when
    it can or is off."""
    fl, protocol = config["fl"], config["attack"]["protocol"]
    epochs, size = fl["local_epochs"], protocol["batch_size"]
    if not epochs:
        return None
    if fl["local_steps"] != 1:
        return (f"'fl.local_epochs' {epochs} counts the client's steps itself; expected "
                f"'fl.local_steps' 1, got {fl['local_steps']}")
    if size % min(fl["client_batch_size"], size):
        return (f"'fl.local_epochs' {epochs}: a victim's {size} images "
                f"('attack.protocol.batch_size') in mini-batches of 'fl.client_batch_size' "
                f"{fl['client_batch_size']}; expected a batch size it divides")
    for key, on in (("attack.protocol.mixed.batch_size", protocol["mixed"]["batch_size"]),
                    ("attack.protocol.sequence.steps", protocol["sequence"]["steps"])):
        if on:
            return (f"'fl.local_epochs' {epochs} with '{key}' {on!r}: its uploads take "
                    f"'fl.local_steps' only; expected one of the two")
    return None


def sequence_observations(job: Job, model: torch.nn.Module, train: data.ImageData,
                          defense: defenses.Defense, seeds: dict) -> tuple[list, list]:
    """GIAS App. D, Fig. A3: the victims' batches of :func:`observations`, each now a
    client's local dataset of ``attack.protocol.batch_size`` images seen through
    ``attack.protocol.sequence.steps`` uploads (an ``ObservedSequence``), and the truths
    (the whole batches). Upload t is of a random subset S_t of
    ``attack.protocol.sequence.subset`` images (seeded per victim) under
    theta_t, made as FL clients make theirs (``fl.client_update``: local steps, then the
    defense). theta_1 is the attacked round's model; then ``reinitialised``: a fresh
    initialisation of the case's model seeded per step, the same for every victim;
    ``trained``: the victim's theta_{t-1} after its own ``fl.local_steps`` SGD steps at
    ``fl.local_lr`` on S_{t-1} (the clean gradient: the defense changes only uploads)."""
    spec, fl = job.resolved["attack"], job.resolved["fl"]
    train = split_data(job, train)  # the victims' split (attack.victims.split)
    sequence = spec["protocol"]["sequence"]
    steps, size, theta_mode = (sequence[k] for k in ("steps", "subset", "theta"))
    device = next(model.parameters()).device
    batches = victim_batches(train.y.numpy(), spec, np.random.default_rng(seeds["victims"]))
    fresh = [model]
    for t in range(1, steps if theta_mode == "reinitialised" else 1):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derived_seed(seeds["victims"], 0, t))
            fresh.append(build_model(job.spec, train).to(device).train(model.training))
    observed, truths = [], []
    for v, batch in enumerate(batches):
        idx = torch.from_numpy(batch)
        x, y = train.x[idx].to(device), train.y[idx].to(device)
        rng = np.random.default_rng(derived_seed(seeds["victims"], 1, v))
        theta, uploads, subsets = model, [], []
        for t in range(steps):
            if theta_mode == "reinitialised":
                theta = fresh[t]
            elif t:  # the client trains on its previous upload's images
                pseudo = local_update(theta, lambda _step, b=uploads[-1][1]: b,
                                      fl["local_steps"], fl["local_lr"])
                theta = copy.deepcopy(theta)
                with torch.no_grad():
                    for name, param in theta.named_parameters():
                        param.sub_(fl["local_lr"] * pseudo[name])
            subset = np.sort(rng.choice(len(batch), size, replace=False))
            own = torch.from_numpy(subset).to(device)
            part = (x[own], y[own], {a: values[idx][own.cpu()]
                                     for a, values in train.attributes.items()}) \
                if train.attributes else (x[own], y[own])
            upload = client_update(theta, lambda _step, b=part: b, fl["local_steps"],
                                   fl["local_lr"], defense,
                                   torch.Generator().manual_seed(
                                       derived_seed(seeds["defense"], v, t)))
            uploads.append((Observation(model=theta, gradient=upload, batch_size=size,
                                        labels=part[1],
                                        bn_statistics=batch_statistics(theta, part[0]) or None),
                            part))
            subsets.append(tuple(subset.tolist()))
        first = uploads[0][0]
        observed.append(ObservedSequence(
            model=first.model, gradient=first.gradient, batch_size=len(idx), labels=y,
            steps=[obs for obs, _ in uploads], subsets=subsets))
        truths.append((idx, x.cpu(), y.cpu()))
    return observed, truths


def split_data(job: Job, train: data.ImageData) -> data.ImageData:
    """The prepared split the job's victims are drawn from (``attack.victims.split``)."""
    split = job.resolved["attack"]["victims"]["split"]
    return train if split == "train" else data.load_prepared(job.data_dir, split)


def mixed_model(job: Job, model: nn.Module, train: data.ImageData, victim: tuple,
                taken: np.ndarray, defense, seeds: dict, v: int) -> nn.Module:
    """Victim ``v``'s model at ``attack.protocol.round`` with ``attack.protocol.mixed``: the
    round-0 model after that many rounds of the victim (its batch ``victim``) and another
    client whose batches of ``attack.protocol.mixed.batch_size`` are drawn afresh each round
    and local step (seeded by victim, round and step) from the train images outside
    ``taken`` (the victims' own, when they are training images)."""
    spec, fl = job.resolved["attack"], job.resolved["fl"]
    rounds = spec["protocol"]["round"]
    if not rounds:
        return model
    device = next(model.parameters()).device
    others = np.setdiff1d(np.arange(len(train)), taken)
    size = spec["protocol"]["mixed"]["batch_size"]

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


def sequence_problem(attack: Mapping) -> str | None:
    """Why an ``attack:`` section's ``sequence`` (GIAS App. D) cannot run, naming the keys;
    None when it can or is off (``steps`` 0)."""
    sequence, size = attack["protocol"]["sequence"], attack["protocol"]["batch_size"]
    if not sequence["steps"]:
        return None
    if sequence["subset"] > size:
        return (f"'attack.protocol.sequence.subset': {sequence['subset']} images per upload, "
                f"but 'attack.protocol.batch_size' gives a victim {size} local images; "
                f"expected at most {size}")
    if not attack["attacker"]["known_labels"]:
        return (f"'attack.protocol.sequence.steps': {sequence['steps']} uploads need "
                f"'attack.attacker.known_labels': true (GIAS App. D: the attacker matches each "
                f"upload to its images); got false")
    return None


def labels_problem(config: Mapping, attack: Mapping) -> str | None:
    """Why the victims' batches of ``attack`` (the ``attack:`` section, or a swept copy)
    cannot each hold ``attack.protocol.batch_size`` different labels
    (``attack.victims.distinct_labels``) in some case's dataset, as many as its options say
    it has (``data.datasets.label_count``); None when they can, the count is not known yet,
    no attack runs or a stride or class chooses the victims."""
    chosen, size = attack["victims"], attack["protocol"]["batch_size"]
    if not (config["attacks"] and chosen["distinct_labels"]) or chosen["stride"] \
            or chosen["class"] is not None:
        return None
    for dataset in dict.fromkeys(case["dataset"] for case in config["cases"]):
        labels = data.datasets.label_count(dataset, config["datasets"].get(dataset, {}))
        if labels is not None and size > labels:
            return (f"'attack.protocol.batch_size' {size} with 'attack.victims.distinct_labels' "
                    f"true: a victim's batch needs {size} different labels, but {dataset!r} has "
                    f"{labels} classes; expected at most {labels}")
    return None
