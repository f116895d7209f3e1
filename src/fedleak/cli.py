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
from fedleak.fl.server import FLSettings, run_federated
from fedleak.utils.io import load_torch, read_json, save_torch, write_json
from fedleak.utils.seeding import child_seeds, seed_everything


def _dataset_options(config: dict, name: str) -> tuple[dict, dict, int]:
    spec = dict(config["datasets"][name])
    splits = spec.pop("splits")
    if name == "digits":
        return {"channels": spec["channels"]}, splits, spec["split_seed"]
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
    params = cfg.defense_params(config, args.defense)
    if args.defense == "refiner":
        if not args.evalnet:
            raise ValueError("defense 'refiner' needs --evalnet (the trained evaluation network)")
        params["evalnet"] = load_evalnet(Path(args.evalnet))
    return defenses.build_at(args.defense, args.strength, **params)


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


def cmd_attack(args, config: dict) -> None:
    case = cfg.find_case(config, args.case)
    spec = config["attack"]
    seeds = child_seeds(args.seed, ["victims", "defense", "attack"])
    seed_everything(seeds["attack"], config["threads"])
    defense = build_defense(args, config)
    params = cfg.attack_params(config, args.attack)
    train = data.load_prepared(args.data, "train")
    model = _build_model(case, train)
    model.load_state_dict(load_torch(Path(args.fl_dir) / f"round{spec['round']}.pt"))
    device = resolve_device(config["device"])
    model.to(device)
    evalnet = load_evalnet(Path(args.evalnet))
    rng = np.random.default_rng(seeds["victims"])
    chosen = rng.choice(len(train), spec["victims"] * spec["batch_size"], replace=False)
    victims, truths, recons = [], [], []
    for v in tqdm(range(spec["victims"]), desc=f"{args.attack} vs {args.defense}", leave=False):
        idx = torch.from_numpy(np.sort(chosen[v * spec["batch_size"]:(v + 1) * spec["batch_size"]]))
        x, y = train.x[idx].to(device), train.y[idx].to(device)
        ctx = defenses.DefenseContext(model=model, x=x, y=y,
                                      generator=torch.Generator().manual_seed(seeds["defense"] + v))
        observed = defense(ctx)
        obs = attacks.Observation(model=model, gradient=observed, batch_size=len(idx),
                                  labels=y if spec["known_labels"] else None)
        rec = attacks.build(args.attack, seed=seeds["attack"] + v, **params)(obs)
        x, y = x.cpu(), y.cpu()
        matched = metrics.match(rec.images, x)
        truths.append(x)
        recons.append(matched)
        victims.append({
            "victim": v, "indices": idx.tolist(),
            "label": y.tolist()[0] if len(y) == 1 else y.tolist(),
            "predicted_label": rec.labels.tolist()[0] if len(y) == 1 else rec.labels.tolist(),
            "psnr": metrics.psnr(matched, x), "ssim": metrics.ssim(matched, x),
            "mse": metrics.mse(matched, x), "lpips": metrics.lpips(matched, x),
            "noise_ratio": metrics.noise_ratio(matched, evalnet),
            "iterations": rec.iterations, "stop_reason": rec.stop_reason,
            "final_loss": rec.loss_trace[-1] if rec.loss_trace else None,
            "wall_time": rec.wall_time,
        })
    out_dir = Path(args.out_dir)
    shown = spec["grid_victims"] * spec["batch_size"]
    truth, recon = torch.cat(truths)[:shown], torch.cat(recons)[:shown]
    save_grid(torch.cat([truth, recon]), out_dir / "recon.png", nrow=len(truth))
    write_json(out_dir / "metrics.json", {
        "case": args.case, "defense": args.defense, "strength": float(args.strength),
        "attack": args.attack, "seed": args.seed, "round": spec["round"], "params": params,
        "victims": victims, "lpips_unavailable": metrics.lpips_unavailable_reason(),
    })
    mean_psnr = float(np.mean([v["psnr"] for v in victims]))
    print(f"{args.attack} vs {args.defense}={args.strength}: mean PSNR {mean_psnr:.2f} dB",
          file=sys.stderr)


def cmd_aggregate(args, config: dict) -> None:
    from fedleak import report

    results = Path(args.results)
    wanted = paths.targets(config, results)
    evalnet_json = [p.with_suffix(".json") for p in wanted["evalnet"]]
    tables = report.write_tables(wanted["fl"], wanted["attacks"], evalnet_json,
                                 results / "tables")
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
    command("attack", cmd_attack, attack=text, data=text, fl_dir=text, evalnet=text,
            out_dir=text, **setting)
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
