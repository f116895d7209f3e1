"""Refiner Figs. 8, 9, 11-13: the privacy-line grid (Fig. 8), App. D's non-IID split (a label
distribution per client, Fig. 13) and the cases and selections of config/paper/refiner.yaml."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import REPO

from gradleak import config as cfg
from gradleak import data
from gradleak.experiment import configuration, plan
from gradleak.report import privacy_grid
from gradleak.report.target_data import TargetInputs
from gradleak.report.targets import FIGURES, write_target
from gradleak.utils.io import save_image_grid

# --------------------------------------------------------------------------------------
# Fig. 8: the privacy-line grid


def test_grid_tiles_reads_back_the_attack_jobs_grid(tmp_path):
    truths, recs = torch.rand(2, 3, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    save_image_grid(torch.cat([truths, recs]), tmp_path / "recon_gga.png", nrow=3)
    got_truths, got_recs = privacy_grid.grid_tiles(tmp_path / "recon_gga.png")
    assert got_truths.shape == got_recs.shape == (3, 3, 8, 8)
    assert (got_truths - truths).abs().max() <= 0.5 / 255 + 1e-6
    assert (got_recs - recs).abs().max() <= 0.5 / 255 + 1e-6


def test_grid_tiles_refuses_a_grid_of_other_images(tmp_path):
    save_image_grid(torch.rand(3, 3, 8, 12), tmp_path / "recon_x.png", nrow=3)  # one row
    with pytest.raises(ValueError, match=r"recon_x.png: a 12x\d+ grid is not two rows of square "
                                         r"images with 2-pixel padding"):
        privacy_grid.grid_tiles(tmp_path / "recon_x.png")


def _inputs(tmp_path, cells: dict[tuple[str, float], float]) -> TargetInputs:
    """Details folders of one GGA job per (defense, strength): the truth a smooth image, the
    reconstruction the truth blended with ``share`` noise."""
    side = torch.linspace(0, 1, 16)
    truth = torch.stack([side[:, None] * side[None, :], side[None, :].expand(16, 16),
                         1 - side[:, None].expand(16, 16)])[None]
    rows = []
    for i, ((defense, strength), share) in enumerate(cells.items()):
        folder = tmp_path / f"job{i}"
        noise = torch.rand(truth.shape, generator=torch.Generator().manual_seed(i))
        save_image_grid(torch.cat([truth, (1 - share) * truth + share * noise]),
                        folder / "recon_gga.png", nrow=1)
        rows.append({"case": "cifar10-lenet-iid-k10", "dataset": "cifar10", "model": "lenet",
                     "defense": defense, "strength": strength, "series": "", "seed": 0,
                     "attack": "gga", "snapshots": [], "details": str(folder)})
    empty = pd.DataFrame()
    return TargetInputs(empty, empty, empty, pd.DataFrame(rows))


SPEC = {"kind": "privacy_grid", "privacy_metric": "ssim", "privacy_noise": 0.6}


def test_the_privacy_line_falls_before_the_first_reconstruction_less_like_the_truth_than_its_blend(
        tmp_path):
    """Noise shares 0, 0.2, 0.9 under DP (stronger: higher) and 0.95, 0.3, 0 at 1, 4, 8 bits
    (stronger: fewer bits): in both rows the line falls before the third cell, weakest
    first, where the reconstruction is noisier than the truth's 0.6 blend."""
    inputs = _inputs(tmp_path, {("dp_gaussian", 1e-3): 0.0, ("dp_gaussian", 1e-2): 0.2,
                                ("dp_gaussian", 1e-1): 0.9, ("quantization", 1): 0.95,
                                ("quantization", 4): 0.3, ("quantization", 8): 0.0})
    cells = privacy_grid.privacy_cells(SPEC, inputs)
    assert cells["private"].tolist() == [False, False, True, True, False, False]
    assert (cells["threshold"] > 0).all() and cells["threshold"].nunique() == 1
    dp = cells[cells["defense"] == "dp_gaussian"].sort_values("strength")
    gq = cells[cells["defense"] == "quantization"].sort_values("strength", ascending=False)
    assert privacy_grid.privacy_line(dp.reset_index(drop=True)) == 2
    assert privacy_grid.privacy_line(gq.reset_index(drop=True)) == 2
    never = cells[cells["defense"] == "dp_gaussian"].iloc[:2].reset_index(drop=True)
    assert privacy_grid.privacy_line(never) is None


def test_the_figure_draws_one_red_line_per_row_weakest_strength_first(tmp_path):
    inputs = _inputs(tmp_path, {("dp_gaussian", 1e-3): 0.0, ("dp_gaussian", 1e-1): 0.9,
                                ("quantization", 1): 0.95, ("quantization", 8): 0.0,
                                ("refiner", 0.1): 0.0})
    figure = privacy_grid.privacy_grid_figure(SPEC, inputs, "Fig. 8")
    axes = np.array(figure.axes).reshape(3, 3)
    titles = [[ax.get_title() for ax in row] for row in axes]
    assert titles == [["truth", "0.001", "0.1"], ["truth", "8", "1"], ["truth", "0.1", ""]]
    lined = [[ax.spines["left"].get_visible() and ax.spines["left"].get_edgecolor()[:3]
              == (1.0, 0.0, 0.0) for ax in row] for row in axes]
    assert lined == [[False, False, True], [False, False, True], [False, False, False]]
    result = write_target("fig8", {"title": "Fig. 8", "figure": SPEC}, inputs, None,
                          tmp_path / "out")
    assert [f.name for f in result.files] == ["fig8.png"]


