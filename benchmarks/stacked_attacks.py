"""Seconds per attack of victims x restarts stacked against the per-victim loop, for the
attacks with hooks beyond a plain distance: GradInversion (Yin et al., CVPR 2021: R_BN,
group consistency), GIAS +BN and GI-z/w's per-image generator copies (Jeon et al.,
NeurIPS 2021), GIFD's chained stages (Fang et al., ICCV 2023), DLG/iDLG's L-BFGS
problems in lockstep (Zhu et al., NeurIPS 2019; Zhao et al., 2020) and EOT's defense
samples per problem (CENSOR §V-D): ``eot`` wraps Inverting Gradients under 2 DP-Gaussian
samples (the embedded default), ``eot-gifd`` wraps GIFD under 4 CENSOR samples.

``stacked`` and ``loop`` are ``attacks.reconstruct_all`` with ``engine="stacked"`` (what it
runs where the problems stack) and ``engine="loop"`` (victim by victim, each problem's
trial gradient by autograd on the model, as it runs otherwise). Both give the same
reconstructions up to rounding (tests/test_vectorised.py and the attacks' own tests).
Victims: random 3x32x32 images with distinct labels on a train-mode model; BatchNorm models
match the client's exact statistics (GradInversion ``bn: exact``, GIAS ``x+BN`` and
``z/w+BN``). The generator
(GI-z/w, GIFD) is an untrained DCGAN: the cost, not the result, is measured. Timed in an
order alternated each repeat after one warm-up of each; medians with min and max.

    python benchmarks/stacked_attacks.py --threads 2 [--attacks gradinversion gias gias-zw gifd
        dlg idlg eot eot-gifd]
        [--models lenet resnet10-16 resnet10-32 resnet18] [--victims 2] [--restarts 4]
        [--iterations 20] [--repeats 3] [--device cpu|cuda] [--out FILE.csv]
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import pandas as pd
import torch
from cmaes_population import model_named
from timing import alternating

from gradleak import attacks, defenses
from gradleak.attacks.bn_statistics import batch_statistics, batchnorm_layers
from gradleak.models.dcgan import Generator
from gradleak.types import Update

ATTACKS = ["gradinversion", "gias", "gias-zw", "gifd", "dlg", "idlg", "eot", "eot-gifd"]


def observations(model: torch.nn.Module, victims: int) -> list[attacks.Observation]:
    """One single-image update per victim, with its batch's BN statistics."""
    rng, device = torch.Generator().manual_seed(1), next(model.parameters()).device
    out = []
    for v in range(victims):
        x = torch.rand(1, 3, 32, 32, generator=rng).to(device)
        y = torch.tensor([v % 10], device=device)
        out.append(attacks.Observation(
            model=model, gradient=Update.of(model, x, y).detached(), batch_size=1, labels=y,
            bn_statistics=batch_statistics(model, x) if batchnorm_layers(model) else None))
    return out


def parameters(attack: str, model: torch.nn.Module, iterations: int, restarts: int
               ) -> tuple[str, dict]:
    """The registered attack and its settings at ``iterations`` steps (GIFD: split over its
    stages; GI-z/w: half latent, half parameter search)."""
    has_bn = bool(batchnorm_layers(model))
    generator = Generator(100, 3, 32).eval()
    if attack == "gradinversion":
        return attack, {"iterations": iterations, "lr": 0.1, "bn": "exact" if has_bn else "none",
                        "restarts": restarts, "group_start": iterations // 2,
                        "group_every": max(1, iterations // 4)}
    if attack == "gias":
        return attack, {"variant": "x+BN" if has_bn else "x", "image_iterations": iterations,
                        "restarts": restarts, "bn": 1e-4}
    if attack == "gias-zw":
        half = max(1, iterations // 2)
        return "gias", {"variant": "z/w+BN" if has_bn else "z/w", "generator": generator,
                        "latent_iterations": half, "parameter_iterations": half,
                        "restarts": restarts, "bn": 1e-4}
    if attack in ("dlg", "idlg"):  # an L-BFGS step evaluates the objective up to 20 times
        return attack, {"iterations": max(1, iterations // 10), "restarts": restarts}
    stage = max(1, iterations // 4)
    gifd = {"generator": generator, "steps": (2 * stage, stage, stage), "restarts": restarts}
    if attack == "eot":
        return attack, {"wraps": "inverting_gradients", "samples": 2,
                        "defense": defenses.build("dp_gaussian", sigma=0.01),
                        "wraps_params": {"iterations": iterations, "restarts": restarts}}
    if attack == "eot-gifd":
        return "eot", {"wraps": "gifd", "samples": 4, "defense": defenses.build("censor"),
                       "generator": generator,
                       "wraps_params": {k: v for k, v in gifd.items() if k != "generator"}}
    return attack, gifd


def run(path: str, attack: str, params: dict, observed: list[attacks.Observation]) -> None:
    """The victims attacked ``stacked`` or in a ``loop`` (until CUDA has finished)."""
    attacks.reconstruct_all(attacks.build(attack, **params), observed, engine=path)
    if observed[0].device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attacks", nargs="+",
                        default=ATTACKS, choices=ATTACKS)
    parser.add_argument("--models", nargs="+",
                        default=["lenet", "resnet10-16", "resnet10-32", "resnet18"])
    parser.add_argument("--victims", type=int, default=2)
    parser.add_argument("--restarts", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/stacked_attacks.csv"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for name in args.models:
        torch.manual_seed(0)
        model = model_named(name).train().to(args.device)
        observed = observations(model, args.victims)
        for attack in args.attacks:
            registered, params = parameters(attack, model, args.iterations, args.restarts)
            row = {"attack": attack, "model": name, "device": args.device,
                   "parameters": sum(p.numel() for p in model.parameters()),
                   "victims": args.victims, "restarts": args.restarts,
                   "iterations": args.iterations, "threads": args.threads,
                   "repeats": args.repeats}
            row.update(alternating({path: partial(run, path, registered, params, observed)
                                    for path in ("stacked", "loop")}, args.repeats))
            rows.append(row)
            print(f"{attack:14} {name:12} stacked {row['stacked_seconds']:.2f}s  loop "
                  f"{row['loop_seconds']:.2f}s  stacked/loop speed {row['stacked_speedup']:.2f}x",
                  flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(args.out, index=False, float_format="%.6g", lineterminator="\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
