"""A paper's table or figure (a configuration's ``targets:`` entry) from the runs it selects:
a tidy CSV, the paper's numbers beside ours, and a figure shaped like the paper's.

The experiment layer gathers the runs into :class:`TargetInputs`; every frame carries the
key columns ``case, dataset, model, defense, strength, series, seed`` (and ``attack``
where an attack ran; ``adversary, attribute, round`` in the attribute frame) plus one column per
swept configuration path, under its full dotted name and its last component
(``attacks.hybrid.stopper.threshold`` and ``threshold``). A target's ``where`` keeps only
the rows whose columns hold the listed values (:func:`select_rows`).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")


import matplotlib.image as mpimg  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from gradleak.config import figure_specs  # noqa: E402
from gradleak.report.attribute import attribute_tradeoff  # noqa: E402
from gradleak.report.claims import measure_all  # noqa: E402
from gradleak.report.figures import save_figure  # noqa: E402
from gradleak.report.privacy_grid import privacy_grid_figure  # noqa: E402
from gradleak.report.reference import compare, paper_values  # noqa: E402
from gradleak.report.style import (  # noqa: E402
    case_text,
    finish,
    label_points,
    log_axis,
    log_if_spread,
    series_styles,
)
from gradleak.report.tables import SUCCESS_SSIM, write_csv  # noqa: E402
from gradleak.utils.io import load_npy, read_json, write_json  # noqa: E402
from gradleak.utils.keys import same  # noqa: E402
from gradleak.utils.metric_kinds import ATTRIBUTE_METRICS, FL_METRICS  # noqa: E402

# RecUP-FL's attribute jobs: the adversary's accuracy, the majority class's share and the
# FL run's final test loss, one row per (point, seed, adversary, attribute, round)
STATISTICS = {"mean": "mean", "max": "max", "min": "min", "sum": "sum", "median": "median",
              "sd": lambda v: v.std(ddof=0)}
LABELS = {"asr": "ASR (SSIM > 0.9)", "psnr": "PSNR (dB)", "ssim": "SSIM", "mse": "MSE",
          "lpips": "LPIPS", "stlpips": "ST-LPIPS", "noise_ratio": "noise ratio",
          "iterations": "iterations", "wall_time": "time (s)", "accuracy": "test accuracy",
          "pmm": "PMM (%)", "test_loss": "test loss", "final_loss": "final gradient loss",
          "fallback": "clean-gradient fallbacks", "fallback_rate": "share of clean uploads",
          "attribute_asr": "attribute ASR", "learning_loss": "learning loss",
          "chance": "chance (majority share)", "psnr_best": "best PSNR in the batch (dB)",
          "ssim_best": "best SSIM in the batch",
          "pairwise_ssim": "SSIM between victims' reconstructions",
          "truth_pairwise_ssim": "SSIM between victims' true images",
          "label_correct": "share of labels inferred",
          "robust_mse": "MSE(x, x*) of Refiner's robust data"}


@dataclass
class TargetInputs:
    victims: pd.DataFrame   # one row per (point, seed, attack, victim)
    fl: pd.DataFrame        # one row per (point, seed): final accuracy, pmm, test_loss
    history: pd.DataFrame   # one row per (point, seed, evaluated round)
    details: pd.DataFrame   # one row per (point, seed, attack): its details folder
    # one row per (point, seed, adversary, attribute, round): attribute_asr, chance,
    # learning_loss, accuracy (RecUP-FL's attribute jobs)
    attribute: pd.DataFrame = field(default_factory=pd.DataFrame)
    # a study's rows (a target with `study:` in place of runs) and its images by name
    study: pd.DataFrame = field(default_factory=pd.DataFrame)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class TargetResult:
    name: str
    title: str
    table: pd.DataFrame | None
    comparison: pd.DataFrame | None
    agreement: dict[str, str]
    files: list[Path]
    claims: pd.DataFrame | None = None  # the claims (and regime entries) on it, measured


def split_metric(metric: str) -> tuple[str, str]:
    """"psnr:max" -> ("psnr", "max"); "asr" -> ("ssim", "asr"); default statistic mean."""
    if metric == "asr":
        return "ssim", "asr"
    column, _, stat = metric.partition(":")
    return column, stat or "mean"


def _aggregate(frame: pd.DataFrame, keys: list[str], metrics: list[str],
               over: str = "all") -> pd.DataFrame:
    """One row per combination of ``keys`` with each metric's statistic over its rows, or
    (``over`` "successes") over its successful victims' rows, the ASR over all of them."""
    if frame.empty:
        return pd.DataFrame(columns=[*keys, *metrics])
    grouped = frame.groupby(keys, dropna=False, sort=True)
    counted = grouped if over == "all" else frame[frame["ssim"] > SUCCESS_SSIM].groupby(
        keys, dropna=False, sort=True)
    out = {}
    for metric in metrics:
        column, stat = split_metric(metric)
        if stat == "asr":
            out[metric] = grouped[column].agg(lambda v: float((v > SUCCESS_SSIM).mean()))
        else:  # a row without successes: NaN
            out[metric] = counted[column].agg(STATISTICS[stat])
    return pd.DataFrame(out).reset_index()


