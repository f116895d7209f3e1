"""A paper's table or figure (a configuration's ``targets:`` entry) from the runs it selects:
a tidy CSV, the paper's numbers beside ours, and a figure shaped like the paper's.

The data a target reads and its table: ``target_data``; its figures: ``target_curves``
and ``target_victims``."""


from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")


import pandas as pd  # noqa: E402

from gradleak.config import figure_specs  # noqa: E402
from gradleak.report.claims import measure_all  # noqa: E402
from gradleak.report.figures import save_figure  # noqa: E402
from gradleak.report.reference import compare  # noqa: E402
from gradleak.report.tables import write_csv  # noqa: E402
from gradleak.report.target_curves import (
    attribute_figure,
    history_figure,
    layers_figure,
    line_figure,
    tradeoff_figure,
)
from gradleak.report.target_data import (
    TargetInputs,
    TargetResult,
    build_table,
    select_rows,
    source_of,
)
from gradleak.report.target_victims import (
    images_figure,
    recon_figure,
    snapshots_figure,
    trace_figure,
)
from gradleak.utils.io import read_json, write_json  # noqa: E402


def _privacy_grid(*args):
    """Refiner Fig. 8's grid (``report.privacy_grid``): it measures images with torch, which
    no other figure kind imports."""
    from gradleak.report.privacy_grid import privacy_grid_figure

    return privacy_grid_figure(*args)


FIGURES = {"line": line_figure, "tradeoff": tradeoff_figure, "history": history_figure,
           "trace": trace_figure, "snapshots": snapshots_figure, "recon": recon_figure,
           "attribute": attribute_figure, "layers": layers_figure, "images": images_figure,
           "privacy_grid": _privacy_grid}


def write_target(name: str, spec: dict, inputs: TargetInputs, reference: dict | None,
                 out_dir: Path, claims: list[dict] | None = None) -> TargetResult:
    """``<name>.csv`` (the table), ``<name>_vs_paper.csv`` (with a reference),
    ``<name>_claims.csv`` (the ``claims`` and regime entries on it, measured),
    ``<name>.png`` (the figure) and
    ``summary.json`` under ``out_dir``."""
    out_dir = Path(out_dir)
    files, table, comparison, agreement, judged = [], None, None, {}, None
    inputs = select_rows(inputs, spec.get("where"))
    if "table" in spec:
        table = build_table(spec["table"], inputs)
        files.append(write_csv(table, out_dir / f"{name}.csv"))
        if reference:
            keys = [*spec["table"]["rows"], *spec["table"].get("columns", [])]
            comparison, agreement = compare(table, keys, reference)
            files.append(write_csv(comparison, out_dir / f"{name}_vs_paper.csv"))
        if claims:
            judged = measure_all(claims, spec["table"], table,
                                 source_of(inputs, spec["table"]["metrics"]),
                                 study=not inputs.study.empty, fl=inputs.fl)
            files.append(write_csv(judged, out_dir / f"{name}_claims.csv"))
    for panel, figure_spec in figure_specs(spec):
        figure = FIGURES[figure_spec["kind"]](
            figure_spec, select_rows(inputs, figure_spec.get("where")),
            figure_spec.get("title", spec["title"]), reference)
        files.append(save_figure(figure, out_dir / f"{name}{panel}.png"))
    write_json(out_dir / "summary.json", {"name": name, "title": spec["title"],
                                          "agreement": agreement,
                                          "files": [f.name for f in files]})
    return TargetResult(name, spec["title"], table, comparison, agreement, files, judged)


def load_target(out_dir: Path) -> TargetResult:
    """The result :func:`write_target` left in ``out_dir``."""
    out_dir = Path(out_dir)
    summary = read_json(out_dir / "summary.json")
    files = [out_dir / f for f in summary["files"]]

    def table(suffix: str) -> pd.DataFrame | None:
        path = out_dir / f"{summary['name']}{suffix}"
        return pd.read_csv(path) if path in files else None

    return TargetResult(summary["name"], summary["title"], table(".csv"),
                        table("_vs_paper.csv"), summary["agreement"], files,
                        table("_claims.csv"))
