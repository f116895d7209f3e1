"""``fedleak compare``: every target's numbers beside the paper's, as text, after a run."""

from __future__ import annotations

from pathlib import Path

from fedleak.experiment import plan
from fedleak.experiment.gather import target_inputs
from fedleak.report.reference import compare as beside
from fedleak.report.targets import build_table, select_rows


def compare(config: dict, results: Path) -> str:
    """Every target's numbers beside the paper's, as text (``fedleak compare``)."""
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
