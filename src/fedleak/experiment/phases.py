"""The pipeline phases, each a function of (validated configuration, results folder, the
job's identity): prepare data, train the evaluation network, the GAN prior and GIML's
generator, run FL for one setting, attack one setting, aggregate. Every output is written
atomically; each is a function of (configuration, seed)."""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

import numpy as np
import torch

from fedleak import attacks, data, defenses, metrics, models
from fedleak.attacks.bn_statistics import batch_statistics
from fedleak.attacks.gradient_sequence import ObservedSequence
from fedleak.config import sequence_problem
from fedleak.data import victims as victim_images
from fedleak.experiment import paths, plan, studies
from fedleak.experiment import victims as victims_of
from fedleak.experiment.artifacts import (
    Job,
    artifact_files,
    build_adaptive,
    build_attack,
    build_defense,
    kinds_needed,
    prior_dataset,
)
from fedleak.fl import FLSettings, client_update, local_update, run_federated
from fedleak.types import ADAPTIVE, PAPER, Observation, Setting, artifact_parts
from fedleak.utils.device import select
from fedleak.utils.io import (
    load_state,
    load_torch,
    save_image_grid,
    save_npy,
    save_torch,
    write_json,
)
from fedleak.utils.seeding import child_seeds, derived_seed, seed_everything

NONE = plan.NONE


def _loader_options(config: dict, dataset: str) -> tuple[dict, dict, int]:
    """The loader options, split fractions and split seed of a configured dataset."""
    spec = dict(config["datasets"][dataset])
    splits = spec.pop("splits")
    seed = spec.pop("split_seed", spec.get("seed"))
    return spec, splits, seed


def missing_datasets(config: dict, results: Path) -> list[str]:
    """Why each planned dataset that is not prepared yet cannot be loaded (empty: all can)."""
    needed = [p.parent.name for p in outputs(config, results)["data"] if not p.is_file()]
    return [reason for name in needed
            if (reason := data.datasets.missing(name, config["datasets"][name]))]


def prepare_data(config: dict, results: Path, dataset: str) -> None:
    if dataset not in config["datasets"]:
        raise ValueError(f"dataset {dataset!r} is not configured; expected one of "
                         f"{sorted(config['datasets'])}")
    options, splits, seed = _loader_options(config, dataset)
    out = paths.data_dir(results, dataset)
    manifest = data.prepare(dataset, out, options, splits, seed)
    counts = {k: v["count"] for k, v in manifest["splits"].items()}
    print(f"prepared {dataset}: {counts} -> {out}", file=sys.stderr)
    # the victims the attack jobs draw from these splits (CENSOR's stride, a class), before
    # any FL run: the same check runs when snakemake starts with the data prepared
    if found := victims_of.problems(config, results, dataset):
        raise ValueError(found[0])


