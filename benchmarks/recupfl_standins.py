"""Which shape measure of the digits' attribute stand-ins RecUP-FL's adversaries infer from
undefended uploads (issue 71, S2; docs/measurements.md m97).

Per case of ``--config`` at its reduced scale (every attribute dataset the ``digits``
stand-in, at its paper shape, with its case's model), at round 0: the model as the FL run
initialises it (``fl_run``'s ``init`` seed), the adversaries' D_train (``d_train``) and
clean features (``train_features``), and D_test's one-sample uploads as the attribute phase
makes them (``phases.attribute.upload_features``, no defense, its seeds). Each of the five
shape measures (``digit_attributes.MEASURES``) in turn stands in for every attribute of the
dataset (``attributes.STAND_IN_MEASURES`` patched while the splits are prepared), binned
within each digit into that attribute's class count k; the uploads are the same for all
five, only the labels change. Each adversary learns each (attribute, measure) from D_train
and is scored on D_test: ASR with Wilson's 95 % interval, against chance (D_test's majority
share, as the attribute phase's ``chance``). Over several ``--seeds`` (each its own
model, D_test and adversaries, as the FL seeds give them) the printed ASR pools the hits.

    python benchmarks/recupfl_standins.py [--config config/paper/recupfl.yaml] [--seeds 0 1 2]
        [--datasets lfw audiomnist adult celeba] [--adversaries stru_nn rf]
        [--train-samples N] [--test-samples N] [--out FILE.csv]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from gradleak import adversaries, data
from gradleak.config import read
from gradleak.data import attributes
from gradleak.data.attribute_counts import CLASSES
from gradleak.data.digit_attributes import MEASURES
from gradleak.experiment import configuration, plan
from gradleak.experiment.attribute_samples import d_train, seeds, train_features, with_attributes
from gradleak.experiment.job import Job, build_model
from gradleak.experiment.phases.attribute import upload_features
from gradleak.experiment.phases.prepare_data import loader_options
from gradleak.report.intervals import pooled_rate, rate
from gradleak.utils.seeding import child_seeds, seed_everything


def reduced(path: Path, train_samples: int | None, test_samples: int | None) -> dict:
    """The configuration at its reduced scale, with the sample counts given."""
    config = read(path)
    config["scale"] = "reduced"
    config = configuration.validate(config)
    for key, count in (("train_samples", train_samples), ("test_samples", test_samples)):
        if count is not None:
            config["attribute"][key] = count
    return config


def splits_with(config: dict, dataset: str, measure: str, folder: Path
                ) -> tuple[data.ImageData, data.ImageData]:
    """(D_train, the train split) of ``dataset`` prepared in ``folder`` with ``measure``
    standing in for every one of its attributes."""
    options, splits, split_seed = loader_options(config, dataset)
    every = {a: measure for a in CLASSES[dataset]}
    with mock.patch.dict(attributes.STAND_IN_MEASURES, {dataset: every}):
        data.prepare(dataset, folder, options, splits, split_seed)
    return d_train(config, folder), data.load_prepared(folder, "train")


def measure_case(config: dict, case: str, seed: int, names: list[str], folder: Path,
                 progress: tqdm) -> list[dict]:
    """One row per (attribute, measure, adversary) of ``case`` at round 0, undefended."""
    job = Job(config, folder, case, plan.NONE, seed, zoo_round=0)
    spec, own, attributes_ = config["attribute"], seeds(seed), plan.attributes(config, case)
    prepared = {m: splits_with(config, job.dataset, m, folder / m) for m in MEASURES}
    public, train = prepared[MEASURES[0]]
    seed_everything(child_seeds(seed, ["partition", "init", "rounds"])["init"],
                    config["threads"])  # fl_run's: the round-0 checkpoint's weights
    model = build_model(job.spec, train)
    seed_everything(own["adversary"], config["threads"])  # as an attribute job starts
    count = min(spec["test_samples"] * spec["batch_size"], len(train))
    chosen = torch.from_numpy(np.random.default_rng(own["samples"]).choice(
        len(train), count, replace=False))
    train_x, _ = train_features(model, with_attributes(public, attributes_), spec)
    test_x, _, _ = upload_features(job, model,
                                   with_attributes(train.subset(chosen), attributes_), 0,
                                   own["defense"])
    rows = []
    for measure, (public_m, train_m) in prepared.items():
        if not (torch.equal(public_m.x, public.x) and torch.equal(train_m.x, train.x)):
            raise RuntimeError(f"{case}: the splits differ between measures")
        test_labels = train_m.subset(chosen).attributes
        for attribute in attributes_:
            truth = test_labels[attribute].numpy()
            chance = float(np.bincount(truth).max() / len(truth))
            for name in names:
                adversary = adversaries.build(name, seed=own["adversary"])
                adversary.fit(train_x, public_m.attributes[attribute])
                asr = rate((adversary.predict(test_x) == truth).astype(float))
                rows.append({"dataset": job.dataset, "attribute": attribute,
                             "k": CLASSES[job.dataset][attribute], "measure": measure,
                             "current": attributes.STAND_IN_MEASURES[job.dataset][attribute]
                             == measure, "adversary": name, "asr": asr.estimate,
                             "low": asr.low, "high": asr.high, "chance": chance,
                             "seed": seed, "train": len(train_x), "uploads": len(test_x)})
                progress.update()
    return rows


def pooled(rows: list[dict]) -> pd.DataFrame:
    """Per (dataset, attribute, measure): each adversary's ASR pooled over the seeds (Wilson's
    interval on the pooled hits) and the mean chance; ``*`` marks today's measure."""
    table = pd.DataFrame(rows)
    keys = ["dataset", "attribute", "k", "measure", "current"]
    out = []
    for key, group in table.groupby(keys + ["adversary"], sort=False):
        asr = pooled_rate(group.asr, group.uploads)
        out.append({**dict(zip(keys + ["adversary"], key)), "chance": group.chance.mean(),
                    "asr": f"{asr.estimate:.3f} [{asr.low:.3f}, {asr.high:.3f}]"})
    wide = pd.DataFrame(out)
    wide["measure"] = wide.measure.where(~wide.current, wide.measure + "*")
    return wide.pivot_table(index=["dataset", "attribute", "k", "measure", "chance"],
                            columns="adversary", values="asr", aggfunc="first",
                            sort=False).reset_index()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=Path("config/paper/recupfl.yaml"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0],
                        help="FL seeds (each its own model, D_test and adversaries)")
    parser.add_argument("--datasets", nargs="+", default=["lfw", "audiomnist", "adult", "celeba"])
    parser.add_argument("--adversaries", nargs="+", default=["stru_nn", "rf"])
    parser.add_argument("--train-samples", type=int, help="D_train (default: the config's)")
    parser.add_argument("--test-samples", type=int, help="D_test uploads (default: the config's)")
    parser.add_argument("--out", type=Path, help="write the rows (one per seed) to this CSV")
    args = parser.parse_args()
    config = reduced(args.config, args.train_samples, args.test_samples)
    cases = [c for c in plan.case_names(config)
             if plan.find_case(config, c)["dataset"] in args.datasets]
    fits = sum(len(plan.attributes(config, c)) for c in cases) * len(MEASURES) \
        * len(args.adversaries) * len(args.seeds)
    rows = []
    with tempfile.TemporaryDirectory() as folder, tqdm(total=fits, unit="fit") as progress:
        for seed in args.seeds:
            for case in cases:
                rows += measure_case(config, case, seed, args.adversaries,
                                     Path(folder) / f"{case}-{seed}", progress)
    if args.out:
        pd.DataFrame(rows).to_csv(args.out, index=False)
    with pd.option_context("display.width", 200, "display.max_rows", None):
        print(pooled(rows).to_string(index=False, float_format="{:.3f}".format))
    print(f"seeds {args.seeds} pooled; * the measure that stands in for the attribute today")


if __name__ == "__main__":
    main()
