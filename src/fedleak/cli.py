"""``fedleak <command>``: one command per pipeline rule, usable without Snakemake.

Every command reads the same validated configuration (``--config``), writes its
outputs atomically and is a function of (config, seed).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from fedleak import attacks, data, defenses, metrics, models, paths
from fedleak import config as cfg
from fedleak.attacks.bn_statistics import batch_statistics, dataset_statistics
from fedleak.fl.server import FLSettings, run_federated
from fedleak.utils.io import load_torch, read_json, save_torch, write_json
from fedleak.utils.seeding import child_seeds, seed_everything


def _dataset_options(config: dict, name: str) -> tuple[dict, dict, int]:
    spec = dict(config["datasets"][name])
    splits = spec.pop("splits")
    if name == "digits":
        return {"channels": spec["channels"], "size": spec["size"]}, splits, spec["split_seed"]
    if name == "natural":
        return {"count": spec["count"], "seed": spec["seed"], "channels": spec["channels"]}, \
            splits, spec["seed"]
    # mnist and the torchvision datasets: one source split, re-split train/public/test
    return {"root": spec["root"], "split": spec["split"], "download": spec["download"]}, \
        splits, spec["split_seed"]


def cmd_prepare_data(args, config: dict) -> None:
    options, splits, seed = _dataset_options(config, args.dataset)
    manifest = data.prepare(args.dataset, args.out, options, splits, seed)
    counts = {k: v["count"] for k, v in manifest["splits"].items()}
    print(f"prepared {args.dataset}: {counts} -> {args.out}", file=sys.stderr)


def cmd_train_evalnet(args, config: dict) -> None:
    spec = config["evalnet"]
    seed_everything(spec["seed"], config["threads"])
    target = data.load_prepared(args.target_data, "test")
    public = data.load_prepared(args.public_data, "train")
    images = data.datasets.to_channels(public.x, target.x.shape[1])
    if images.shape[-1] != target.x.shape[-1]:
        images = torch.nn.functional.interpolate(images, size=target.x.shape[-2:],
                                                 mode="bilinear", align_corners=False)
    net, losses = models.evalnet.train_evaluation_network(
        images, spec["epochs"], spec["batch_size"], spec["lr"], spec["seed"], spec["widths"])
    rows = models.evalnet.monotonicity(net, target.x, seed=spec["seed"])
    predictions = [r["prediction"] for r in rows]
    save_torch(args.out, net.state_dict())
    write_json(Path(args.out).with_suffix(".json"), {
        "dataset": args.dataset, "trained_on": spec["dataset"], "widths": spec["widths"],
        "input_shape": list(target.x.shape[1:]), "epoch_losses": losses, "monotonicity": rows,
        "monotonic": bool(np.all(np.diff(predictions) > 0)),
    })


def load_evalnet(path: Path) -> models.EvaluationNetwork:
    meta = read_json(Path(path).with_suffix(".json"))
    channels, size, _ = meta["input_shape"]
    net = models.EvaluationNetwork(channels, size, tuple(meta["widths"]))
    net.load_state_dict(load_torch(path))
    return net.eval()


def cmd_train_gan(args, config: dict) -> None:
    spec = config["gan"]
    seed_everything(spec["seed"], config["threads"])
    images = data.load_prepared(args.data, spec["split"]).x
    if images.shape[-1] != 32:  # the DCGAN generates 32x32; attacks resize to the model's input
        images = torch.nn.functional.interpolate(images, size=(32, 32), mode="bilinear",
                                                 align_corners=False).clamp(0, 1)
    generator, log = models.dcgan.train_dcgan(images, spec["epochs"], spec["batch_size"],
                                              spec["lr"], spec["latent_dim"], spec["width"],
                                              spec["seed"])
    save_torch(args.out, {"generator": generator.state_dict(), "latent_dim": spec["latent_dim"],
                          "width": spec["width"], "channels": images.shape[1]})
    with torch.no_grad():
        z = torch.randn(64, spec["latent_dim"], generator=torch.Generator().manual_seed(0))
        samples = (generator(z) + 1) / 2
    save_grid(samples, Path(args.out).with_suffix(".png"), nrow=8)
    write_json(Path(args.out).with_suffix(".json"), {"dataset": spec["dataset"],
                                                     "split": spec["split"], "log": log})


def cmd_train_giml(args, config: dict) -> None:
    """GIML's generator, meta-learned from client gradients of the undefended FL run."""
    from fedleak.attacks.giml import meta_learn_generator

    spec = config["giml"]
    case = cfg.find_case(config, args.case)
    seed_everything(spec["seed"], config["threads"])
    train = data.load_prepared(args.data, "train")
    model = _build_model(case, train)
    model.load_state_dict(load_torch(Path(args.fl_dir) / f"round{config['attack']['round']}.pt"))
    rng = np.random.default_rng(spec["seed"])
    chosen = rng.choice(len(train), spec["observations"] * spec["batch_size"], replace=False)
    observations = []
    for batch in np.sort(chosen).reshape(spec["observations"], spec["batch_size"]):
        idx = torch.from_numpy(batch)
        update = defenses.build("none")(defenses.DefenseContext(
            model=model, x=train.x[idx], y=train.y[idx], generator=torch.Generator()))
        observations.append(attacks.Observation(model=model, gradient=update,
                                                batch_size=len(idx)))
    generator = models.Generator(spec["latent_dim"], train.x.shape[1], spec["width"])
    torch.manual_seed(spec["seed"])
    generator.apply(models.dcgan.init_weights)
    keys = ("outer_steps", "tasks_per_step", "latent_iterations", "parameter_iterations",
            "lr_z", "lr_w", "meta_optimizer", "meta_lr", "tv", "z_norm", "seed")
    meta, log = meta_learn_generator(observations, generator, **{k: spec[k] for k in keys})
    save_torch(args.out, {"generator": meta.state_dict(), "latent_dim": spec["latent_dim"],
                          "width": spec["width"], "channels": train.x.shape[1]})
    with torch.no_grad():
        z = torch.randn(64, spec["latent_dim"], generator=torch.Generator().manual_seed(0))
        save_grid((meta(z) + 1) / 2, Path(args.out).with_suffix(".png"), nrow=8)
    write_json(Path(args.out).with_suffix(".json"), {"case": args.case, "spec": spec,
                                                     "indices": sorted(chosen.tolist()),
                                                     "log": log})