def _resized(images: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    if tuple(images.shape[-2:]) == tuple(size):
        return images
    return torch.nn.functional.interpolate(images, size=size, mode="bilinear",
                                           align_corners=False)


def train_evalnet(config: dict, results: Path, dataset: str) -> None:
    """Refiner's evaluation network for the images of ``dataset``, trained on public photos."""
    spec = config["evalnet"]
    device = select(config["device"])
    seed_everything(spec["seed"], config["threads"])
    target = data.load_prepared(paths.data_dir(results, dataset), "test").to(device)
    public = data.load_prepared(paths.data_dir(results, spec["dataset"]), "train").to(device)
    images = _resized(data.datasets.to_channels(public.x, target.x.shape[1]), target.x.shape[-2:])
    net, losses = models.evalnet.train_evaluation_network(
        images, epochs=spec["epochs"], batch_size=spec["batch_size"], lr=spec["lr"],
        seed=spec["seed"], widths=spec["widths"])
    rows = models.evalnet.monotonicity(net, target.x, seed=spec["seed"])
    predictions = [r["prediction"] for r in rows]
    out = paths.evalnet_file(results, dataset)
    save_torch(out, net.state_dict())
    write_json(out.with_suffix(".json"), {
        "dataset": dataset, "trained_on": spec["dataset"], "widths": spec["widths"],
        "input_shape": list(target.x.shape[1:]), "epoch_losses": losses, "monotonicity": rows,
        "monotonic": bool(np.all(np.diff(predictions) > 0)),
    })


def _save_generator(out: Path, generator: models.Generator, spec: dict, channels: int,
                    log: dict, checkpoints: dict[int, dict] | None = None) -> None:
    """The generator (and GIML's ``checkpoints``, outer step -> state), its samples and
    log. With several checkpoints the samples are one row per kept step, the same 8 latent
    codes in every row (GIAS Fig. 6(a)); else 64 samples, rendered on the generator's
    device from the same codes on every device."""
    device = next(generator.parameters()).device
    save_torch(out, {"generator": generator.state_dict(), "latent_dim": spec["latent_dim"],
                     "width": spec["width"], "channels": channels,
                     "resolution": generator.resolution,
                     **({"checkpoints": checkpoints} if checkpoints else {})})
    with torch.no_grad():
        z = torch.randn(64, spec["latent_dim"], generator=torch.Generator().manual_seed(0))
        z = z.to(device)
        images = generator(z)
        if checkpoints and len(checkpoints) > 1:
            shown = models.Generator(spec["latent_dim"], channels, spec["width"],
                                     generator.resolution).to(device)
            shown.eval()
            images = torch.cat([load_state(shown, state, out, f"step {step}")(z[:8])
                                for step, state in sorted(checkpoints.items())])
        save_image_grid((images + 1) / 2, out.with_suffix(".png"), nrow=8)
    write_json(out.with_suffix(".json"), log)


def train_gan(config: dict, results: Path, dataset: str | None = None) -> None:
    """The DCGAN prior of the GAN-based attacks on ``dataset``'s ``gan.split`` (None:
    ``gan.dataset``; another: the wrong prior an attack's ``prior_dataset`` names)."""
    spec = config["gan"]
    dataset = dataset or spec["dataset"]
    if spec["kind"] != "dcgan":
        raise ValueError(f"gan.kind {spec['kind']!r} is pretrained (gan.weights); only the "
                         f"dcgan kind is trained (expected gan.kind dcgan)")
    if dataset not in config["datasets"]:
        raise ValueError(f"dataset {dataset!r} is not configured; expected one of "
                         f"{sorted(config['datasets'])}")
    device = select(config["device"])
    seed_everything(spec["seed"], config["threads"])
    images = data.load_prepared(paths.data_dir(results, dataset), spec["split"]).x.to(device)
    # the DCGAN generates gan.resolution (32 or 64); attacks resize to the model's input
    size = spec["resolution"]
    images = _resized(images, (size, size)).clamp(0, 1)
    generator, log = models.dcgan.train_dcgan(
        images, epochs=spec["epochs"], batch_size=spec["batch_size"], lr=spec["lr"],
        latent_dim=spec["latent_dim"], width=spec["width"], seed=spec["seed"])
    _save_generator(paths.gan_file(results, dataset), generator, spec, images.shape[1],
                    {"dataset": dataset, "split": spec["split"], "log": log})


def build_model(case: dict, prepared: data.ImageData) -> torch.nn.Module:
    options = {"uniform_init": case["uniform_init"]} if case["model"] == "lenet" else {}
    if case["model"] == "attribute_cnn":
        options["layout"] = case["layout"]
    c, h, _ = prepared.x.shape[1:]
    return models.build(case["model"], c, prepared.num_classes, h,
                        input_shape=tuple(prepared.x.shape[1:]), **options)


def model_at(job: Job, train: data.ImageData, checkpoint: Path) -> torch.nn.Module:
    model = build_model(job.spec, train)
    return load_state(model, load_torch(checkpoint), checkpoint,
                      f"case {job.case!r} ({type(model).__name__})")


def train_giml(config: dict, results: Path, case: str) -> None:
    """GIML's generator, meta-learned from client gradients of the undefended FL run."""
    from fedleak.attacks.giml import meta_learn_generator

    spec = config["giml"]
    job = Job(config, results, case, NONE, config["attack"]["seeds"][0])
    device = select(config["device"])
    seed_everything(spec["seed"], config["threads"])
    train = data.load_prepared(job.data_dir, "train").to(device)
    model = model_at(job, train, job.checkpoint).to(device)
    rng = np.random.default_rng(spec["seed"])
    chosen = rng.choice(len(train), spec["observations"] * spec["batch_size"], replace=False)
    observations = []
    none = defenses.build("none")
    for batch in np.sort(chosen).reshape(spec["observations"], spec["batch_size"]):
        idx = torch.from_numpy(batch)
        update = none(defenses.DefenseContext(model, train.x[idx], train.y[idx]))
        observations.append(Observation(model=model, gradient=update, batch_size=len(idx)))
    generator = models.Generator(spec["latent_dim"], train.x.shape[1], spec["width"])
    torch.manual_seed(spec["seed"])
    generator.apply(models.dcgan.init_weights)
    keys = ("outer_steps", "tasks_per_step", "latent_iterations", "parameter_iterations",
            "lr_z", "lr_w", "meta_optimizer", "meta_lr", "tv", "z_norm", "seed")
    kept = sorted({*spec["checkpoints"], spec["outer_steps"]})  # Fig. 6: attacks' `step`
    checkpoints: dict[int, dict] = {}

    def keep(step: int, net: torch.nn.Module, _entry: dict | None = None) -> None:
        if step in kept:
            checkpoints[step] = {k: v.detach().cpu().clone() for k, v in net.state_dict().items()}

    keep(0, generator)  # the random start
    meta, log = meta_learn_generator(observations, generator, callback=keep,
                                     **{k: spec[k] for k in keys})
    _save_generator(paths.giml_file(results, case), meta, spec, train.x.shape[1],
                    {"case": case, "spec": spec, "indices": sorted(chosen.tolist()),
                     "checkpoints": kept, "log": log}, checkpoints)


def run_fl(config: dict, results: Path, case: str, setting: Setting, seed: int) -> None:
    """Federated training of one case under one setting's defense; the model is saved at
    every round some setting attacks, and at the end."""
    job = Job(config, results, case, plan.fl_setting(setting), seed)
    _check_seed(seed, config["fl"]["seeds"], "fl.seeds")
    seeds = child_seeds(seed, ["partition", "init", "rounds"])
    device = select(config["device"])
    seed_everything(seeds["init"], config["threads"])
    train = data.load_prepared(job.data_dir, "train")
    test = data.load_prepared(job.data_dir, "test").to(device)
    # the model first: every setting of one seed starts from the same weights, whatever
    # its defense draws while it is built (RecUP-FL's zoo, Refiner's network)
    model = build_model(job.spec, train).to(device)
    defense = build_defense(job, model)
    part = job.spec["partition"]
    groups = train.attributes[part["attribute"]].numpy() if part["kind"] == "attribute" \
        else None  # RecUP-FL Fig. 7: whole identities per client
    shards = data.partition(train.y.numpy(), part["kind"], part["clients"],
                            np.random.default_rng(seeds["partition"]), part.get("alpha"), groups)
    train = train.to(device)  # once: the clients' batches are drawn on the device
    rounds = set(plan.checkpoint_rounds(config))

    diverged: list[int] = []  # the first round that starts from non-finite weights

    def checkpoint(r: int, m: torch.nn.Module) -> None:
        if not diverged and not all(torch.isfinite(p).all() for p in m.parameters()):
            diverged.append(r)
        if r in rounds:
            save_torch(paths.checkpoint(results, case, job.setting, seed, r), m.state_dict())

    start = time.perf_counter()
    history = run_federated(model, train, test, shards, defense,
                            FLSettings.from_config(job.resolved["fl"]), seeds["rounds"],
                            checkpoint)
    failure = None
    if diverged:  # a defense (or the server optimiser) made the weights NaN/inf
        failure = (f"diverged: the model's weights are NaN/inf from round {diverged[0]} on (a "
                   f"defended upload or the server step was not finite); accuracy from then "
                   f"on is not measured")
        for entry in history:
            if entry["round"] >= diverged[0]:
                entry["accuracy"] = float("nan")
        print(f"FL {case} {job.setting} seed {seed}: {failure}", file=sys.stderr)
    save_torch(job.fl_dir / "final.pt", model.state_dict())
    uploads = sum(entry["uploads"] for entry in history)
    write_json(job.fl_dir / "metrics.json", {
        "case": case, "setting": job.setting.text, "defense": job.setting.label,
        "strength": job.setting.strength, "seed": seed, "history": history,
        "final_accuracy": history[-1]["accuracy"], "client_sizes": [len(s) for s in shards],
        "fallback_rate": sum(entry["fallbacks"] for entry in history) / max(uploads, 1),
        "wall_time": time.perf_counter() - start, "failure": failure,
    })
    print(f"FL {case} {job.setting} seed {seed}: accuracy {history[-1]['accuracy']:.4f}",
          file=sys.stderr)


def _check_seed(seed: int, seeds: list[int], key: str) -> None:
    if seed not in seeds:
        raise ValueError(f"--seed {seed} is not one of '{key}' {seeds}; expected one of them "
                         f"(`fedleak plan` lists the jobs)")


def _victim_batches(labels: np.ndarray, spec: dict, rng: np.random.Generator
                    ) -> list[np.ndarray]:
    """``attack.victims`` disjoint batches of ``attack.batch_size`` indices of the victims'
    split (``attack.split``), sorted; with ``distinct_labels`` each batch's labels differ
    (drawn without replacement per class, the classes of a batch drawn at random); with
    ``stride`` or ``victim_class`` the images ``data.victims`` names (CENSOR §V-B, Fig. 3)."""
    count, size = spec["victims"], spec["batch_size"]
    if spec["stride"]:
        return victim_images.strided(labels, spec)
    if spec["victim_class"] is not None:
        return victim_images.of_class(labels, spec, rng)
    if not spec["distinct_labels"]:
        chosen = rng.choice(len(labels), count * size, replace=False)
        return [np.sort(chosen[v * size:(v + 1) * size]) for v in range(count)]
    classes = np.unique(labels)
    if size > len(classes):
        raise ValueError(f"attack.batch_size {size} with attack.distinct_labels needs at least "
                         f"{size} classes; the data have {len(classes)}")
    pools = {c: list(rng.permutation(np.flatnonzero(labels == c))) for c in classes}
    batches = []
    for v in range(count):
        left = [c for c in classes if pools[c]]
        if len(left) < size:
            raise ValueError(f"attack.victims {count} x batch_size {size} with distinct labels "
                             f"exhausts the training split after {v} victims")
        picked = rng.choice(left, size, replace=False)
        batches.append(np.sort([pools[c].pop() for c in picked]))
    return batches


def _victims(job: Job, model: torch.nn.Module, train: data.ImageData,
             defense: defenses.Defense, seeds: dict) -> tuple[list, list]:
    """The observations (defended uploads) of ``attack.victims`` client batches, and the
    truths. Each victim's upload is made as FL clients make theirs (``fl.local_steps``
    SGD steps on its batch, then the defense); the attacks match one gradient step. With
    ``attack.mixed`` each victim's model is its own: the round-0 model after
    ``attack.round`` rounds of the victim and another client (CENSOR Fig. 2)."""
    spec, fl = job.resolved["attack"], job.resolved["fl"]
    device = next(model.parameters()).device
    source = victims_of.split_data(job, train)
    batches = _victim_batches(source.y.numpy(), spec, np.random.default_rng(seeds["victims"]))
    taken = np.concatenate(batches) if spec["split"] == "train" else np.zeros(0, np.int64)
    observations, truths = [], []
    for v, batch in enumerate(batches):
        idx = torch.from_numpy(batch)
        x, y = source.x[idx].to(device), source.y[idx].to(device)
        # attribute tasks: the batch's sensitive attributes, which RecUP-FL protects
        batch = (x, y, {a: values[idx] for a, values in source.attributes.items()}) \
            if source.attributes else (x, y)
        attacked = (victims_of.mixed_model(job, model, train, batch, taken, defense, seeds, v)
                    if spec["mixed"]["batch_size"] else model)
        upload = client_update(attacked, lambda _step, b=batch: b, fl["local_steps"],
                               fl["local_lr"], defense,
                               torch.Generator().manual_seed(seeds["defense"] + v))
        observations.append(Observation(
            model=attacked, gradient=upload, batch_size=len(idx),
            labels=y if spec["known_labels"] else None,
            bn_statistics=batch_statistics(attacked, x) or None))  # BN_exact: the client's
        truths.append((idx, x.cpu(), y.cpu()))
    return observations, truths


def _sequence_victims(job: Job, model: torch.nn.Module, train: data.ImageData,
                      defense: defenses.Defense, seeds: dict) -> tuple[list, list]:
    """GIAS App. D, Fig. A3: the victims' batches of :func:`_victims`, each now a client's
    local dataset of ``attack.batch_size`` images seen through ``attack.sequence.steps``
    uploads (an ``ObservedSequence``), and the truths (the whole batches). Upload t is of a
    random subset S_t of ``attack.sequence.subset`` images (seeded per victim) under
    theta_t, made as FL clients make theirs (``fl.client_update``: local steps, then the
    defense). theta_1 is the attacked round's model; then ``reinitialised``: a fresh
    initialisation of the case's model seeded per step, the same for every victim;
    ``trained``: the victim's theta_{t-1} after its own ``fl.local_steps`` SGD steps at
    ``fl.local_lr`` on S_{t-1} (the clean gradient: the defense changes only uploads)."""
    spec, fl = job.resolved["attack"], job.resolved["fl"]
    train = victims_of.split_data(job, train)  # the victims' split (attack.split)
    steps, size, theta_mode = (spec["sequence"][k] for k in ("steps", "subset", "theta"))
    device = next(model.parameters()).device
    batches = _victim_batches(train.y.numpy(), spec, np.random.default_rng(seeds["victims"]))
    fresh = [model]
    for t in range(1, steps if theta_mode == "reinitialised" else 1):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derived_seed(seeds["victims"], 0, t))
            fresh.append(build_model(job.spec, train).to(device).train(model.training))
    observations, truths = [], []
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
        observations.append(ObservedSequence(
            model=first.model, gradient=first.gradient, batch_size=len(idx), labels=y,
            steps=[obs for obs, _ in uploads], subsets=subsets))
        truths.append((idx, x.cpu(), y.cpu()))
    return observations, truths


