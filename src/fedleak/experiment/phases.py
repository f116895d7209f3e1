"""The pipeline phases, each a function of (validated configuration, results folder, the
job's identity): prepare data, train the evaluation network, the GAN prior and GIML's
generator, run FL for one setting, attack one setting, aggregate. Every output is written
atomically; each is a function of (configuration, seed)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from fedleak import attacks, data, defenses, metrics, models
from fedleak.attacks.bn_statistics import batch_statistics
from fedleak.experiment import paths, plan
from fedleak.experiment.artifacts import Job, build_attack, build_defense, kinds_needed
from fedleak.fl import FLSettings, client_update, run_federated
from fedleak.types import Observation, Setting
from fedleak.utils.io import load_torch, save_image_grid, save_torch, write_json
from fedleak.utils.seeding import child_seeds, seed_everything

NONE = Setting("none", 0)


def _loader_options(config: dict, dataset: str) -> tuple[dict, dict, int]:
    """The loader options, split fractions and split seed of a configured dataset."""
    spec = dict(config["datasets"][dataset])
    splits = spec.pop("splits")
    seed = spec.pop("split_seed", spec.get("seed"))
    return spec, splits, seed


def prepare_data(config: dict, results: Path, dataset: str) -> None:
    if dataset not in config["datasets"]:
        raise ValueError(f"dataset {dataset!r} is not configured; expected one of "
                         f"{sorted(config['datasets'])}")
    options, splits, seed = _loader_options(config, dataset)
    out = paths.data_dir(results, dataset)
    manifest = data.prepare(dataset, out, options, splits, seed)
    counts = {k: v["count"] for k, v in manifest["splits"].items()}
    print(f"prepared {dataset}: {counts} -> {out}", file=sys.stderr)


def _resized(images: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    if tuple(images.shape[-2:]) == tuple(size):
        return images
    return torch.nn.functional.interpolate(images, size=size, mode="bilinear",
                                           align_corners=False)


def train_evalnet(config: dict, results: Path, dataset: str) -> None:
    """Refiner's evaluation network for the images of ``dataset``, trained on public photos."""
    spec = config["evalnet"]
    seed_everything(spec["seed"], config["threads"])
    target = data.load_prepared(paths.data_dir(results, dataset), "test")
    public = data.load_prepared(paths.data_dir(results, spec["dataset"]), "train")
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
                    log: dict) -> None:
    save_torch(out, {"generator": generator.state_dict(), "latent_dim": spec["latent_dim"],
                     "width": spec["width"], "channels": channels})
    with torch.no_grad():
        z = torch.randn(64, spec["latent_dim"], generator=torch.Generator().manual_seed(0))
        save_image_grid((generator(z) + 1) / 2, out.with_suffix(".png"), nrow=8)
    write_json(out.with_suffix(".json"), log)


def train_gan(config: dict, results: Path) -> None:
    """The DCGAN prior of the GAN-based attacks, on ``gan.dataset``'s ``gan.split``."""
    spec = config["gan"]
    seed_everything(spec["seed"], config["threads"])
    images = data.load_prepared(paths.data_dir(results, spec["dataset"]), spec["split"]).x
    # the DCGAN generates 32x32; attacks resize to the model's input
    images = _resized(images, (32, 32)).clamp(0, 1)
    generator, log = models.dcgan.train_dcgan(
        images, epochs=spec["epochs"], batch_size=spec["batch_size"], lr=spec["lr"],
        latent_dim=spec["latent_dim"], width=spec["width"], seed=spec["seed"])
    _save_generator(paths.gan_file(results, spec["dataset"]), generator, spec, images.shape[1],
                    {"dataset": spec["dataset"], "split": spec["split"], "log": log})


def build_model(case: dict, prepared: data.ImageData) -> torch.nn.Module:
    options = {"uniform_init": case["uniform_init"]} if case["model"] == "lenet" else {}
    c, h, _ = prepared.x.shape[1:]
    return models.build(case["model"], c, prepared.num_classes, h, **options)


def _model_at(job: Job, train: data.ImageData, checkpoint: Path) -> torch.nn.Module:
    model = build_model(job.spec, train)
    state = load_torch(checkpoint)
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        raise ValueError(f"{checkpoint} does not fit case {job.case!r} "
                         f"({type(model).__name__}): {str(err).splitlines()[0]}") from None
    return model


