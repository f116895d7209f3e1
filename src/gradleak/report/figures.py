"""Deterministic figures: PMM vs PSNR trade-off, CENSOR utility vs privacy, reconstruction
grids, evalnet monotonicity, the matched-utility heat map."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.image as mpimg  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from gradleak.report.attribute import attribute_tradeoff  # noqa: E402
from gradleak.report.matched_utility import heatmap as matched_heatmap  # noqa: E402
from gradleak.report.matched_utility import protocol_text  # noqa: E402
from gradleak.report.protocol_ranking import figure as ranking_figure  # noqa: E402
from gradleak.report.style import (  # noqa: E402
    case_text,
    finish,
    label_points,
    log_if_spread,
    series_styles,
)
from gradleak.report.tables import ATTACK_KEYS, load_record  # noqa: E402
from gradleak.settings import (  # noqa: E402
    ADAPTIVE,
    PAPER,
    PROTOCOL_KEYS,
    is_ablation,
    label_without,
    protocol_of,
)
from gradleak.utils.io import atomic_path  # noqa: E402

DPI = 150
SVG_HASHSALT = "gradleak"
_METADATA = {
    "png": {"Software": None},
    "svg": {"Date": None},
    "pdf": {"CreationDate": None, "Creator": None, "Producer": None},
}


def save_figure(fig: Figure, path: Path) -> Path:
    """Save ``fig`` as PNG, SVG or PDF without timestamps/versions, atomically; close it."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in _METADATA:
        raise ValueError(f"{path}: unsupported figure format {fmt!r} (png, svg or pdf)")
    try:
        with atomic_path(path) as tmp, matplotlib.rc_context({"svg.hashsalt": SVG_HASHSALT}):
            fig.savefig(tmp, format=fmt, dpi=DPI, metadata=_METADATA[fmt])
    finally:
        plt.close(fig)
    return path


METRIC_LABELS = {
    "psnr": "mean PSNR (dB)", "ssim": "mean SSIM", "lpips": "mean LPIPS",
    "stlpips": "mean ST-LPIPS",
    "noise_ratio": "evaluation-network noise ratio",
}


def _pmm_panel(ax: plt.Axes, data: pd.DataFrame, styles: dict[str, dict], title: str,
               metric: str = "psnr") -> None:
    """One curve per defense through its strengths (labelled where they do not overlap),
    the undefended run as a star; the adaptive attacker's rows (``attacker``, decision 0072),
    where there are any, as a dashed curve with hollow markers beside each defense's."""
    data = data.dropna(subset=["pmm", metric]).sort_values(["defense", "strength"])
    ax.set(title=title, xlabel="PMM (%)", ylabel=METRIC_LABELS[metric])
    if data.empty:
        ax.text(0.5, 0.5, f"{metric} unavailable", transform=ax.transAxes, ha="center")
        return
    adaptive = data[data["attacker"] == ADAPTIVE]
    for defense, points in adaptive.groupby("defense", sort=True):
        ax.plot(points["pmm"], points[metric], **{**styles[defense], "linestyle": "--"},
                markersize=14 if defense == "none" else 5, markerfacecolor="none")
    if not adaptive.empty:  # one legend entry for every dashed curve
        ax.plot([], [], color="grey", linestyle="--", marker="o", markerfacecolor="none",
                label="adaptive attacker")
    curves = []
    for defense, points in data[data["attacker"] == PAPER].groupby("defense", sort=True):
        style = styles[defense]
        if defense == "none":
            ax.plot(points["pmm"], points[metric], **style, markersize=14, label="none",
                    zorder=3)
            continue
        ax.plot(points["pmm"], points[metric], **style, markersize=5, label=defense)
        curves.append((points["pmm"].tolist(), points[metric].tolist(),
                       [f"{s:g}" for s in points["strength"]], style["color"]))
    label_points(ax, curves)
    log_if_spread(ax, "y", data[metric])


def _main_settings(tradeoff: pd.DataFrame) -> pd.DataFrame:
    """The trade-off rows of the defense sweeps, each with its ``protocol`` (a label's
    ``fl.`` and ``attack.protocol.`` overrides, no ablation; empty: as configured) apart
    from its ``defense``; ablation settings are tabulated, not drawn."""
    labels = tradeoff["defense"]
    split = tradeoff.assign(protocol=labels.map(protocol_of),
                            defense=labels.map(lambda d: label_without(d, PROTOCOL_KEYS)))
    return split[~split["defense"].map(is_ablation)]