def _check_sequence(spec: dict, built: dict) -> None:
    """ValueError, before any victim is made, unless ``attack.sequence`` can run: its
    values together (``config.sequence_problem``) and every attack's cost sums over a
    sequence (``Attack.sequences``)."""
    if problem := sequence_problem(spec):
        raise ValueError(problem)
    refused = [label for label, attack in built.items() if not attack.sequences]
    if spec["sequence"]["steps"] and refused:
        raise ValueError(f"'attack.sequence.steps': {spec['sequence']['steps']} uploads, but "
                         f"attack {refused[0]!r} cannot attack a sequence of uploads; expected "
                         f"attacks whose cost sums over a sequence (inverting_gradients, gias "
                         f"with sparsity 0, giml)")


IMAGE_METRICS = {"psnr": metrics.psnr, "ssim": metrics.ssim, "mse": metrics.mse,
                 "lpips": metrics.lpips, "stlpips": metrics.stlpips}


def _victim_record(v: int, truth: tuple, obs: Observation, rec: attacks.Reconstruction,
                   wanted: list[str], evalnet: torch.nn.Module | None, attacker: str
                   ) -> tuple[dict, torch.Tensor]:
    """One victim's metrics (batch means, and per image for batches of more than one), by
    the ``attacker`` (``paper``, or ``adaptive``: ``attack.adaptive``).

    ``failure`` says why a victim's numbers are not a reconstruction's: a defended upload
    with NaN/inf values, a reconstruction with NaN/inf pixels (its image metrics are NaN,
    never averaged: tables count such victims) or a metric that came out NaN.

    A reconstruction that recovered every layer's input (``extra["inputs"]``, input layer
    first: R-GAP's recursion) adds ``layer_errors``, each one's |x_r - x_r*| / |x_r*|
    against the true batch's, and ``layers``, its per-layer report (``extra["layers"]``:
    rank analysis, residual, how the layer was solved)."""
    idx, x, y = truth
    failure = None
    if not all(torch.isfinite(g).all() for g in obs.gradient.values()):
        failure = "the defended upload has NaN/inf values (the defense diverged)"
    images = rec.images.detach().cpu()
    finite = bool(torch.isfinite(images).all())
    if not finite:
        failure = f"diverged: the reconstruction has NaN/inf pixels (stop: {rec.stop_reason})"
        images = torch.nan_to_num(images, nan=0.0, posinf=1.0, neginf=0.0)  # the grid only
    matched = metrics.match(images, x)
    single = len(y) == 1
    record = {
        "victim": v, "attacker": attacker, "indices": idx.tolist(),
        "label": y.tolist()[0] if single else sorted(y.tolist()),
        "predicted_label": rec.labels.tolist()[0] if single else sorted(rec.labels.tolist()),
        "iterations": rec.iterations, "stop_reason": rec.stop_reason,
        "final_loss": rec.loss_trace[-1] if rec.loss_trace else None,
        "wall_time": rec.wall_time, "fallback": bool(obs.gradient.info.get("fallback", False)),
        # the numbers a defense reports about its upload (Refiner's robust_mse, Table 10)
        "upload_report": {k: v for k, v in obs.gradient.info.items() if isinstance(v, float)},
    }
    for name in wanted:
        if not finite:
            values = np.full(len(y), np.nan)
        else:
            values = np.asarray(metrics.noise_ratio(matched, evalnet, reduction="none")
                                if name == "noise_ratio"
                                else IMAGE_METRICS[name](matched, x, reduction="none"), float)
            if name != "lpips" and not np.isfinite(values).all():  # lpips: NaN when offline
                failure = failure or f"the {name} metric is NaN/inf on this reconstruction"
        record[name] = float(np.mean(values))
        if not single:
            record[f"{name}_per_image"] = [float(value) for value in values]
    if "inputs" in rec.extra:  # GIAS Figs. A1, A2: the error of every layer's input
        record["layer_errors"] = metrics.layer_errors(obs.model, x, rec.extra["inputs"])
        record["layers"] = rec.extra.get("layers")
    record["failure"] = failure
    return record, matched