def source_of(inputs: TargetInputs, metrics: list[str]) -> pd.DataFrame:
    """The attribute jobs when a metric is an attribute metric (the others read from there
    too: accuracy is a column of it), the FL runs when every metric is an FL metric, else
    the attacked victims."""
    columns = [split_metric(m)[0] for m in metrics]
    if not inputs.study.empty:
        return inputs.study
    if any(c in ATTRIBUTE_METRICS for c in columns):
        return inputs.attribute
    return inputs.fl if all(m in FL_METRICS for m in metrics) else inputs.victims


def select_rows(inputs: TargetInputs, where: dict | None) -> TargetInputs:
    """``inputs`` with only the rows whose columns hold one of ``where``'s values
    (column -> values), in each frame that has the column."""
    if not where:
        return inputs

    def kept(frame: pd.DataFrame) -> pd.DataFrame:
        mask = np.ones(len(frame), dtype=bool)
        for column, values in where.items():
            if column in frame:
                mask &= frame[column].map(
                    lambda v, wanted=values: any(same(v, w) for w in wanted)).to_numpy(dtype=bool)
        return frame[mask].reset_index(drop=True)

    return replace(inputs, **{f.name: kept(getattr(inputs, f.name)) for f in fields(inputs)
                              if isinstance(getattr(inputs, f.name), pd.DataFrame)})


def build_table(spec: dict, inputs: TargetInputs) -> pd.DataFrame:
    """The target's tidy table: its row and column keys, then its metrics."""
    keys = [*spec["rows"], *spec.get("columns", [])]
    source = source_of(inputs, spec["metrics"])
    over = spec.get("over", "all")
    if over == "successes" and "ssim" not in source:
        raise ValueError(f"table.over: successes needs victims with an SSIM; the metrics "
                         f"{spec['metrics']} read {sorted(source.columns)[:8]}")
    return _aggregate(source, keys, spec["metrics"], over)


# ------------------------------------------------------------------------------------
# Figures


def _title(title: str, *frames: pd.DataFrame) -> str:
    """The target's title and the cases its figure draws."""
    cases = [c for frame in frames if "case" in frame for c in frame["case"].dropna()]
    return textwrap.fill(f"{title} {case_text(cases)}".strip(), 80, break_on_hyphens=False)


def _panels(data: pd.DataFrame, panels: str | None) -> list[tuple[str, pd.DataFrame]]:
    if panels is None:
        return [("", data)]
    return [(f"{panels} = {value}", part) for value, part in data.groupby(panels, sort=True)]


PAPER = Line2D([], [], color="grey", marker="o", markerfacecolor="none", linestyle="none",
               label="paper (hollow)")