def test_every_figure_kind_of_the_schema_is_drawn(monkeypatch):
    kinds = cfg.schema()["definitions"]["figure"]["properties"]["kind"]["enum"]
    assert sorted(kinds) == sorted(FIGURES)
    # the grid's module (torch) loads with its first figure: the kind draws through it
    monkeypatch.setattr(privacy_grid, "privacy_grid_figure", lambda *args: ("grid", args))
    assert FIGURES["privacy_grid"](1, 2) == ("grid", (1, 2))


def test_the_privacy_metric_is_checked(tmp_path):
    inputs = _inputs(tmp_path, {("dp_gaussian", 1e-3): 0.0})
    with pytest.raises(ValueError, match=r"privacy_metric 'lpips'; expected one of "
                                         r"\['psnr', 'ssim'\]"):
        privacy_grid.privacy_cells({**SPEC, "privacy_metric": "lpips"}, inputs)


# --------------------------------------------------------------------------------------
# Fig. 13: Refiner App. D's non-IID split


def test_client_dirichlet_gives_each_client_its_drawn_label_distribution():
    labels = np.repeat(np.arange(10), 400)
    shards = data.partition(labels, "client_dirichlet", 10, np.random.default_rng(3), 1.0)
    drawn = np.random.default_rng(3).dirichlet(np.ones(10), size=10)  # the first draw
    sizes = {len(s) for s in shards}
    assert len(sizes) == 1 and 0 < sizes.pop() <= 400
    n = len(shards[0])
    for shard, p in zip(shards, drawn, strict=True):
        counts = np.bincount(labels[shard], minlength=10)
        assert counts.sum() == n and np.abs(counts - n * p).max() < 1
    every = np.concatenate(shards)
    assert len(every) == len(np.unique(every))  # no sample twice
    # the largest size the classes can supply: one more sample per client (at most two more
    # of a class each, by the rounding) would overdraw some class
    assert np.bincount(labels[every], minlength=10).max() > 400 - 2 * 10
    again = data.partition(labels, "client_dirichlet", 10, np.random.default_rng(3), 1.0)
    assert all(np.array_equal(a, b) for a, b in zip(shards, again, strict=True))


def test_client_dirichlet_skew_follows_alpha():
    labels = np.repeat(np.arange(10), 300)

    def top_share(alpha: float) -> float:
        shards = data.client_dirichlet_partition(labels, 10, alpha, np.random.default_rng(0))
        return float(np.mean([np.bincount(labels[s], minlength=10).max() / len(s)
                              for s in shards]))

    assert top_share(0.1) > 0.6 and top_share(100.0) < 0.2  # uniform: 0.1 each
    assert top_share(0.1) > top_share(1.0) > top_share(100.0)


def test_client_dirichlet_refuses_data_too_small():
    with pytest.raises(ValueError, match=r"client_dirichlet partition: the 3 samples cannot give "
                                         r"each of 3 clients one sample"):
        data.client_dirichlet_partition(np.array([0, 1, 2]), 3, 0.01, np.random.default_rng(0))


# --------------------------------------------------------------------------------------
# config/paper/refiner.yaml: Figs. 8-13 beside the earlier targets


def test_a_selection_picks_cases_by_partition_kind():
    config = configuration.validate({
        "cases": [{"dataset": "digits", "model": "lenet"},
                  {"dataset": "digits", "model": "lenet",
                   "partition": {"kind": "client_dirichlet", "alpha": 1.0}}],
        "defenses": {"none": {"strengths": [0]}}, "attacks": {"idlg": {}},
        "targets": {"a": {"title": "a", "select": [{"partitions": ["client_dirichlet"]}]},
                    "b": {"title": "b", "select": [{"partitions": ["iid"]}]}}})
    cases = {p.target: p.case for p in plan.points(config)}
    assert cases == {"a": "digits-lenet-clientdirichlet1-k10", "b": "digits-lenet-iid-k10"}
    with pytest.raises(cfg.ConfigError, match=r"'targets.a.select\[0\].partitions\[0\]': "
                                              r"'noniid' is not one of"):
        configuration.validate(
            {"targets": {"a": {"title": "a", "select": [{"partitions": ["noniid"]}]}}})


@pytest.mark.parametrize("scale", ["full", "smoke"])
def test_refiner_reads_the_new_cases_only_in_figs_11_to_13(scale):
    raw = cfg.read(REPO / "config" / "paper" / "refiner.yaml")
    config = configuration.validate({**raw, "scale": scale})
    cases: dict[str, set[str]] = {}
    for point in plan.points(config):
        cases.setdefault(point.target, set()).add(point.case)
    main = "cifar10-lenet-iid-k10"
    assert cases["fig11"] == {"cifar10-resnet10-iid-k10", "cifar10-resnet18-iid-k10"}
    assert cases["fig12"] == {"svhn-lenet-iid-k10", "cifar100-lenet-iid-k10"}
    assert cases["fig13"] == {"cifar10-lenet-clientdirichlet1-k10", main}
    for name in ("fig7", "fig8", "fig9", "fig10", "table6", "table7", "table8", "table9"):
        assert cases[name] == {main}, name
    # Figs. 8 and 9 and Fig. 13's IID series add no run to Fig. 7's
    fig7 = {(p.case, p.setting) for p in plan.points(config) if p.target == "fig7"}
    reused = {(p.case, p.setting) for p in plan.points(config)
              if p.target in ("fig8", "fig9") or (p.target == "fig13" and p.case == main)}
    assert reused <= fig7