def _save_details(out: Path, label: str, recs: list[attacks.Reconstruction], truths: list,
                  matched: list[torch.Tensor], spec: dict) -> None:
    """The reconstruction grid, and the snapshots and loss traces when asked for."""
    shown = min(spec["grid_victims"], len(recs))
    truth_images = torch.cat([t[1] for t in truths[:shown]])
    save_image_grid(torch.cat([truth_images, torch.cat(matched[:shown])]),
                    out / f"recon_{label}.png", nrow=len(truth_images))
    if spec["snapshots"]:  # (victims, snapshots + the truth, batch, C, H, W), uint8
        frames = np.stack([np.stack([*(metrics.match(torch.nan_to_num(rec.snapshots[t]),
                                                     truth[1]).numpy()
                                       for t in spec["snapshots"]), truth[1].numpy()])
                           for rec, truth in zip(recs, truths)])
        save_npy(out / f"snapshots_{label}.npy", (frames * 255).round().astype(np.uint8))
    if spec["traces"]:
        write_json(out / f"traces_{label}.json", [rec.loss_trace for rec in recs])


def _failed(obs: Observation, reason: str, snapshots: list[int]) -> attacks.Reconstruction:
    """What an attack that broke down numerically recorded: NaN images, the reason."""
    images = torch.full((obs.batch_size, *obs.input_shape), float("nan"))
    return attacks.Reconstruction(images, torch.zeros(obs.batch_size, dtype=torch.long), [], 0,
                                  0.0, reason, snapshots={t: images for t in snapshots})