def line_figure(spec: dict, inputs: TargetInputs, title: str,
                reference: dict | None = None) -> Figure:
    """A metric against a swept value (or any key), one curve per ``hue`` (or per metric when
    ``y`` lists several), and the paper's numbers as hollow markers where its reference
    gives them. A series without a value of a numeric ``x`` (its selection does not sweep
    it: GIAS Fig. 6(b)'s wrong and untrained priors against the GIML step) is a horizontal
    line at its value."""
    x, hue, panels = spec["x"], spec.get("hue"), spec.get("panels")
    metrics = spec["y"] if isinstance(spec["y"], list) else [spec["y"]]
    y, ylabel = metrics[0], LABELS.get(metrics[0], LABELS.get(split_metric(metrics[0])[0],
                                                                metrics[0]))
    keys = [k for k in (x, hue, panels) if k]
    source = source_of(inputs, metrics)
    data = _aggregate(source, keys, metrics).assign(_ours=True)
    paper = paper_values(reference, [*keys, y]).assign(_ours=False)
    if len(metrics) > 1:  # one curve per metric, named by its label
        def long(frame: pd.DataFrame, present: list[str]) -> pd.DataFrame:
            return frame.melt(id_vars=[*keys, "_ours"], value_vars=present, var_name="metric",
                              value_name="value").assign(metric=lambda f: f["metric"].map(
                                  lambda m: LABELS.get(m, m)))
        paper = pd.concat([long(paper_values(reference, [*keys, m]).assign(_ours=False), [m])
                           for m in metrics], ignore_index=True)
        data, hue, y = long(data, metrics), "metric", "value"
    both = pd.concat([data, paper], ignore_index=True) if len(paper) else data
    numeric = pd.api.types.is_numeric_dtype(data[x]) and not pd.api.types.is_bool_dtype(data[x])
    if not numeric:  # categories in the order selected, then the paper's others, evenly
        order = list(dict.fromkeys([*source[x], *paper[x]]))
        both = both.assign(**{x: both[x].map(order.index)})
    styles = series_styles(both[hue].dropna() if hue else [y])
    parts = _panels(both, panels)
    fig, axes = plt.subplots(1, len(parts), squeeze=False, layout="constrained",
                             figsize=(4.8 * len(parts) + 2.0, 3.8))
    for ax, (label, part) in zip(axes[0], parts, strict=True):
        for value, curve in (part.groupby(hue, sort=True) if hue else [(y, part)]):
            ours, theirs = (curve[curve["_ours"] == k].sort_values(x) for k in (True, False))
            style = styles[value]
            flat = ours[ours[x].isna()] if numeric else ours.iloc[:0]
            ours = ours[ours[x].notna()] if numeric else ours
            ax.plot(ours[x], ours[y], **style, label=str(value) if hue else "ours")
            across = sorted(part.loc[part["_ours"] & part[x].notna(), x].unique()) \
                if numeric else []
            for level in flat[y].dropna():  # rows without x (their selection does not sweep
                ax.plot(across, [level] * len(across), **style,  # it): a level at every x
                        label=str(value) if hue else "ours")
            ax.plot(theirs[x], theirs[y], **{**style, "linestyle": "none"},
                    markerfacecolor="none", label=f"_paper {value}")
        ax.set(title=label, xlabel=x, ylabel=ylabel)
        if not numeric:
            ax.set_xticks(range(len(order)), order, rotation=30, ha="right")
        if spec.get("logx"):
            log_axis(ax, "x")
        elif numeric:
            log_if_spread(ax, "x", both[x].dropna())
        if spec.get("logy"):
            log_axis(ax, "y")
        else:
            log_if_spread(ax, "y", both[y].dropna())
    return finish(fig, _title(title, source), hue, extra=[PAPER] if len(paper) else [])


def tradeoff_figure(spec: dict, inputs: TargetInputs, title: str,
                    reference: dict | None = None) -> Figure:
    """PMM against a privacy metric, one curve per defense, each point a strength."""
    y, panels = spec["y"], spec.get("panels", "attack")
    data = _aggregate(inputs.victims, ["defense", "strength", panels], ["pmm", y])
    styles = series_styles(data["defense"])
    parts = _panels(data, panels)
    fig, axes = plt.subplots(1, len(parts), squeeze=False, layout="constrained",
                             figsize=(4.8 * len(parts) + 2.0, 3.8))
    for ax, (label, part) in zip(axes[0], parts, strict=True):
        curves = []
        for defense, points in part.sort_values(["defense", "strength"]).groupby("defense"):
            ax.plot(points["pmm"], points[y], **styles[defense], label=defense)
            curves.append((points["pmm"].tolist(), points[y].tolist(),
                           [f"{s:g}" for s in points["strength"]], styles[defense]["color"]))
        label_points(ax, curves)
        ax.set(title=label, xlabel=LABELS["pmm"], ylabel=LABELS.get(split_metric(y)[0], y))
    return finish(fig, _title(title, inputs.victims), "defense")