def train_giml(config: dict, results: Path, case: str) -> None:
    """GIML's generator, meta-learned from client gradients of the undefended FL run."""
    from fedleak.attacks.giml import meta_learn_generator

    spec = config["giml"]
    job = Job(config, results, case, NONE, config["attack"]["seeds"][0])
    seed_everything(spec["seed"], config["threads"])
    train = data.load_prepared(job.data_dir, "train")
    model = _model_at(job, train, job.checkpoint)
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
    meta, log = meta_learn_generator(observations, generator, **{k: spec[k] for k in keys})
    _save_generator(paths.giml_file(results, case), meta, spec, train.x.shape[1],
                    {"case": case, "spec": spec, "indices": sorted(chosen.tolist()), "log": log})


def run_fl(config: dict, results: Path, case: str, setting: Setting, seed: int) -> None:
    """Federated training of one case under one setting's defense; the model is saved at
    every round some setting attacks, and at the end."""
    job = Job(config, results, case, plan.fl_setting(setting), seed)
    seeds = child_seeds(seed, ["partition", "init", "rounds"])
    seed_everything(seeds["init"], config["threads"])
    train = data.load_prepared(job.data_dir, "train")
    test = data.load_prepared(job.data_dir, "test")
    defense = build_defense(job)
    part = job.spec["partition"]
    shards = data.partition(train.y.numpy(), part["kind"], part["clients"],
                            np.random.default_rng(seeds["partition"]), part.get("alpha"))
    model = build_model(job.spec, train)
    rounds = set(plan.checkpoint_rounds(config))

    def checkpoint(r: int, m: torch.nn.Module) -> None:
        if r in rounds:
            save_torch(paths.checkpoint(results, case, job.setting, seed, r), m.state_dict())

    start = time.perf_counter()
    history = run_federated(model, train, test, shards, defense,
                            FLSettings.from_config(job.resolved["fl"]), seeds["rounds"],
                            checkpoint)
    save_torch(job.fl_dir / "final.pt", model.state_dict())
    write_json(job.fl_dir / "metrics.json", {
        "case": case, "setting": job.setting.text, "defense": job.setting.label,
        "strength": job.setting.strength, "seed": seed, "history": history,
        "final_accuracy": history[-1]["accuracy"], "client_sizes": [len(s) for s in shards],
        "wall_time": time.perf_counter() - start,
    })
    print(f"FL {case} {job.setting} seed {seed}: accuracy {history[-1]['accuracy']:.4f}",
          file=sys.stderr)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch.cuda.is_available() is False")
    return torch.device(name)


def _victims(job: Job, model: torch.nn.Module, train: data.ImageData,
             defense: defenses.Defense, seeds: dict) -> tuple[list, list]:
    """The observations (defended uploads) of ``attack.victims`` client batches, and the
    truths. Each victim's upload is made as FL clients make theirs (``fl.local_steps``
    SGD steps on its batch, then the defense); the attacks match one gradient step."""
    spec, fl = job.resolved["attack"], job.resolved["fl"]
    device = next(model.parameters()).device
    rng = np.random.default_rng(seeds["victims"])
    chosen = rng.choice(len(train), spec["victims"] * spec["batch_size"], replace=False)
    observations, truths = [], []
    for v in range(spec["victims"]):
        idx = torch.from_numpy(np.sort(chosen[v * spec["batch_size"]:(v + 1) * spec["batch_size"]]))
        x, y = train.x[idx].to(device), train.y[idx].to(device)
        upload = client_update(model, lambda _step, x=x, y=y: (x, y), fl["local_steps"],
                               fl["local_lr"], defense,
                               torch.Generator().manual_seed(seeds["defense"] + v))
        observations.append(Observation(
            model=model, gradient=upload, batch_size=len(idx),
            labels=y if spec["known_labels"] else None,
            bn_statistics=batch_statistics(model, x) or None))  # BN_exact: shared by the client
        truths.append((idx, x.cpu(), y.cpu()))
    return observations, truths


def _victim_record(v: int, truth: tuple, rec: attacks.Reconstruction,
                   evalnet: torch.nn.Module) -> tuple[dict, torch.Tensor]:
    idx, x, y = truth
    matched = metrics.match(rec.images.cpu(), x)
    single = len(y) == 1
    return {
        "victim": v, "indices": idx.tolist(),
        "label": y.tolist()[0] if single else sorted(y.tolist()),
        "predicted_label": rec.labels.tolist()[0] if single else sorted(rec.labels.tolist()),
        "psnr": metrics.psnr(matched, x), "ssim": metrics.ssim(matched, x),
        "mse": metrics.mse(matched, x), "lpips": metrics.lpips(matched, x),
        "noise_ratio": metrics.noise_ratio(matched, evalnet),
        "iterations": rec.iterations, "stop_reason": rec.stop_reason,
        "final_loss": rec.loss_trace[-1] if rec.loss_trace else None,
        "wall_time": rec.wall_time,
    }, matched