def save_grid(images: torch.Tensor, path: Path, nrow: int) -> None:
    from PIL import Image
    from torchvision.utils import make_grid

    from fedleak.utils.io import atomic_path

    grid = make_grid(images.clamp(0, 1), nrow=nrow, padding=2, pad_value=1.0)
    array = (grid.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    with atomic_path(path) as tmp:
        Image.fromarray(array).save(tmp, format="PNG")


def _build_model(case: dict, prepared: data.ImageData) -> torch.nn.Module:
    options = {"uniform_init": case["uniform_init"]} if case["model"] == "lenet" else {}
    c, h, _ = prepared.x.shape[1:]
    return models.build(case["model"], c, prepared.num_classes, h, **options)


def build_defense(args, config: dict) -> defenses.Defense:
    """The configured defense at ``args.strength``; Refiner gets the evaluation network."""
    name, _ = cfg.split_label(args.defense)
    params = cfg.defense_params(config, args.defense)
    if name == "refiner":
        if not args.evalnet:
            raise ValueError("defense 'refiner' needs --evalnet (the trained evaluation network)")
        params["evalnet"] = load_evalnet(Path(args.evalnet))
    if name == "censor" and params.get("proposal") == "public":  # CENSOR §V-E proposals
        public = data.load_prepared(args.data, "public")
        params["public"] = (public.x, public.y)
    return defenses.build_at(name, args.strength, **params)


def cmd_fl_run(args, config: dict) -> None:
    case = cfg.find_case(config, args.case)
    seeds = child_seeds(args.seed, ["partition", "init", "rounds"])
    seed_everything(seeds["init"], config["threads"])
    defense = build_defense(args, config)
    train, test = data.load_prepared(args.data, "train"), data.load_prepared(args.data, "test")
    part = case["partition"]
    shards = data.partition(train.y.numpy(), part["kind"], part["clients"],
                            np.random.default_rng(seeds["partition"]), part.get("alpha"))
    model = _build_model(case, train)
    out_dir = Path(args.out_dir)
    attack_round = config["attack"]["round"]

    def checkpoint(r: int, m: torch.nn.Module) -> None:
        if r == attack_round:
            save_torch(out_dir / f"round{r}.pt", m.state_dict())

    start = time.perf_counter()
    history = run_federated(model, train, test, shards, defense, FLSettings(
        **{k: v for k, v in config["fl"].items() if k != "seeds"}), seeds["rounds"], checkpoint)
    save_torch(out_dir / "final.pt", model.state_dict())
    write_json(out_dir / "metrics.json", {
        "case": args.case, "defense": args.defense, "strength": float(args.strength),
        "seed": args.seed, "history": history, "final_accuracy": history[-1]["accuracy"],
        "client_sizes": [len(s) for s in shards], "wall_time": time.perf_counter() - start,
    })
    print(f"FL {args.case} {args.defense}={args.strength} seed {args.seed}: "
          f"accuracy {history[-1]['accuracy']:.4f}", file=sys.stderr)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch.cuda.is_available() is False")
    return torch.device(name)


def _attack_options(name: str, config: dict, args, model: torch.nn.Module) -> dict:
    """Config params of an attack plus the artifacts its constructor asks for."""
    import inspect

    params = cfg.attack_params(config, name)
    wanted = inspect.signature(attacks.base.registered(name)).parameters
    if name == "giml":
        if not args.giml_generator:
            raise ValueError("attack 'giml' needs --giml-generator (made by train-giml)")
        params["generator"] = models.dcgan.load_generator(args.giml_generator)
    elif "generator" in wanted:
        if not args.generator:
            raise ValueError(f"attack {name!r} needs --generator (the trained GAN prior)")
        params["generator"] = models.dcgan.load_generator(args.generator)
    if "defense" in wanted:  # EOT: the attacker samples the setting's (stochastic) defense
        params["defense"] = build_defense(args, config)
    if params.get("bn") == "proxy":  # GradInversion BN_proxy: statistics of the public split
        public = data.load_prepared(args.data, "public")
        params["bn_proxy"] = dataset_statistics(model, public.x.to(_device(model)))
    return params


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _victims(args, config: dict, model: torch.nn.Module, train: data.ImageData,
             defense: defenses.Defense, seeds: dict) -> tuple[list, list[torch.Tensor]]:
    """The observations (defended uploads) of ``attack.victims`` client batches, and the truths."""
    spec = config["attack"]
    device = next(model.parameters()).device
    rng = np.random.default_rng(seeds["victims"])
    chosen = rng.choice(len(train), spec["victims"] * spec["batch_size"], replace=False)
    observations, truths = [], []
    for v in range(spec["victims"]):
        idx = torch.from_numpy(np.sort(chosen[v * spec["batch_size"]:(v + 1) * spec["batch_size"]]))
        x, y = train.x[idx].to(device), train.y[idx].to(device)
        ctx = defenses.DefenseContext(model=model, x=x, y=y,
                                      generator=torch.Generator().manual_seed(seeds["defense"] + v))
        observations.append(attacks.Observation(
            model=model, gradient=defense(ctx), batch_size=len(idx),
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


def cmd_attack(args, config: dict) -> None:
    """Every attack in ``--attacks`` against the same defended uploads of one setting."""
    case = cfg.find_case(config, args.case)
    spec = config["attack"]
    seeds = child_seeds(args.seed, ["victims", "defense", "attack"])
    seed_everything(seeds["attack"], config["threads"])
    defense = build_defense(args, config)
    train = data.load_prepared(args.data, "train")
    model = _build_model(case, train)
    model.load_state_dict(load_torch(Path(args.fl_dir) / f"round{spec['round']}.pt"))
    model.to(resolve_device(config["device"]))
    options = {name: _attack_options(name, config, args, model) for name in args.attacks}
    evalnet = load_evalnet(Path(args.evalnet))
    observations, truths = _victims(args, config, model, train, defense, seeds)
    for name in tqdm(args.attacks, desc=f"attacks vs {args.defense}", leave=False):
        count = spec["victims_by_attack"].get(name, spec["victims"])
        attack = attacks.build(name, seed=seeds["attack"], **options[name])
        recs = attacks.reconstruct_all(attack, observations[:count])  # victim v: seed + v
        records, matched = zip(*(_victim_record(v, truth, rec, evalnet)
                                 for v, (truth, rec) in enumerate(zip(truths, recs))))
        out_dir = Path(args.out_dir) / name / f"seed{args.seed}"
        shown = min(spec["grid_victims"], count)
        truth_images = torch.cat([t[1] for t in truths[:shown]])
        save_grid(torch.cat([truth_images, torch.cat(matched[:shown])]), out_dir / "recon.png",
                  nrow=len(truth_images))
        params = cfg.attack_params(config, name)  # the configured values (no artifacts)
        write_json(out_dir / "metrics.json", {
            "case": args.case, "defense": args.defense, "strength": float(args.strength),
            "attack": name, "seed": args.seed, "round": spec["round"], "params": params,
            "victims": list(records), "lpips_unavailable": metrics.lpips_unavailable_reason(),
        })
        mean_psnr = float(np.mean([r["psnr"] for r in records]))
        print(f"{name} vs {args.defense}={args.strength}: mean PSNR {mean_psnr:.2f} dB",
              file=sys.stderr)


def cmd_aggregate(args, config: dict) -> None:
    from fedleak import report

    results = Path(args.results)
    wanted = paths.targets(config, results)
    evalnet_json = [p.with_suffix(".json") for p in wanted["evalnet"]]
    params = {name: cfg.defense_params(config, name) for name in config["defenses"]}
    tables = report.write_tables(wanted["fl"], wanted["attacks"], evalnet_json,
                                 results / "tables", config["ablations"], params)
    figures = report.write_figures(tables, wanted["attacks"], results / "figures")
    report.write_report(tables, figures, results / "report.md", title=config["title"])


def cmd_validate(args, config: dict) -> None:
    print(f"{args.config}: OK")


def cmd_list(args, config: dict | None) -> None:
    print("attacks: " + ", ".join(attacks.available()))
    knobs = (f"{d} ({defenses.knob(d) or '-'})" for d in defenses.available())
    print("defenses: " + ", ".join(knobs))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedleak", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, func, needs_config: bool = True, **arguments):
        p = sub.add_parser(name)
        if needs_config:
            p.add_argument("--config", required=True, help="YAML or JSON configuration")
        for flag, options in arguments.items():
            p.add_argument(f"--{flag.replace('_', '-')}", **{"required": True, **options})
        p.set_defaults(func=func, needs_config=needs_config)

    text = {"type": str}
    command("validate", cmd_validate)
    command("list", cmd_list, needs_config=False)
    command("prepare-data", cmd_prepare_data, dataset=text, out=text)
    command("train-evalnet", cmd_train_evalnet, dataset=text, public_data=text,
            target_data=text, out=text)
    command("train-gan", cmd_train_gan, data=text, out=text)
    setting = {"case": text, "defense": text, "strength": {"type": float}, "seed": {"type": int}}
    optional_evalnet = {"type": str, "required": False, "default": None,
                        "help": "trained evaluation network (needed by the refiner defense)"}
    command("fl-run", cmd_fl_run, data=text, evalnet=optional_evalnet, out_dir=text, **setting)
    command("train-giml", cmd_train_giml, case=text, data=text, fl_dir=text, out=text)
    command("attack", cmd_attack, attacks={"nargs": "+", "help": "attacks to run"}, data=text,
            fl_dir=text, evalnet=text, out_dir=text,
            generator={"type": str, "required": False, "default": None,
                       "help": "trained GAN prior (needed by GAN-based attacks)"},
            giml_generator={"type": str, "required": False, "default": None,
                            "help": "GIML's meta-learned generator (needed by giml)"}, **setting)
    command("aggregate", cmd_aggregate, results=text)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = cfg.load(args.config) if args.needs_config else None
        args.func(args, config)
    except (cfg.ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"fedleak {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