def history_figure(spec: dict, inputs: TargetInputs, title: str,
                   reference: dict | None = None) -> Figure:
    """FL accuracy or test loss against the round, one curve per ``hue``."""
    y, hue = spec["y"], spec.get("hue")
    data = _aggregate(inputs.history, [k for k in ("round", hue) if k], [y])
    styles = series_styles(data[hue] if hue else [y])
    fig, ax = plt.subplots(figsize=(6.5, 3.8), layout="constrained")
    for value, curve in (data.groupby(hue, sort=True) if hue else [(y, data)]):
        ax.plot(curve["round"], curve[y], **styles[value], markevery=0.1,
                label=str(value) if hue else "ours")
    ax.set(xlabel="round", ylabel=LABELS.get(y, y))
    log_if_spread(ax, "y", data[y].dropna())
    return finish(fig, _title(title, inputs.history), hue)


def _picked(spec: dict, inputs: TargetInputs) -> list[tuple[pd.Series, list[int]]]:
    """Per details row (point, seed, attack): the victims to show (first, successes or
    failures by SSIM > 0.9), at most ``victims`` of them."""
    out = []
    keys = ["case", "defense", "strength", "series", "seed", "attack"]
    for _, row in inputs.details.iterrows():
        mask = np.logical_and.reduce([inputs.victims[k] == row[k] for k in keys])
        victims = inputs.victims[mask].sort_values("victim")
        if spec["pick"] == "success":
            victims = victims[victims["ssim"] > SUCCESS_SSIM]
        elif spec["pick"] == "failure":
            victims = victims[victims["ssim"] <= SUCCESS_SSIM]
        out.append((row, victims["victim"].astype(int).tolist()[:spec["victims"]]))
    return out


def _row_label(row: pd.Series) -> str:
    parts = [row["dataset"], row["series"] or row["attack"]]
    return " / ".join(str(p) for p in parts if p)


def _uploads(label: str) -> str:
    """A setting's label without its attack-only overrides (``attacks.<label>.*``, e.g. the
    GIML step of one attack): the uploads its attacks share."""
    return "~".join(p for p in str(label).split("~") if not p.startswith("attacks."))


def trace_figure(spec: dict, inputs: TargetInputs, title: str,
                 reference: dict | None = None) -> Figure:
    """The attack's loss against the iteration for the picked victims: one panel per row, a
    curve per victim; with ``hue`` (e.g. ``attack``) one panel per victim of the rows alike
    in all else (attacks of one setting's uploads, whatever their own overrides), a curve
    per value of ``hue`` (GIAS Fig. 3(b)). ``align: end`` ends the curves of a panel
    together (GIAS Fig. A4: GI-w's parameter search beside GI-z/w's, after its latent
    search)."""
    hue = spec.get("hue")
    keys = [k for k in ("case", "defense", "strength", "series", "seed", "attack") if k != hue]
    curves = []  # (panel, panel title, label, trace)
    for row, victims in _picked(spec, inputs):
        traces = read_json(Path(row["details"]) / f"traces_{row['attack']}.json")
        for v in victims:
            if hue:
                panel = (*(_uploads(row[k]) if k == "defense" else row[k] for k in keys), v)
                curves.append((panel, f"{row['dataset']} / victim {v}", str(row[hue]), traces[v]))
            else:
                curves.append((row.name, _row_label(row), f"victim {v}", traces[v]))
    panels = list(dict.fromkeys(panel for panel, *_ in curves))
    styles = series_styles(label for _, _, label, _ in curves)
    fig, axes = plt.subplots(1, max(1, len(panels)), squeeze=False, layout="constrained",
                             figsize=(4.8 * max(1, len(panels)) + 1.5, 3.8))
    longest = {panel: max(len(t) for p, _, _, t in curves if p == panel) for panel in panels}
    for panel, name, label, trace in curves:
        ax = axes[0][panels.index(panel)]
        start = 1 + (longest[panel] - len(trace) if spec.get("align") == "end" else 0)
        ax.plot(range(start, start + len(trace)), trace, **styles[label], markevery=0.1,
                label=label)
        ax.set(title=name, xlabel="iteration", ylabel="gradient distance", yscale="log")
    return finish(fig, _title(title, inputs.details), hue)


