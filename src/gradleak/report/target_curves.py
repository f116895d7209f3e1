"""A target's curves: a metric against a swept value (``line``), PMM against a privacy
metric (``tradeoff``), a metric against the FL round (``history``), attribute ASR against
the learning loss (``attribute``) and an error per layer (``layers``)."""


from __future__ import annotations

import textwrap

import matplotlib

matplotlib.use("Agg")


import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from gradleak.report.attribute import attribute_tradeoff  # noqa: E402
from gradleak.report.reference import paper_values  # noqa: E402
from gradleak.report.style import (  # noqa: E402
    finish,
    label_points,
    log_axis,
    log_if_spread,
    series_styles,
)
from gradleak.report.target_data import (
    LABELS,
    PAPER,
    TargetInputs,
    aggregate,
    figure_title,
    panel_parts,
    source_of,
    split_metric,
)


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
    data = aggregate(source, keys, metrics).assign(_ours=True)
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
    parts = panel_parts(both, panels)
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
    return finish(fig, figure_title(title, source), hue, extra=[PAPER] if len(paper) else [])


def tradeoff_figure(spec: dict, inputs: TargetInputs, title: str,
                    reference: dict | None = None) -> Figure:
    """PMM against a privacy metric, one curve per defense, each point a strength."""
    y, panels = spec["y"], spec.get("panels", "attack")
    data = aggregate(inputs.victims, ["defense", "strength", panels], ["pmm", y])
    styles = series_styles(data["defense"])
    parts = panel_parts(data, panels)
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
    return finish(fig, figure_title(title, inputs.victims), "defense")


def history_figure(spec: dict, inputs: TargetInputs, title: str,
                   reference: dict | None = None) -> Figure:
    """FL accuracy or test loss against the round, one curve per ``hue``."""
    y, hue = spec["y"], spec.get("hue")
    data = aggregate(inputs.history, [k for k in ("round", hue) if k], [y])
    styles = series_styles(data[hue] if hue else [y])
    fig, ax = plt.subplots(figsize=(6.5, 3.8), layout="constrained")
    for value, curve in (data.groupby(hue, sort=True) if hue else [(y, data)]):
        ax.plot(curve["round"], curve[y], **styles[value], markevery=0.1,
                label=str(value) if hue else "ours")
    ax.set(xlabel="round", ylabel=LABELS.get(y, y))
    log_if_spread(ax, "y", data[y].dropna())
    return finish(fig, figure_title(title, inputs.history), hue)


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
    parts = panel_parts(data, panels)
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
    return finish(fig, figure_title(title, rows), hue)


