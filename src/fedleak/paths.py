"""Artifact paths under ``results/`` (DESIGN §4), shared by the Snakefile and the CLI."""

from __future__ import annotations

from pathlib import Path

from fedleak.config import ablation_settings, case_name, defense_settings


def data_dir(results: Path, dataset: str) -> Path:
    return results / "data" / dataset


def evalnet_file(results: Path, dataset: str) -> Path:
    return results / "evalnet" / f"{dataset}.pt"


def gan_file(results: Path, dataset: str) -> Path:
    return results / "gan" / f"{dataset}.pt"


def fl_dir(results: Path, case: str, defense: str, strength: str, seed: int) -> Path:
    return results / "fl" / case / defense / strength / f"seed{seed}"


def attack_dir(results: Path, case: str, defense: str, strength: str, attack: str,
               seed: int) -> Path:
    return results / "attacks" / case / defense / strength / attack / f"seed{seed}"


def targets(config: dict, results: str | Path = "results") -> dict[str, list[Path]]:
    """Every artifact the configuration asks for, grouped by pipeline phase."""
    results = Path(results)
    cases = config["cases"]
    datasets = sorted({c["dataset"] for c in cases})
    prepared = sorted({*datasets, config["evalnet"]["dataset"], config["gan"]["dataset"]})
    attack_names = sorted(config["attacks"])
    settings = [*defense_settings(config), *ablation_settings(config)]
    out: dict[str, list[Path]] = {
        "data": [data_dir(results, d) / "manifest.json" for d in prepared],
        "evalnet": [evalnet_file(results, d) for d in datasets],
        "gan": [gan_file(results, config["gan"]["dataset"])],
        "fl": [], "attacks": [],
    }
    for case in map(case_name, cases):
        for defense, strength in settings:
            out["fl"] += [fl_dir(results, case, defense, strength, s) / "metrics.json"
                          for s in config["fl"]["seeds"]]
            out["attacks"] += [attack_dir(results, case, defense, strength, a, s) / "metrics.json"
                               for a in attack_names for s in config["attack"]["seeds"]]
    out["report"] = [results / "report.md"]
    return out