def run_attacks(config: dict, results: Path, case: str, setting: Setting, seed: int) -> None:
    """Every configured attack against the same defended uploads of one setting."""
    job = Job(config, results, case, setting, seed)
    spec = job.resolved["attack"]
    seeds = child_seeds(seed, ["victims", "defense", "attack"])
    seed_everything(seeds["attack"], config["threads"])
    train = data.load_prepared(job.data_dir, "train")
    model = _model_at(job, train, job.checkpoint).to(resolve_device(config["device"]))
    defense = build_defense(job, model)
    labels = plan.attack_labels(config)
    built = {label: build_attack(job, label, model, defense, seeds["attack"]) for label in labels}
    evalnet = models.evalnet.load_evaluation_network(paths.evalnet_file(results, job.dataset))
    observations, truths = _victims(job, model, train, defense, seeds)
    for label in tqdm(labels, desc=f"attacks vs {setting}", leave=False):
        count = plan.victims(job.resolved, label)
        recs = attacks.reconstruct_all(built[label], observations[:count])  # victim v: seed + v
        records, matched = zip(*(_victim_record(v, truth, rec, evalnet)
                                 for v, (truth, rec) in enumerate(zip(truths, recs))))
        out_dir = paths.attack_dir(results, case, setting, label, seed)
        shown = min(spec["grid_victims"], count)
        truth_images = torch.cat([t[1] for t in truths[:shown]])
        save_image_grid(torch.cat([truth_images, torch.cat(matched[:shown])]),
                        out_dir / "recon.png", nrow=len(truth_images))
        write_json(out_dir / "metrics.json", {
            "case": case, "setting": setting.text, "defense": setting.label,
            "strength": setting.strength, "attack": label, "seed": seed,
            "round": spec["round"], "params": plan.attack_of(job.resolved, label)[1],
            "victims": list(records), "lpips_unavailable": metrics.lpips_unavailable_reason(),
        })
        mean_psnr = float(np.mean([r["psnr"] for r in records]))
        print(f"{label} vs {setting}: mean PSNR {mean_psnr:.2f} dB", file=sys.stderr)


def outputs(config: dict, results: Path) -> dict[str, list[Path]]:
    """Every artifact the configuration asks for, by phase (the Snakemake targets). The GAN
    prior, GIML's generators and the data they train on appear only when a configured
    attack or defense needs them."""
    cases = plan.case_names(config)
    datasets = sorted({plan.find_case(config, c)["dataset"] for c in cases})
    out: dict[str, list[Path]] = {"fl": [], "attacks": [], "gan": [], "giml": []}
    for case in cases:
        for setting in plan.settings(config):
            for seed in config["attack"]["seeds"]:
                out["attacks"] += [paths.attack_metrics(results, case, setting, label, seed)
                                   for label in plan.attack_labels(config)]
                kinds = kinds_needed(Job(config, results, case, setting, seed))
                if "gan" in kinds:
                    out["gan"].append(paths.gan_file(results, config["gan"]["dataset"]))
                if "giml_generator" in kinds:
                    out["giml"].append(paths.giml_file(results, case))
        out["fl"] += [paths.fl_metrics(results, case, s, seed)
                      for s in plan.fl_settings(config) for seed in config["fl"]["seeds"]]
    out["gan"], out["giml"] = sorted(set(out["gan"])), sorted(set(out["giml"]))
    prepared = {*datasets, config["evalnet"]["dataset"]}
    if out["gan"]:
        prepared.add(config["gan"]["dataset"])
    out["data"] = [paths.data_manifest(results, d) for d in sorted(prepared)]
    out["evalnet"] = [paths.evalnet_file(results, d) for d in datasets]
    out["report"] = [paths.report(results)]
    return out


def aggregate(config: dict, results: Path) -> None:
    """Tables, figures and report.md from every FL and attack run of the configuration."""
    from fedleak import report

    wanted = outputs(config, results)
    evalnet_json = [p.with_suffix(".json") for p in wanted["evalnet"]]
    tables = report.write_tables(wanted["fl"], wanted["attacks"], evalnet_json,
                                 results / "tables", plan.ablation_points(config))
    figures = report.write_figures(tables, wanted["attacks"], results / "figures")
    report.write_report(tables, figures, paths.report(results), title=config["title"])
