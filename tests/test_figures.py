"""Every figure reads at a glance: each series its own (colour, marker, line style), the
same for a name in every figure, and one legend per figure outside the panels."""

from pathlib import Path

import matplotlib.colors as mcolors
import numpy as np
import pandas as pd
import pytest

from gradleak.report.attribute import attribute_tradeoff
from gradleak.report.figures import censor_tradeoff, pmm_vs_psnr, tradeoff_panels
from gradleak.report.style import series_style, series_styles
from gradleak.report.target_curves import (
    history_figure,
    layers_figure,
    line_figure,
    tradeoff_figure,
)
from gradleak.report.target_data import TargetInputs

DEFENSES = ["none", "censor", "censor_alg1", "censor_official", "clipping", "dp_gaussian",
            "dp_laplace", "pruning", "quantization", "recupfl", "refiner", "soteria"]
ATTACKS = ["dlg", "gias"]
EMPTY = pd.DataFrame()


def _tradeoff() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = [{"case": "c", "defense": d, "strength": float(s), "attack": a, "attacker": "paper",
             "pmm": 100.0 - 5 * i * s, "psnr": 30 - i - s, "ssim": 0.5, "lpips": 0.3,
             "stlpips": 0.3, "noise_ratio": 0.1, "accuracy": rng.uniform(0.5, 0.9),
             "fallback_rate": 0.0}
            for i, d in enumerate(DEFENSES) for s in ([0] if d == "none" else [1, 2, 3])
            for a in ATTACKS]
    return pd.DataFrame(rows)


def _attribute() -> pd.DataFrame:
    return pd.DataFrame([{"case": "c", "defense": d, "strength": float(s), "adversary": adv,
                          "attribute": "ink", "round": 0, "seed": 0, "asr": 0.5 - 0.01 * s,
                          "chance": 0.35, "learning_loss": 0.2 * (1 + i + s),
                          "accuracy": 0.9}
                         for i, d in enumerate(DEFENSES) for s in ([0] if d == "none" else [1, 2])
                         for adv in ("rf", "svm")])


def _victims() -> pd.DataFrame:
    return pd.DataFrame([{"case": f"{ds}-lenet", "dataset": ds, "defense": d,
                          "strength": float(s), "series": "", "seed": 0, "attack": a,
                          "victim": 0, "threshold": t, "pmm": 90.0 - s, "psnr": 10.0 + s + t,
                          "ssim": 0.5}
                         for ds in ("mnist", "cifar10") for d in DEFENSES for s in (1, 2)
                         for a in ATTACKS for t in (1e-6, 1e-3)])


def _history() -> pd.DataFrame:
    return pd.DataFrame([{"case": "c", "series": f"s{k}", "round": r, "seed": 0,
                          "accuracy": 0.1 * r + 0.01 * k}
                         for k in range(12) for r in range(5)])


def _layers() -> pd.DataFrame:
    """R-GAP's errors per layer (input first) for two victims of CNN6 and CNN10, plain and
    with the prior on the first layer; a GIAS row without per-layer errors."""
    rows = [{"case": f"digits-{m}", "dataset": "digits", "model": m, "defense": "none",
             "strength": 0.0, "series": "", "seed": 0, "attack": a, "victim": v, "psnr": 30.0,
             "layer_errors": [(0.3 if a == "rgap_prior1" and r == 0 else 1e-6 * 10 ** (-r / 3))
                              * (1 + v) for r in range(depth + 1)]}
            for m, depth in (("cnn6", 6), ("cnn10", 10)) for a in ("rgap", "rgap_prior1")
            for v in (0, 1)]
    return pd.DataFrame([*rows, {"case": "digits-cnn6", "dataset": "digits", "model": "cnn6",
                                 "defense": "none", "strength": 0.0, "series": "", "seed": 0,
                                 "attack": "gias", "victim": 0, "psnr": 12.0}])


def _figures() -> dict:
    tradeoff = _tradeoff()
    censor = tradeoff.pivot_table(index=["case", "defense", "strength"], columns="attack",
                                  values="psnr").add_suffix("_psnr").reset_index()
    censor = censor.assign(protocol="", accuracy=0.8, fallback_rate=0.0)
    inputs = TargetInputs(_victims(), EMPTY, _history(), EMPTY)
    reference = {"columns": ["dataset", "threshold", "psnr"],
                 "rows": [["mnist", 1e-6, 12.0], ["cifar10", 1e-3, 9.0]]}
    return {
        "tradeoff_psnr": tradeoff_panels(tradeoff, "psnr"),
        "pmm_vs_psnr": pmm_vs_psnr(tradeoff, "dlg"),
        "censor_tradeoff": censor_tradeoff(censor),
        "attribute_tradeoff": attribute_tradeoff(_attribute()),
        "target_line": line_figure({"x": "threshold", "y": "psnr", "hue": "dataset"},
                                   inputs, "t", reference),
        "target_metrics": line_figure({"x": "threshold", "y": ["psnr", "ssim"]}, inputs, "t",
                                      reference),
        "target_tradeoff": tradeoff_figure({"y": "psnr"}, inputs, "t"),
        "target_history": history_figure({"y": "accuracy", "hue": "series"}, inputs, "t"),
        "target_layers": layers_figure({"kind": "layers", "hue": "attack", "panels": "model"},
                                       TargetInputs(_layers(), EMPTY, EMPTY, EMPTY), "t"),
    }