def _finite_mean(values: list[float]) -> float:
    finite = [v for v in values if np.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


def _attackers(labels: list[str], built: dict, adaptive: dict
               ) -> list[tuple[str, str, attacks.base.Attack]]:
    """(label, attacker, attack) in the order they run: each label's paper attack, then its
    adaptive attacker where ``attack.adaptive`` names it."""
    return [(label, attacker, attack) for label in labels
            for attacker, attack in ((PAPER, built[label]), (ADAPTIVE, adaptive.get(label)))
            if attack is not None]


def run_attacks(config: dict, results: Path, case: str, setting: Setting, seed: int) -> None:
    """The job's attacks, each against the same defended uploads of one setting."""
    job = Job(config, results, case, setting, seed)
    _check_seed(seed, config["attack"]["seeds"], "attack.seeds")
    labels = job.attacks
    if not labels:
        raise ValueError(f"setting {setting.text!r} of case {case!r} is planned for FL only; "
                         f"no attack runs on it")
    spec = job.resolved["attack"]
    if why := victim_images.problem(spec, victims_of.class_counts(results, job.dataset),
                                    job.dataset):
        raise ValueError(why)
    seeds = child_seeds(seed, ["victims", "defense", "attack"])
    device = select(config["device"])
    seed_everything(seeds["attack"], config["threads"])
    train = data.load_prepared(job.data_dir, "train")
    model = model_at(job, train, job.checkpoint).to(device)
    defense = build_defense(job, model)
    built = {label: build_attack(job, label, model, defense, seeds["attack"]) for label in labels}
    adaptive = {label: build_adaptive(job, label, model, defense, seeds["attack"])
                for label in labels if label in spec["adaptive"]}
    _check_sequence(spec, {**built, **{f"{k} (adaptive)": a for k, a in adaptive.items()}})
    evalnet = (models.evalnet.load_evaluation_network(paths.evalnet_file(results, job.dataset))
               if "noise_ratio" in spec["metrics"] else None)
    victims = _sequence_victims if spec["sequence"]["steps"] else _victims
    observations, truths = victims(job, model, train, defense, seeds)
    out = paths.attack_dir(results, case, setting, seed)
    runs = {}
    for label, attacker, attack in _attackers(labels, built, adaptive):
        count = plan.victims(job.resolved, label)
        try:
            recs = attacks.reconstruct_all(attack, observations[:count], spec["snapshots"],
                                           progress=f"{label} ({attacker}) vs {setting}")
        except (ArithmeticError, torch.linalg.LinAlgError) as err:  # numerical breakdown
            recs = [_failed(obs, f"failed: {type(err).__name__}: {err}", spec["snapshots"])
                    for obs in observations[:count]]
        records, matched = zip(*(_victim_record(v, truth, obs, rec, spec["metrics"], evalnet,
                                                attacker)
                                 for v, (truth, obs, rec)
                                 in enumerate(zip(truths, observations, recs))))
        if spec["victim_class"] is not None:  # CENSOR Fig. 3: are they alike?
            victims_of.add_likeness(list(records), list(matched), truths[:len(records)])
        _save_details(paths.attack_details(results, case, setting, seed),
                      label if attacker == PAPER else f"{label}.adaptive", recs, truths,
                      list(matched), spec)
        run = runs.setdefault(label, {"attack": plan.attack_of(job.resolved, label)[0],
                                      "params": plan.attack_of(job.resolved, label)[1],
                                      "victims": []})
        run["victims"] += records
        if attacker == ADAPTIVE:  # what ran as the adaptive attacker: EOT's samples
            run["adaptive"] = {"attack": "eot", "samples": attack.draws,
                               "defense": attack.defense.name}
        summary = ", ".join(f"{m} {_finite_mean([r[m] for r in records]):.4g}"
                            for m in spec["metrics"][:2])
        failed = [f"victim {r['victim']}: {r['failure']}" for r in records if r["failure"]]
        print(f"{label} ({attacker}) vs {setting}: {summary} over {count} victims"
              + (f"; {len(failed)} failed ({'; '.join(failed)})" if failed else ""),
              file=sys.stderr)
    write_json(out / "metrics.json", {
        "case": case, "setting": setting.text, "defense": setting.label,
        "strength": setting.strength, "seed": seed, "round": spec["round"], "runs": runs,
        "snapshots": spec["snapshots"],
        "lpips_unavailable": (metrics.lpips_unavailable_reason() if "lpips" in spec["metrics"]
                              else None),
    })


def outputs(config: dict, results: Path) -> dict[str, list[Path]]:
    """Every artifact the configuration asks for, by phase (the Snakemake targets). The GAN
    prior, GIML's generators, the evaluation network and the data they train on appear only
    when a planned defense, attack or metric needs them."""
    out: dict[str, list[Path]] = {"fl": [], "attacks": [], "gan": [], "giml": [],
                                  "evalnet": [], "zoo": []}
    priors: set[str] = set()  # the datasets of the GAN priors, trained or not
    for case, setting in plan.fl_jobs(config):
        out["fl"] += [paths.fl_metrics(results, case, setting, seed)
                      for seed in config["fl"]["seeds"]]
    for case, setting in plan.jobs(config):
        job = Job(config, results, case, setting, config["attack"]["seeds"][0])
        needed = kinds_needed(job)
        kinds = {artifact_parts(n)[0] for n in needed}
        if job.attacks:
            out["attacks"] += [paths.attack_metrics(results, case, setting, seed)
                               for seed in config["attack"]["seeds"]]
        for artifact in needed:  # the priors: of gan.dataset or of an attack's prior_dataset
            kind, of = artifact_parts(artifact)
            if config["gan"]["kind"] != "dcgan":  # pretrained (gan.weights): nothing to train
                continue
            if kind == "gan":
                out["gan"] += artifact_files(job, artifact)
            if kind in ("gan", "untrained_gan"):
                priors.add(prior_dataset(job, of))
        if "giml_generator" in kinds:
            out["giml"].append(paths.giml_file(results, case))
        if "evalnet" in kinds:
            out["evalnet"].append(paths.evalnet_file(results, job.dataset))
        if "model_zoo" in kinds:
            out["zoo"] += [paths.zoo_file(results, case, seed, r) for seed in config["fl"]["seeds"]
                           for r in config["attribute"]["rounds"]]
    out["attribute"] = [paths.attribute_metrics(results, case, setting, seed)
                        for case, setting in plan.attribute_jobs(config)
                        for seed in config["fl"]["seeds"]]
    for key in ("gan", "giml", "evalnet", "zoo"):
        out[key] = sorted(set(out[key]))
    datasets = {plan.find_case(config, case)["dataset"] for case in plan.case_names(config)}
    if out["evalnet"]:
        datasets.add(config["evalnet"]["dataset"])
    datasets |= priors
    for name in plan.studies(config):
        params = config["targets"][name]["study"]
        datasets |= set(studies.STUDIES[params["kind"]].datasets(params))
        evalnets = studies.STUDIES[params["kind"]].evalnets(params)  # Refiner Figs. 4-6
        out["evalnet"] = sorted({*out["evalnet"], *(paths.evalnet_file(results, d)
                                                    for d in evalnets)})
        datasets |= {config["evalnet"]["dataset"]} if evalnets else set()
    out["studies"] = [paths.study_dir(results, name) for name in plan.studies(config)]
    out["data"] = [paths.data_manifest(results, d) for d in sorted(datasets)]
    out["tables"] = [paths.table(results, name) for name in tables(config)]
    out["figures"] = [paths.figure(results, name) for name in figures(config)]
    out["targets"] = [paths.target_dir(results, name) for name in plan.targets(config)]
    out["report"] = [paths.report(results)]
    return out


def tables(config: dict) -> list[str]:
    """The standard tables: every FL and attack run of the plan, row by row and summarised."""
    names = ["utility", "privacy", "tradeoff", "timing"]
    if not config["targets"] and plan.attack_jobs(config):
        names.append("censor_table")
        if set(config["defenses"]) - {NONE.defense}:  # every defense at matched utility
            names.append("matched_utility")
    if any(job_needs_evalnet(config, case, s) for case, s in plan.jobs(config)):
        names.append("evalnet_monotonicity")
    if plan.attribute_jobs(config):
        names += ["attribute", "attribute_gap"]
    return names


def figures(config: dict) -> list[str]:
    """The standard figures of a configuration without targets (its targets draw their own)."""
    if config["targets"]:
        return []
    labels = plan.attack_labels(config) if plan.attack_jobs(config) else []
    return ([f"pmm_vs_psnr_{a}" for a in labels] + [f"recon_{a}" for a in labels]
            + [f"tradeoff_{m}" for m in ("psnr", "ssim", "lpips", "stlpips", "noise_ratio")
               if labels]
            + (["censor_tradeoff"] if "censor_table" in tables(config) else [])
            + (["matched_utility"] if "matched_utility" in tables(config) else [])
            + (["evalnet_monotonicity"] if "evalnet_monotonicity" in tables(config) else [])
            + (["attribute_tradeoff"] if "attribute" in tables(config) else []))


def job_needs_evalnet(config: dict, case: str, setting: Setting) -> bool:
    return "evalnet" in kinds_needed(Job(config, Path("results"), case, setting,
                                         config["attack"]["seeds"][0]))


def write_target(config: dict, results: Path, name: str) -> None:
    """One paper target's table, comparison with the paper and figure."""
    from fedleak import report
    from fedleak.experiment.gather import target_inputs

    if name not in config["targets"]:
        raise ValueError(f"target {name!r} is not configured; expected one of "
                         f"{plan.targets(config)}")
    result = report.write_target(name, config["targets"][name],
                                 target_inputs(config, results, name),
                                 config["reference"].get(name), paths.target_dir(results, name))
    print(f"{name}: {', '.join(str(f) for f in result.files)}", file=sys.stderr)


def target_files(config: dict, results: Path, name: str) -> list[Path]:
    """The metrics files a target reads (its FL runs, the undefended ones, its attack jobs
    and its attribute jobs; a study's folder)."""
    if name in plan.studies(config):
        return [paths.study_dir(results, name)]
    files, planned = set(), set(plan.fl_jobs(config))
    attributed = set(plan.attribute_jobs(config))
    for point in (p for p in plan.points(config) if p.target == name):
        for setting in (plan.fl_setting(point.setting), NONE):
            if (point.case, setting) in planned:
                files |= {paths.fl_metrics(results, point.case, setting, seed)
                          for seed in config["fl"]["seeds"]}
        if (point.case, plan.fl_setting(point.setting)) in attributed:
            files |= {paths.attribute_metrics(results, point.case,
                                              plan.fl_setting(point.setting), seed)
                      for seed in config["fl"]["seeds"]}
        if point.attacks:
            files |= {paths.attack_metrics(results, point.case, point.setting, seed)
                      for seed in config["attack"]["seeds"]}
    return sorted(files)


def substitutions(config: dict) -> list[str]:
    """What stands in for the paper's data and generative priors in this configuration
    (report.md says it beside the results)."""
    from fedleak.data.datasets import SHAPES

    gan = config["gan"]
    priors = sorted({of or gan["dataset"] for label in config["attacks"]
                     for kind, of in map(artifact_parts, attacks.needs(
                         *plan.attack_of(config, label)).values()) if kind == "gan"}
                    ) if gan["kind"] == "dcgan" else []  # a pretrained prior stands in for none
    lines = []
    for name in sorted({case["dataset"] for case in config["cases"]} | set(priors)):
        kind = config["datasets"].get(name, {}).get("stand_in")
        if kind:
            c, h, w, classes = SHAPES[name]
            source = ("scikit-learn's bundled digits, resized, with their 10 labels"
                      if kind == "digits" else "torchvision's FakeData noise")
            lines.append(f"`{name}` ({c}x{h}x{w}, {classes} classes) is the `{kind}` stand-in: "
                         f"{source}, not {name}'s images.")
    if priors:
        lines.append(f"Generative priors: DCGANs ({gan['latent_dim']}-d latent, width "
                     f"{gan['width']}, {gan['resolution']}x{gan['resolution']}, resized to "
                     f"the model's input) trained in the pipeline on the {gan['split']} split "
                     f"of {', '.join(priors)}, in place of the papers' pretrained "
                     f"StyleGAN2/BigGAN.")
    return lines


def aggregate(config: dict, results: Path) -> None:
    """The standard tables and figures and report.md (with every target's result)."""
    from fedleak import report

    wanted = outputs(config, results)
    evalnet_json = [p.with_suffix(".json") for p in wanted["evalnet"]]
    names = tables(config)
    tables_ = report.write_tables(wanted["fl"], wanted["attacks"], evalnet_json,
                                  results / "tables", [n for n in names if "attribute" not in n],
                                  stronger=report.defense_directions(config))
    if "attribute" in names:
        tables_.update(report.write_attribute_tables(wanted["attribute"], results / "tables"))
    figures_ = report.write_figures(tables_, wanted["attacks"], results / "figures",
                                    figures(config))
    targets = [report.load_target(path) for path in wanted["targets"]]
    report.write_report(tables_, figures_, targets, paths.report(results), title=config["title"],
                        substitutions=substitutions(config))


def compare(config: dict, results: Path) -> str:
    """Every target's numbers beside the paper's, as text (``fedleak compare``)."""
    from fedleak.experiment.gather import target_inputs
    from fedleak.report.targets import build_table, select_rows
    from fedleak.report.targets import compare as beside

    blocks, summary = [], []
    for name in (t for t in plan.targets(config) if t in config["reference"]):
        reference, spec = config["reference"][name], config["targets"][name]
        if "table" not in spec:
            continue
        table = build_table(spec["table"], select_rows(target_inputs(config, results, name),
                                                       spec.get("where")))
        keys = [*spec["table"]["rows"], *spec["table"].get("columns", [])]
        comparison, agreement = beside(table, keys, reference)
        order = ", ".join(f"{m} {a}" for m, a in agreement.items())
        blocks.append(f"{name}: {spec['title']} ({reference['source']})\n"
                      f"{comparison.to_string(index=False, float_format=lambda v: f'{v:.4g}')}\n"
                      f"order of rows agrees with the paper for: {order}\n")
        counts = [tuple(map(int, a.split("/"))) for a in agreement.values() if a != "-"]
        summary.append((name, sum(c[0] for c in counts), sum(c[1] for c in counts)))
    if not blocks:
        return "no target has reference numbers\n"
    lines = [f"  {name:<8} {agree}/{total}" if total else f"  {name:<8} - (no pair to order)"
             for name, agree, total in summary]
    agree, total = sum(s[1] for s in summary), sum(s[2] for s in summary)
    blocks.append("pairs of rows ordered as in the paper, per target:\n" + "\n".join(lines)
                  + f"\n  {'all':<8} {agree}/{total}\n")
    return "\n".join(blocks)