def snapshots_figure(spec: dict, inputs: TargetInputs, title: str,
                     reference: dict | None = None) -> Figure:
    """Reconstructions at the snapshot iterations, then the true image: one row per picked
    victim (the first image of its batch)."""
    rows = []
    for row, victims in _picked(spec, inputs):
        frames = load_npy(Path(row["details"]) / f"snapshots_{row['attack']}.npy")
        columns = [f"it. {t}" for t in row["snapshots"]] + ["truth"]
        rows += [(f"{_row_label(row)}\nvictim {v}", frames[v], columns) for v in victims]
    if not rows:
        fig, ax = plt.subplots(figsize=(4, 1), layout="constrained")
        ax.text(0.5, 0.5, "no victim matches", ha="center", va="center")
        ax.set_axis_off()
        return fig
    columns = len(rows[0][2])
    fig, axes = plt.subplots(len(rows), columns, squeeze=False, layout="constrained",
                             figsize=(1.2 * columns + 1.5, 1.25 * len(rows) + 0.6))
    for r, (label, frames, names) in enumerate(rows):
        for c, name in enumerate(names):
            ax = axes[r, c]
            image = frames[c][0].transpose(1, 2, 0)  # the batch's first image
            ax.imshow(image.squeeze(-1) if image.shape[-1] == 1 else image, cmap="gray",
                      vmin=0, vmax=255)
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(name, fontsize="small")
        axes[r, 0].set_ylabel(label, rotation=0, ha="right", va="center", fontsize="small")
    fig.suptitle(_title(title, inputs.details), fontsize="medium")
    return fig


def recon_figure(spec: dict, inputs: TargetInputs, title: str,
                 reference: dict | None = None) -> Figure:
    """The final reconstructions (truth on top) of every point, one row per point."""
    rows = [(f"{_row_label(row)} {row['defense']} {row['strength']:g}",
             Path(row["details"]) / f"recon_{row['attack']}.png")
            for _, row in inputs.details.iterrows()]
    images = [mpimg.imread(png) for _, png in rows]
    fig, axes = plt.subplots(len(rows), 1, squeeze=False, layout="constrained",
                             figsize=(6.0, max(1.0, sum(3.0 * i.shape[0] / i.shape[1]
                                                        for i in images))))
    for ax, (label, _), image in zip(axes[:, 0], rows, images, strict=True):
        ax.imshow(image)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_ylabel(label, rotation=0, ha="right", va="center", fontsize="small")
    fig.suptitle(_title(title, inputs.details), fontsize="medium")
    return fig


