"""A target's figures of picked victims: their gradient loss over the iterations
(``trace``), their reconstructions over the iterations (``snapshots``), beside the truth
(``recon``), and a study's titled images (``images``)."""


from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")


import matplotlib.image as mpimg  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from gradleak.report.style import (  # noqa: E402
    finish,
    series_styles,
)
from gradleak.report.tables import SUCCESS_SSIM  # noqa: E402
from gradleak.report.target_data import (
    TargetInputs,
    figure_title,
)
from gradleak.utils.io import load_npy, read_json  # noqa: E402


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
    return finish(fig, figure_title(title, inputs.details), hue)


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
    fig.suptitle(figure_title(title, inputs.details), fontsize="medium")
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
    fig.suptitle(figure_title(title, inputs.details), fontsize="medium")
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


