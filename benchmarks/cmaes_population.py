"""Seconds per CMA-ES round of GGL (Li et al., CVPR 2022): the population scored as one
stacked batch against one candidate at a time, per model.

One round of GGA's CMA-ES (``gradleak.attacks.gga``) scores ``--population`` latent
candidates: each is rendered by the generator, and its trial gradient (formed, then
transformed by the adaptive T) is compared with the received one. ``stacked`` runs the
candidates through ``attacks.stacked_gradients.StackedModel`` in chunks; ``loop`` computes
each candidate's gradient in turn (``torch.autograd.grad``), as gradleak does for models where
stacking does not pay (``victims.Victims.scorer``, stacked or not). Both give the same
losses up to rounding (tests/test_gga.py). Timed:
the scoring of one population (the generator's rendering, shared by both, included) on a
3x32x32 victim, in an order alternated each repeat after one warm-up of each; medians with
min and max. The crossover sets ``stacked_gradients.FORMED_PARAMETERS``.

    python benchmarks/cmaes_population.py --threads 2 [--models lenet resnet10-16 resnet10-32
        resnet10-64 resnet18] [--transform none] [--population 50] [--repeats 5]
        [--out FILE.csv]
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import pandas as pd
import torch
from timing import alternating

from gradleak import attacks, defenses, models
from gradleak.attacks.victims import Victims
from gradleak.models import ResNet
from gradleak.models.dcgan import Generator

DEFENSE_OF = {"none": ("none", {}), "pruning": ("pruning", {"ratio": 0.2}),
              "clipping": ("clipping", {"bound": 4.0}), "soteria": ("soteria", {"ratio": 0.1})}


def model_named(name: str) -> torch.nn.Module:
    """A registered model, or ``resnet10-W``: ResNet-10 of width W (3x32x32, 10 classes)."""
    if name.startswith("resnet10-"):
        return ResNet(10, 3, 10, 32, width=int(name.split("-")[1]))
    return models.build(name, 3, 10, 32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+",
                        default=["lenet", "resnet10-16", "resnet10-32", "resnet10-64", "resnet18"])
    parser.add_argument("--transform", choices=sorted(DEFENSE_OF), default="none")
    parser.add_argument("--population", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/cmaes_population.csv"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = Generator(100, 3, 32).eval()
    rows = []
    for name in args.models:
        torch.manual_seed(0)
        model = model_named(name).train()
        x, y = torch.rand(1, 3, 32, 32), torch.tensor([3])
        defense, params = DEFENSE_OF[args.transform]
        received = defenses.build(defense, **params)(defenses.DefenseContext(model=model, x=x, y=y))
        obs = attacks.Observation(model=model, gradient=received, batch_size=1)
        attack = attacks.build("gga", generator=generator, transform=args.transform)
        z = torch.randn(args.population, 1, 100, generator=torch.Generator().manual_seed(0))
        scorers = {}
        for path in ("stacked", "loop"):
            victims = Victims([obs], restarts=1, seed=0, stacked=path == "stacked")
            scorers[path] = victims.scorer(attack.stage(victims), 0, 0)
        row = {"model": name, "parameters": sum(p.numel() for p in model.parameters()),
               "transform": args.transform, "population": args.population,
               "threads": args.threads, "repeats": args.repeats}
        row.update(alternating({path: partial(score, [z]) for path, score in scorers.items()},
                               args.repeats))
        rows.append(row)
        print(f"{name:12} {row['parameters'] / 1e6:6.2f}M  stacked {row['stacked_seconds']:.3f}s"
              f"  loop {row['loop_seconds']:.3f}s  stacked/loop speed "
              f"{row['stacked_speedup']:.2f}x", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(args.out, index=False, float_format="%.6g", lineterminator="\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