def images_figure(spec: dict, inputs: TargetInputs, title: str,
                  reference: dict | None = None) -> Figure:
    """A study's images, each titled (its ``images`` array and ``images_titles``): in a row
    (N, C, H, W), or a grid (rows, columns, C, H, W) with ``images_rows`` naming the rows
    (Refiner Fig. 5's blend strip per dataset, Fig. 6's x* per start)."""
    images = inputs.arrays["images"]
    grid = images if images.ndim == 5 else images[None]
    titles = inputs.arrays.get("images_titles", np.full(grid.shape[:2], ""))
    titles = titles if titles.ndim == 2 else titles[None]
    names = inputs.arrays.get("images_rows", [""] * len(grid))
    fig, axes = plt.subplots(*grid.shape[:2], squeeze=False, layout="constrained",
                             figsize=(1.8 * grid.shape[1], 2.2 * grid.shape[0]))
    for row, name in zip(range(len(grid)), names, strict=True):
        for ax, image, label in zip(axes[row], grid[row], titles[row], strict=True):
            ax.imshow(np.clip(image.transpose(1, 2, 0).squeeze(-1) if image.shape[0] == 1
                              else image.transpose(1, 2, 0), 0, 1),
                      cmap="gray" if image.shape[0] == 1 else None, vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(str(label), fontsize="small")
        axes[row][0].set_ylabel(str(name))
    fig.suptitle(textwrap.fill(title, 24 * grid.shape[1]), fontsize="medium")
    return fig


def attribute_figure(spec: dict, inputs: TargetInputs, title: str,
                     reference: dict | None = None) -> Figure:
    """Attribute ASR against learning loss (RecUP-FL Figs. 2-5, 9-11): one curve per ``hue``
    (default: defense label) whose points are its settings, one panel per ``panels`` value
    (default: adversary), one row of panels per attacked round, a dotted chance line."""
    data = inputs.attribute
    if data.empty:
        fig, ax = plt.subplots(figsize=(4, 1), layout="constrained")
        ax.text(0.5, 0.5, "no attribute results", ha="center", va="center")
        ax.set_axis_off()
        return fig
    setting = data["defense"].astype(str) + "-" + data["strength"].astype(str)
    swept = [c for c in data.columns if "." in c]  # one column per swept path
    for column in swept:
        setting = setting + "~" + data[column].astype(str)
    return attribute_tradeoff(data.assign(setting=setting), y="attribute_asr",
                              hue=spec.get("hue", "defense"),
                              panels=spec.get("panels", "adversary"), by="setting",
                              title=textwrap.fill(title, 80))


def layers_figure(spec: dict, inputs: TargetInputs, title: str,
                  reference: dict | None = None) -> Figure:
    """The relative error |x_r - x_r*| / |x_r*| of every layer's recovered input against
    the layer, input first (GIAS Figs. A1, A2; R-GAP's ``layer_errors``), log y: per curve
    (``hue``, default attack) the median over victims and seeds with a band from the least
    to the largest error, one panel per ``panels`` value."""
    hue, panels = spec.get("hue", "attack"), spec.get("panels")
    victims = inputs.victims
    rows = (victims[victims["layer_errors"].map(lambda e: isinstance(e, (list, tuple)))]
            if "layer_errors" in victims else victims.iloc[:0])
    if rows.empty:
        fig, ax = plt.subplots(figsize=(4, 1), layout="constrained")
        ax.text(0.5, 0.5, "no per-layer errors (an attack that recovers every layer: rgap)",
                ha="center", va="center")
        ax.set_axis_off()
        return fig
    long = rows.assign(layer=rows["layer_errors"].map(lambda e: list(range(1, len(e) + 1))))
    long = long.explode(["layer", "layer_errors"]).astype({"layer": int, "layer_errors": float})
    keys = [k for k in (hue, panels) if k]
    data = long.groupby([*keys, "layer"], sort=True)["layer_errors"].agg(
        ["median", "min", "max"]).reset_index()
    styles = series_styles(data[hue])
    parts = _panels(data, panels)
    fig, axes = plt.subplots(1, len(parts), squeeze=False, layout="constrained",
                             figsize=(4.8 * len(parts) + 2.0, 3.8))
    for ax, (label, part) in zip(axes[0], parts, strict=True):
        for value, curve in part.groupby(hue, sort=True):
            style = styles[value]
            ax.plot(curve["layer"], curve["median"], **style, label=str(value))
            ax.fill_between(curve["layer"], curve["min"], curve["max"], color=style["color"],
                            alpha=0.15, linewidth=0)
        ax.set(title=label, xlabel="layer (1: the input image; last: the FC layer's input)",
               ylabel="relative error of the layer's input")
        ax.set_xticks(sorted(part["layer"].unique()))
        if (part["min"] > 0).any():
            log_axis(ax, "y")
    return finish(fig, _title(title, rows), hue)


FIGURES = {"line": line_figure, "tradeoff": tradeoff_figure, "history": history_figure,
           "trace": trace_figure, "snapshots": snapshots_figure, "recon": recon_figure,
           "attribute": attribute_figure, "layers": layers_figure, "images": images_figure,
           "privacy_grid": privacy_grid_figure}


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