@pytest.fixture(scope="module")
def figures() -> dict:
    return _figures()


def _series(fig) -> dict[str, set]:
    """Each labelled line's style, by label, over every panel."""
    styles: dict[str, set] = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            if not line.get_label().startswith("_"):
                styles.setdefault(line.get_label(), set()).add(
                    (mcolors.to_hex(line.get_color()), line.get_marker(), line.get_linestyle()))
    return styles


def test_each_series_has_its_own_style_the_same_in_every_panel(figures):
    for name, fig in figures.items():
        styles = _series(fig)
        assert len(styles) >= 2, name
        assert all(len(s) == 1 for s in styles.values()), (name, styles)
        assert len({next(iter(s)) for s in styles.values()}) == len(styles), (name, styles)


def test_one_legend_per_figure_outside_the_panels(figures):
    for name, fig in figures.items():
        assert len(fig.legends) == 1, name
        assert all(ax.get_legend() is None for ax in fig.axes), name
        entries = [t.get_text() for t in fig.legends[0].get_texts()]
        assert len(entries) == len(set(entries)), (name, entries)


def test_a_defense_looks_the_same_in_every_figure(figures):
    seen: dict[str, set] = {}
    for fig in figures.values():
        for label, styles in _series(fig).items():
            seen.setdefault(label, set()).update(styles)
    for defense in DEFENSES:
        assert len(seen[defense]) == 1, (defense, seen[defense])
    assert series_style("censor") == series_styles(DEFENSES)["censor"]


def test_point_labels_do_not_overlap(figures):
    fig = figures["tradeoff_psnr"]
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        boxes = [t.get_window_extent(renderer) for t in ax.texts]
        assert boxes, ax.get_title()
        assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def test_wide_ranges_get_a_log_axis_and_titles_name_the_case(figures):
    assert figures["attribute_tradeoff"].axes[0].get_xscale() == "log"
    assert figures["target_line"].axes[0].get_xscale() == "log"  # 1e-6 .. 1e-3
    assert figures["tradeoff_psnr"].axes[0].get_xscale() == "linear"
    assert "on case c" in figures["tradeoff_psnr"]._suptitle.get_text()
    assert "cifar10-lenet" in figures["target_line"]._suptitle.get_text()


def test_the_papers_numbers_are_drawn_hollow_beside_ours(figures):
    ax = figures["target_line"].axes[0]
    paper = [line for line in ax.get_lines() if line.get_label().startswith("_paper")]
    assert sorted(y for line in paper for y in line.get_ydata()) == [9.0, 12.0]
    assert all(line.get_markerfacecolor() == "none" for line in paper if len(line.get_xdata()))
    assert "paper (hollow)" in [t.get_text() for t in figures["target_line"].legends[0].get_texts()]


def test_figures_are_byte_identical(tmp_path: Path):
    from gradleak.report.figures import save_figure

    paths = [save_figure(attribute_tradeoff(_attribute()), tmp_path / f"a{i}.png") for i in (0, 1)]
    assert paths[0].read_bytes() == paths[1].read_bytes()


def test_a_line_figure_of_several_metrics_draws_a_curve_per_metric(figures):
    fig = figures["target_metrics"]
    assert set(_series(fig)) == {"PSNR (dB)", "SSIM"}
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert list(lines["SSIM"].get_ydata()) == [0.5, 0.5]
    assert sorted(lines["_paper PSNR (dB)"].get_ydata()) == [9.0, 12.0]  # only PSNR's


def test_a_layers_figure_draws_the_median_error_per_layer_on_a_log_axis(figures):
    """GIAS Figs. A1, A2: one panel per model, one curve per attack over its layers (input
    first), the median of the victims on a log y axis; rows without layer errors are left out."""
    fig = figures["target_layers"]
    assert [ax.get_title() for ax in fig.axes] == ["model = cnn10", "model = cnn6"]
    assert all(ax.get_yscale() == "log" for ax in fig.axes)
    assert set(_series(fig)) == {"rgap", "rgap_prior1"}
    cnn6 = {line.get_label(): line for line in fig.axes[1].get_lines()}
    assert list(cnn6["rgap"].get_xdata()) == list(range(1, 8))
    assert np.allclose(cnn6["rgap_prior1"].get_ydata()[0], 0.3 * 1.5)  # median of 0.3, 0.6
    assert np.allclose(cnn6["rgap"].get_ydata(), [1.5e-6 * 10 ** (-r / 3) for r in range(7)])
    empty = layers_figure({"kind": "layers"}, TargetInputs(_victims(), EMPTY, EMPTY, EMPTY), "t")
    assert "no per-layer errors" in empty.axes[0].texts[0].get_text()
