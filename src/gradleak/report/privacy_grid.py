"""Refiner Fig. 8 (§6.1, "Semantic results"): an attack's reconstructions under each defense
across its strengths, with the paper's "privacy line" (its red broken lines: "the images
above the red broken lines contain more privacy information of the original images").

The paper draws its line by eye. Its one stated measure of when a person stops recognising
an image is §3.3's: "when the noise ratio reaches approximately 0.6, human eyes are no
longer able to identify privacy information" (an image blended (1 - r) x + r u with uniform
noise u, :func:`gradleak.models.evalnet.blend`). The evaluation network itself cannot draw
the line for GGA: its images come from a generator and are noise-free, and the paper's
Fig. 9(b) finds the network rating GGA highly at every strength. So the line here compares
the reconstruction with the truth by an image similarity (SSIM, or PSNR) against the same
similarity of the truth blended with noise at that ratio: a reconstruction is recognisable
while it is more similar to its truth than the truth's own 0.6 noise blend is. The line of
a row falls before the first strength (weakest first, by the defense's ``stronger``
direction) whose reconstructions are not, over every image of the attack job's
reconstruction grid (``attack.outputs.grid_victims`` victims, the first seed); the cell shows the
first. One row per defense label (per case and attack when the target holds several),
one column per strength, the truth first: the paper's strengths run down its columns and
its lines are horizontal, ours run along the rows and the line is vertical.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.image as mpimg  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from gradleak import config as cfg  # noqa: E402
from gradleak.metrics import image as image_metrics  # noqa: E402
from gradleak.models.evalnet import blend  # noqa: E402
from gradleak.report.style import case_text  # noqa: E402

PADDING = 2  # gradleak.utils.io.save_image_grid's make_grid padding
LINE = {"color": "red", "linestyle": (0, (4, 2)), "linewidth": 2.5}
NAMES = {"ssim": "SSIM", "psnr": "PSNR"}


def grid_tiles(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The truth and reconstruction images of an attack job's reconstruction grid
    (``recon_<attack>.png``: truths in the top row, reconstructions below, square images,
    ``PADDING`` pixels between), each (N, 3, H, H) in [0, 1]."""
    grid = mpimg.imread(path)[..., :3].astype(np.float32)
    height, width = grid.shape[:2]
    side = (height - PADDING) // 2 - PADDING
    count = (width - PADDING) // (side + PADDING)
    if side < 1 or 2 * (side + PADDING) + PADDING != height or \
            count * (side + PADDING) + PADDING != width:
        raise ValueError(f"{path}: a {height}x{width} grid is not two rows of square images "
                         f"with {PADDING}-pixel padding; expected an attack job's "
                         f"reconstruction grid")

    def row(r: int) -> torch.Tensor:
        top = PADDING + r * (side + PADDING)
        tiles = [grid[top:top + side, PADDING + c * (side + PADDING):
                      PADDING + c * (side + PADDING) + side] for c in range(count)]
        return torch.from_numpy(np.stack(tiles)).permute(0, 3, 1, 2).contiguous()

    return row(0), row(1)


def _similarity(metric: str, rec: torch.Tensor, truth: torch.Tensor) -> float:
    if metric not in NAMES:
        raise ValueError(f"privacy_metric {metric!r}; expected one of {sorted(NAMES)}")
    return float(getattr(image_metrics, metric)(rec, truth))


def privacy_cells(spec: dict, inputs) -> pd.DataFrame:
    """One row per (case, attack, defense label, strength) of the target's reconstructions:
    its row key, the metric of the reconstructions and of the truths' noise blends, whether
    it is private (less similar than the blend) and the images of its first victim."""
    metric, ratio = spec["privacy_metric"], spec["privacy_noise"]
    rows = []
    details = inputs.details.sort_values("seed", kind="stable")
    for _, row in details.drop_duplicates(["case", "attack", "defense", "strength"]).iterrows():
        truths, recs = grid_tiles(Path(row["details"]) / f"recon_{row['attack']}.png")
        noisy = blend(truths, ratio, torch.Generator().manual_seed(0))
        ours, blended = _similarity(metric, recs, truths), _similarity(metric, noisy, truths)
        rows.append({"case": row["case"], "dataset": row["dataset"], "attack": row["attack"],
                     "defense": row["defense"], "strength": float(row["strength"]),
                     "value": ours, "threshold": blended, "private": ours < blended,
                     "truth": truths[0], "reconstruction": recs[0]})
    return pd.DataFrame(rows)