def _title(first: str, case: str, protocol: str, frame: pd.DataFrame) -> str:
    """A panel's title: ``first``, then its case and protocol where the figure has several."""
    where = [case] * (frame["case"].nunique() > 1 and first != case) \
        + [protocol_text(protocol)] * (frame["protocol"].nunique() > 1)
    return " — ".join([first, *where])


PMM_NOTE = "one curve per defense, points labelled with their strength"


def pmm_vs_psnr(tradeoff: pd.DataFrame, attack: str) -> Figure:
    """Refiner Fig. 7 style: mean PSNR against PMM, one line per defense, one panel per case."""
    tradeoff = _main_settings(tradeoff)
    data = tradeoff[tradeoff["attack"] == attack]
    groups = sorted(data.groupby(["case", "protocol"]).groups)  # a protocol's own PMM
    styles = series_styles(tradeoff["defense"])
    fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups) + 2.0, 4.5),
                             squeeze=False, layout="constrained")
    for ax, (case, protocol) in zip(axes[0], groups, strict=True):
        _pmm_panel(ax, data[(data["case"] == case) & (data["protocol"] == protocol)], styles,
                   _title(case, case, protocol, data))
    return finish(fig, f"{attack}: mean PSNR against PMM, {PMM_NOTE}", "defense")


def _panel_grid(count: int) -> tuple[Figure, list[plt.Axes]]:
    """A figure of ``count`` panels, at most 3 a row (room for the legend on the right);
    the unused cells hidden."""
    columns = min(3, count)
    rows = -(-count // columns)
    fig, axes = plt.subplots(rows, columns, squeeze=False, layout="constrained",
                             figsize=(4.5 * columns + 2.0, 4.0 * rows))
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:count])


def tradeoff_panels(tradeoff: pd.DataFrame, metric: str) -> Figure:
    """Refiner Fig. 7 (PSNR) / Fig. 10 (SSIM, LPIPS, evaluation-network score) against PMM:
    one curve per defense, one panel per case and attack, at most 3 panels a row."""
    tradeoff = _main_settings(tradeoff)
    cases = sorted(tradeoff["case"].unique())
    groups = sorted(tradeoff.groupby(["case", "protocol"]).groups)
    panels = [(case, protocol, attack) for case, protocol in groups
              for attack in sorted(tradeoff["attack"].unique())]
    styles = series_styles(tradeoff["defense"])
    fig, axes = _panel_grid(len(panels))
    for ax, (case, protocol, attack) in zip(axes, panels):
        picked = tradeoff[(tradeoff["case"] == case) & (tradeoff["protocol"] == protocol)
                          & (tradeoff["attack"] == attack)]
        _pmm_panel(ax, picked, styles, _title(attack, case, protocol, tradeoff), metric)
    return finish(fig, f"{METRIC_LABELS[metric]} against PMM per attack {case_text(cases)}: "
                       f"{PMM_NOTE}", "defense")


def censor_tradeoff(censor: pd.DataFrame) -> Figure:
    """CENSOR's utility and privacy of the same uploads: final FL accuracy against each
    attack's mean PSNR, one point per defense setting labelled with its strength and, where
    the defense uploaded the clean gradient, the share of uploads that were clean."""
    attacks = sorted(c.removesuffix("_psnr") for c in censor.columns if c.endswith("_psnr"))
    groups = sorted(censor.groupby(["case", "protocol"]).groups)  # a protocol's own points
    cases = sorted({case for case, _ in groups})
    panels = [(case, protocol, attack) for case, protocol in groups for attack in attacks]
    styles = series_styles(censor["defense"])
    fig, axes = _panel_grid(len(panels))
    for ax, (case, protocol, attack) in zip(axes, panels):
        x = f"{attack}_psnr"
        data = censor[(censor["case"] == case) & (censor["protocol"] == protocol)].dropna(
            subset=[x, "accuracy"])
        ax.set(title=_title(attack, case, protocol, censor), xlabel="mean PSNR (dB)",
               ylabel="final FL accuracy")
        curves = []
        for defense, points in data.sort_values(["defense", "strength"]).groupby("defense"):
            ax.plot(points[x], points["accuracy"], **styles[defense], label=defense)
            curves.append((points[x].tolist(), points["accuracy"].tolist(),
                           [f"{r.strength:g}" + (f" ({r.fallback_rate:.0%} clean)"
                                                 if r.fallback_rate > 0 else "")
                            for r in points.itertuples()], styles[defense]["color"]))
        label_points(ax, curves)
    return finish(fig, f"Final accuracy against each attack's PSNR of the same uploads "
                       f"{case_text(cases)} (lower PSNR is more private; labels: strength)",
                  "defense")


