"""Where every artifact lives under the results folder, for the phases and
for the Snakemake rules alike (which pass wildcards such as ``"{case}"`` as arguments)."""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from gradleak.settings import Setting

Part = str | int | Setting
# the folders the functions below write into, and the one file at the top
FOLDERS = ("data", "evalnet", "gan", "giml", "fl", "zoo", "adversaries", "attribute",
           "attacks", "targets", "tables", "figures", "logs", "benchmarks", "partial")
RESOLVED_CONFIG = "config.resolved.json"
PARTIAL = "partial"  # what killed jobs finished (experiment.resume)


def _kind(path: Path) -> str:
    if path.is_symlink() and not path.exists():
        return f"a broken link to {os.readlink(path)}"
    return "a link to a file" if path.is_symlink() else "a file"


def results_problem(results: Path) -> str | None:
    """What keeps a run from writing into ``results`` (a file or broken link where a folder
    belongs, a folder where the resolved configuration file belongs, a folder at any depth
    this user cannot write), as one line naming the path and what to do; None when it is
    usable."""
    results = Path(results)
    if (results.is_symlink() or results.exists()) and not results.is_dir():
        return (f"{results} is {_kind(results)}, not a folder: the run writes every result "
                f"there; move it away (or delete it) and run again")
    for name in FOLDERS:
        folder = results / name
        if (folder.is_symlink() or folder.exists()) and not folder.is_dir():
            return (f"{folder} is {_kind(folder)}, not a folder: the run writes its {name} "
                    f"results there; move it away (or delete it) and run again")
    if (results / RESOLVED_CONFIG).is_dir():
        return (f"{results / RESOLVED_CONFIG} is a folder, not the resolved configuration "
                f"file the run writes there; move it away (or delete it) and run again")
    for folder, _, _ in os.walk(results):  # results itself first, then every folder a job
        if not os.access(folder, os.W_OK | os.X_OK):  # may write in
            info = os.stat(folder)
            try:
                owner = pwd.getpwuid(info.st_uid).pw_name
            except KeyError:
                owner = f"uid {info.st_uid}"
            return (f"cannot write in {Path(folder).resolve()} (owner {owner}, mode "
                    f"{stat.filemode(info.st_mode)}): make it writable for you (chmod u+w, or "
                    f"ask its owner), or run in a copy of the project")
    return None


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


def partial_dir(results: Path, phase: str, parts: list[str]) -> Path:
    """Where one job of ``phase`` (its path ``parts``) keeps its finished pieces."""
    return Path(results) / PARTIAL / phase / Path(*parts)


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


def study_dir(results: Path, name: str) -> Path:
    """A study target's measurement: metrics.json (its rows) and arrays.npz (its images)."""
    return Path(results) / "studies" / name


def table(results: Path, name: str) -> Path:
    return Path(results) / "tables" / f"{name}.csv"


def figure(results: Path, name: str) -> Path:
    return Path(results) / "figures" / f"{name}.png"


def report(results: Path) -> Path:
    return Path(results) / "report.md"


def claims(results: Path) -> Path:
    """Every claim of the configuration, judged (report.verdicts)."""
    return Path(results) / "claims.csv"


def regime(results: Path) -> Path:
    """The regime's entries beside what the run measured (report.verdicts)."""
    return Path(results) / "regime.csv"


def log(results: Path, rule: str, *parts: Part) -> Path:
    return Path(results) / "logs" / rule / ("/".join(str(p) for p in parts) + ".log")


def benchmark(results: Path, rule: str, *parts: Part) -> Path:
    return Path(results) / "benchmarks" / rule / ("/".join(str(p) for p in parts) + ".tsv")