def _stronger(label: str) -> str:
    """``higher`` or ``lower``: which strengths of the defense label protect more (a label
    of another name, ``pruning_weight``, counts as ``higher``)."""
    name = str(label).split("~")[0]
    return cfg.stronger(name) if name in cfg.schema()["definitions"]["defenses"] else "higher"


def privacy_line(cells: pd.DataFrame) -> int | None:
    """The column (0: the weakest strength) before which a row's line falls: its first
    private cell, weakest first; None when none is."""
    private = np.flatnonzero(cells["private"].to_numpy(dtype=bool))
    return int(private[0]) if len(private) else None


def _show(ax, image: torch.Tensor) -> None:
    ax.imshow(image.permute(1, 2, 0).clamp(0, 1).numpy())
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)


def privacy_grid_figure(spec: dict, inputs, title: str, reference: dict | None = None) -> Figure:
    """The reconstruction grid (defense rows x strength columns, the truth first), each
    cell labelled with its strength and the metric, and each row's privacy line."""
    cells = privacy_cells(spec, inputs)
    if cells.empty:
        fig, ax = plt.subplots(figsize=(4, 1), layout="constrained")
        ax.text(0.5, 0.5, "no reconstructions", ha="center", va="center")
        ax.set_axis_off()
        return fig
    several = cells["case"].nunique() > 1 or cells["attack"].nunique() > 1
    groups = []
    for (case, attack, label), part in cells.groupby(["case", "attack", "defense"], sort=False):
        order = part.sort_values("strength", ascending=_stronger(label) == "higher")
        name = f"{label}\n{case} / {attack}" if several else str(label)
        groups.append((name, order.reset_index(drop=True)))
    metric, ratio = NAMES[spec["privacy_metric"]], spec["privacy_noise"]
    columns = 1 + max(len(part) for _, part in groups)
    fig, axes = plt.subplots(len(groups), columns, squeeze=False, layout="constrained",
                             figsize=(1.15 * columns + 1.6, 1.6 * len(groups) + 1.4))
    for r, (name, part) in enumerate(groups):
        _show(axes[r, 0], part["truth"].iloc[0])
        axes[r, 0].set_title("truth", fontsize="x-small")
        axes[r, 0].set_xlabel(f"{ratio:g} blend: {metric} {part['threshold'].mean():.2f}",
                              fontsize="xx-small")
        axes[r, 0].set_ylabel(name, rotation=0, ha="right", va="center", fontsize="small")
        line = privacy_line(part)
        for c, cell in part.iterrows():
            ax = axes[r, c + 1]
            _show(ax, cell["reconstruction"])
            ax.set_title(f"{cell['strength']:g}", fontsize="x-small")
            ax.set_xlabel(f"{metric} {cell['value']:.2f}", fontsize="xx-small")
            if c == line:
                ax.spines["left"].set(visible=True, **LINE)
        for ax in axes[r, len(part) + 1:]:
            ax.set_axis_off()
    cases = case_text(cells["case"])
    fig.suptitle(textwrap.fill(f"{title} {cases}".strip(), int(9 * fig.get_figwidth()),
                               break_on_hyphens=False), fontsize="medium")
    fig.supxlabel(textwrap.fill(
        f"weakest strength first; red broken line: before the first strength whose "
        f"reconstructions' {metric} to the truth is below that of the truth blended with "
        f"{ratio:g} noise (under the truth; Refiner §3.3: at a noise ratio of about 0.6 "
        f"people no longer recognise an image); left of it the reconstructions still hold the "
        f"original's private information", int(13 * fig.get_figwidth())), fontsize="x-small")
    return fig