def _recon_runs(attack_files: list[Path]) -> list[tuple[str, str, str, float, Path]]:
    """Sorted (attack, case, defense, strength, recon png) of every seed-0 attack run."""
    runs = []
    for path in attack_files:
        r = load_record(path, ATTACK_KEYS)
        if r["seed"] == 0:
            runs += [(label, r["case"], r["defense"], float(r["strength"]),
                      Path(path).parent / "details" / f"recon_{label}.png") for label in r["runs"]]
    return sorted(runs)


RECON_COLUMNS = 4


def recon_grid(runs: list[tuple[str, str, str, float, Path]], attack: str) -> Figure:
    """The reconstruction grids of ``runs`` (one attack), one labelled panel per setting,
    ``RECON_COLUMNS`` settings a row."""
    several_cases = len({case for _, case, *_ in runs}) > 1
    images = [mpimg.imread(png) for *_, png in runs]
    columns = min(RECON_COLUMNS, len(runs))
    rows = -(-len(runs) // columns)
    aspect = max(img.shape[0] / img.shape[1] for img in images)
    fig, axes = plt.subplots(rows, columns, squeeze=False, layout="constrained",
                             figsize=(2.6 * columns, max(1.0, (2.6 * aspect + 0.5) * rows)))
    for ax, (_, case, defense, strength, _), img in zip(axes.flat, runs, images):
        ax.imshow(img)
        ax.set_xticks([])
        ax.set_yticks([])
        label = f"{defense} {strength:g}"
        ax.set_title(f"{case}\n{label}" if several_cases else label, fontsize="small")
    for ax in axes.flat[len(runs):]:
        ax.set_visible(False)
    fig.suptitle(f"{attack}: truth (top) vs reconstruction (bottom), seed 0")
    return fig


def evalnet_monotonicity(evalnet: pd.DataFrame) -> Figure:
    """Evaluation-network prediction against the true noise ratio, per dataset."""
    fig, ax = plt.subplots(figsize=(6.0, 4.5), layout="constrained")
    styles = series_styles(evalnet["dataset"])
    for dataset, points in evalnet.groupby("dataset", sort=True):
        ax.plot(points["ratio"], points["prediction"], **styles[dataset], label=dataset)
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey", label="identity")
    ax.set(xlabel="noise ratio", ylabel="predicted ratio")
    return finish(fig, "Evaluation network: predicted against true noise ratio", "dataset")


def write_figures(tables: dict[str, pd.DataFrame], attack_files: list[Path], out_dir: Path,
                  names: list[str] | None = None) -> list[Path]:
    """Write the figures ``names`` (default: every one the tables can make) into ``out_dir``
    and return their paths."""
    out_dir = Path(out_dir)
    tradeoff = tables["tradeoff"]
    runs = _recon_runs(attack_files)
    makers = {f"pmm_vs_psnr_{a}": lambda a=a: pmm_vs_psnr(tradeoff, a)
              for a in sorted(tradeoff["attack"].unique())}
    if not tradeoff.empty:
        makers.update({f"tradeoff_{m}": lambda m=m: tradeoff_panels(tradeoff, m)
                       for m in METRIC_LABELS})
    makers.update({f"recon_{a}": lambda a=a: recon_grid([r for r in runs if r[0] == a], a)
                   for a in sorted({run[0] for run in runs})})
    if not tables.get("censor_table", pd.DataFrame()).empty:
        makers["censor_tradeoff"] = lambda: censor_tradeoff(tables["censor_table"])
    if not tables.get("evalnet_monotonicity", pd.DataFrame()).empty:
        makers["evalnet_monotonicity"] = lambda: evalnet_monotonicity(
            tables["evalnet_monotonicity"])
    if not tables.get("attribute", pd.DataFrame()).empty:
        makers["attribute_tradeoff"] = lambda: attribute_tradeoff(tables["attribute"])
    if not tables.get("matched_utility", pd.DataFrame()).empty:
        makers["matched_utility"] = lambda: matched_heatmap(tables["matched_utility"])
    if not tables.get("protocol_ranking", pd.DataFrame()).empty:
        makers["protocol_ranking"] = lambda: ranking_figure(tables["protocol_ranking"])
    names = list(makers) if names is None else names
    missing = sorted(set(names) - set(makers))
    if missing:
        raise ValueError(f"no data for the figures {missing}: their runs are missing from "
                         f"{[str(p) for p in attack_files[:3]]}...")
    return [save_figure(makers[name](), out_dir / f"{name}.png") for name in names]
