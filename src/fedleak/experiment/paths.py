"""Where every artifact lives under the results folder (DESIGN §4), for the phases and
for the Snakemake rules alike (which pass wildcards such as ``"{case}"`` as arguments)."""

from __future__ import annotations

from pathlib import Path

from fedleak.types import Setting

Part = str | int | Setting


def data_dir(results: Path, dataset: str) -> Path:
    return Path(results) / "data" / dataset


def data_manifest(results: Path, dataset: str) -> Path:
    return data_dir(results, dataset) / "manifest.json"


def evalnet_file(results: Path, dataset: str) -> Path:
    return Path(results) / "evalnet" / f"{dataset}.pt"


def gan_file(results: Path, dataset: str) -> Path:
    return Path(results) / "gan" / f"{dataset}.pt"


def giml_file(results: Path, case: str) -> Path:
    return Path(results) / "giml" / f"{case}.pt"


def fl_dir(results: Path, case: str, setting: Part, seed: Part) -> Path:
    return Path(results) / "fl" / case / str(setting) / f"seed{seed}"


def fl_metrics(results: Path, case: str, setting: Part, seed: Part) -> Path:
    return fl_dir(results, case, setting, seed) / "metrics.json"


def checkpoint(results: Path, case: str, setting: Part, seed: Part, round_: Part) -> Path:
    return fl_dir(results, case, setting, seed) / f"round{round_}.pt"


def zoo_file(results: Path, case: str, seed: Part, round_: Part) -> Path:
    """RecUP-FL's model zoo of one case, trained on gradients of the undefended model of
    ``seed`` at ``round_`` (each seed initialises its own model)."""
    return Path(results) / "zoo" / case / f"seed{seed}" / f"round{round_}.pt"


def adversaries_file(results: Path, case: str, setting: Part, seed: Part, round_: Part
                     ) -> Path:
    """The attribute adversaries that learnt under the round-``round_`` model of ``setting``
    (``plan.adversary_setting``) and seed ``seed``."""
    return Path(results) / "adversaries" / case / str(setting) / f"seed{seed}" / \
        f"round{round_}.pt"


def attribute_metrics(results: Path, case: str, setting: Part, seed: Part) -> Path:
    """One setting's attribute-inference results (RecUP-FL §5.4), every round and adversary."""
    return Path(results) / "attribute" / case / str(setting) / f"seed{seed}" / "metrics.json"


def attack_dir(results: Path, case: str, setting: Part, seed: Part) -> Path:
    return Path(results) / "attacks" / case / str(setting) / f"seed{seed}"


def attack_metrics(results: Path, case: str, setting: Part, seed: Part) -> Path:
    return attack_dir(results, case, setting, seed) / "metrics.json"


def attack_details(results: Path, case: str, setting: Part, seed: Part) -> Path:
    """Per attack: recon_<attack>.png, and snapshots_<attack>.npy / traces_<attack>.json."""
    return attack_dir(results, case, setting, seed) / "details"


def target_dir(results: Path, name: str) -> Path:
    """A paper target's files: <name>.csv, <name>_vs_paper.csv, <name>.png, summary.json."""
    return Path(results) / "targets" / name


def table(results: Path, name: str) -> Path:
    return Path(results) / "tables" / f"{name}.csv"


def figure(results: Path, name: str) -> Path:
    return Path(results) / "figures" / f"{name}.png"


def report(results: Path) -> Path:
    return Path(results) / "report.md"


def log(results: Path, rule: str, *parts: Part) -> Path:
    return Path(results) / "logs" / rule / ("/".join(str(p) for p in parts) + ".log")


def benchmark(results: Path, rule: str, *parts: Part) -> Path:
    return Path(results) / "benchmarks" / rule / ("/".join(str(p) for p in parts) + ".tsv")
