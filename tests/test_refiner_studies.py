"""Refiner's studies of its evaluation network and initialisation (Figs. 4, 5, 6) and its
robust data's distance from x (Table 10): the defense's own optimisation, returned."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import REPO

from gradleak import config, defenses, metrics
from gradleak.defenses.refiner import layer_weights, project_to_ball
from gradleak.experiment import configuration, paths, pipeline, plan
from gradleak.experiment.phases.prepare_data import prepare_data
from gradleak.experiment.phases.study import inputs as study_inputs
from gradleak.experiment.phases.study import run as run_study
from gradleak.experiment.phases.target import write_target
from gradleak.experiment.phases.train_evalnet import train_evalnet
from gradleak.experiment.studies.evalnet_blend import blend_predictions
from gradleak.experiment.studies.registry import load as load_study
from gradleak.models import LeNet
from gradleak.report import load_target
from gradleak.report.reference import compare
from gradleak.types import Update

REFINER = config.read(REPO / "config" / "paper" / "refiner.yaml")
RATIOS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]


def _before_the_refactor(defense, ctx: defenses.DefenseContext) -> Update:
    """Refiner's upload as the defense computed it in one loop before x* was exposed."""
    true = ctx.true_gradient()
    weights = layer_weights(ctx.model, true, defense.tau)
    noise = torch.rand(ctx.x.shape, generator=ctx.rng)
    robust = ((1 - defense.alpha) * ctx.x + defense.alpha * noise).requires_grad_(True)
    for _ in range(defense.iterations):
        trial = Update.of(ctx.model, robust, ctx.y, create_graph=True)
        utility = sum(((weights[k] * (trial[k] - true[k])) ** 2).sum() for k in true)
        (step,) = torch.autograd.grad(utility - defense.beta * defense.evalnet(robust).mean(),
                                      robust)
        with torch.no_grad():
            robust -= defense.lr * step
            robust.clamp_(0, 1)
    uploaded = Update.of(ctx.model, robust.detach(), ctx.y).detached()
    norm = float(torch.sqrt(sum((g ** 2).sum() for g in true.values())))
    return project_to_ball(uploaded, true, defense.epsilon * norm)


@pytest.fixture()
def batch(digits):
    torch.manual_seed(0)
    model = LeNet(1, 10, 32)
    return lambda seed=3: defenses.DefenseContext(model, digits.x[:4], digits.y[:4],
                                                  torch.Generator().manual_seed(seed))


def test_the_returned_x_star_is_what_the_defense_uploads_the_gradient_of(natural_evalnet,
                                                                         batch):
    defense = defenses.build("refiner", evalnet=natural_evalnet, epsilon=0.3, iterations=3)
    upload = defense(batch())
    before = _before_the_refactor(defense, batch())
    assert all(torch.equal(upload[k], before[k]) for k in before)  # same uploads as before
    ctx = batch()
    robust = defense.robust_data(ctx)
    true = ctx.true_gradient()
    norm = float(torch.sqrt(sum((g ** 2).sum() for g in true.values())))
    again = project_to_ball(Update.of(ctx.model, robust, ctx.y).detached(), true, 0.3 * norm)
    assert all(torch.equal(upload[k], again[k]) for k in upload)
    assert upload.info["robust_mse"] == float(((robust - ctx.x) ** 2).mean()) > 0
    ctx = batch()
    start = defense.start(ctx)
    path = defense.refine(ctx, start)
    assert len(path) == 3 and torch.equal(path[-1], robust)
    assert not torch.equal(path[0], path[1])  # one x* per step


def test_refining_from_x_keeps_x_and_from_the_blend_makes_noise(natural_evalnet, digits):
    """Fig. 6 on three digits: from x, 10 steps at lr 1 leave x* like x (SSIM); from the
    alpha = 0.5 blend, x* ends far from x and scored noisier by the evaluation network."""
    ends = {"x": [], "blend": []}
    for i in range(3):
        torch.manual_seed(i)
        ctx = defenses.DefenseContext(LeNet(1, 10, 32), digits.x[i:i + 1], digits.y[i:i + 1],
                                      torch.Generator().manual_seed(i))
        defense = defenses.build("refiner", evalnet=natural_evalnet)
        for init, start in (("x", ctx.x), ("blend", defense.start(ctx))):
            robust = defense.refine(ctx, start)[-1]
            ends[init].append((float(metrics.ssim(robust, ctx.x)),
                               float(metrics.noise_ratio(robust, natural_evalnet))))
    (ssim_x, noise_x), (ssim_blend, noise_blend) = (np.mean(ends[k], axis=0) for k in ends)
    print(f"from x: SSIM {ssim_x:.3f}, noise {noise_x:.3f}; "
          f"from the blend: SSIM {ssim_blend:.3f}, noise {noise_blend:.3f}")
    assert ssim_x > ssim_blend + 0.2
    assert noise_blend > noise_x + 0.3


def test_blend_predictions_rise_with_the_noise_ratio(natural_evalnet, digits):
    """Fig. 4 on digits the network never saw: every step of 0.1 raises the mean prediction;
    Fig. 5's strip is the first image at every ratio."""
    images = digits.x[:200]
    strip, predictions = blend_predictions(natural_evalnet, images, [0.0, *RATIOS],
                                           torch.Generator().manual_seed(0))
    assert strip.shape == (10, *images.shape[1:]) and predictions.shape == (10, 200)
    assert torch.equal(strip[0], images[0])  # ratio 0: the image itself
    means = predictions.mean(1).numpy()
    print("mean predictions: " + ", ".join(f"{m:.3f}" for m in means))
    assert np.all(np.diff(means) > 0)


@pytest.mark.slow
def test_the_studies_plan_evaluation_networks_and_no_run():
    refiner = configuration.validate(copy.deepcopy(REFINER))
    assert {"fig4", "fig5", "fig6"} <= set(plan.studies(refiner))
    points = plan.points(refiner)
    assert all(p.target not in {"fig4", "fig5", "fig6"} for p in points)
    results = paths.Path("r")
    assert paths.evalnet_file(results, "svhn") in study_inputs(refiner, results, "fig4")
    assert study_inputs(refiner, results, "fig6") == [
        paths.data_manifest(results, "cifar10"), paths.evalnet_file(results, "cifar10")]
    outputs = pipeline.outputs_of(refiner, results, ["train_evalnet"],
                                  pipeline.walk(refiner, results))
    assert {paths.evalnet_file(results, d) for d in ("svhn", "cifar10", "cifar100")} <= set(
        outputs)
    # Table 10 reads the runs Fig. 7 plans: no run of its own
    fig7 = {(p.case, p.setting) for p in points if p.target == "fig7"}
    table10 = {(p.case, p.setting) for p in points if p.target == "table10"}
    assert table10 and table10 <= fig7


@pytest.mark.parametrize("target, change, message", [
    ("fig4", lambda s: s.update(datasets=["svhn", "cifar11"]),
     r"'targets.fig4.study.datasets': 'cifar11' is not a configured dataset"),
    ("fig4", lambda s: s.update(ratios=[0.5, 1.5]), r"targets.fig4.study.ratios"),
    ("fig6", lambda s: s.update(defense="dp_gaussian"),
     r"'targets.fig6.study.defense': 'dp_gaussian' is not a configured refiner defense label "
     r"\(expected one of \['refiner'\]\)"),
    ("fig6", lambda s: s.update(model="vgg"), r"targets.fig6.study.model"),
    ("fig6", lambda s: s.update(kind="refiner_start"),
     r"'targets.fig6.study.kind': 'refiner_start' is not one of \['perturbation'"),
])
def test_a_bad_study_is_refused_naming_the_key(target, change, message):
    bad = copy.deepcopy(REFINER)
    change(bad["targets"][target]["study"])
    with pytest.raises(config.ConfigError, match=message):
        configuration.validate(bad)


def test_more_images_than_a_listed_dataset_holds_is_refused():
    bad = {**copy.deepcopy(REFINER), "scale": "smoke"}
    bad["smoke_overrides"]["targets"]["fig4"]["study"]["images"] = 5000
    with pytest.raises(config.ConfigError, match=r"'targets.fig4.study.images' 5000 is more than "
                                                 r"the test split of 'svhn' holds"):
        configuration.validate(bad)


@pytest.fixture(scope="module")
def smoke_results(tmp_path_factory):
    """The smoke configuration's prepared stand-ins and evaluation networks, twice."""
    smoke = configuration.validate({**copy.deepcopy(REFINER), "scale": "smoke"})
    roots = [tmp_path_factory.mktemp(f"results{i}") for i in range(2)]
    for root in roots:
        for dataset in ("natural", "svhn", "cifar10", "cifar100"):
            prepare_data(smoke, root, dataset)
        for dataset in ("svhn", "cifar10", "cifar100"):
            train_evalnet(smoke, root, dataset)
    return smoke, roots


@pytest.mark.slow
@pytest.mark.parametrize("name, shape, rows", [
    ("fig4", (3, 9, 3, 32, 32), 27),
    ("fig5", (3, 10, 3, 32, 32), 30),
    ("fig6", (2, 3, 3, 32, 32), 6),  # the smoke refiner's 2 steps and the start, per init
])
def test_a_study_writes_the_same_bytes_twice_and_its_figure(smoke_results, name, shape, rows):
    smoke, roots = smoke_results
    for root in roots:
        run_study(smoke, root, name)
    out = [paths.study_dir(root, name) for root in roots]
    for file in ("metrics.json", "images.npy", "images_titles.npy", "images_rows.npy"):
        assert (out[0] / file).read_bytes() == (out[1] / file).read_bytes()
    measured = load_study(roots[0], name)
    assert measured.arrays["images"].shape == shape
    assert measured.arrays["images_titles"].shape == shape[:2]
    assert len(measured.rows) == rows
    write_target(smoke, roots[0], name)
    result = load_target(paths.target_dir(roots[0], name))
    assert (paths.target_dir(roots[0], name) / f"{name}.png").stat().st_size > 0
    if name == "fig5":  # one image: the rows are the strip's own predictions
        assert list(measured.arrays["images_rows"]) == ["svhn", "cifar10", "cifar100"]
        for d, dataset in enumerate(measured.arrays["images_rows"]):
            ours = [f"{r['ratio']:g}: {r['noise_ratio']:.3f}" for r in measured.rows
                    if r["dataset"] == dataset]
            assert list(measured.arrays["images_titles"][d]) == ours
        assert isinstance(result.comparison, pd.DataFrame) and len(result.comparison) == 27
    if name == "fig6":
        table = result.table.set_index(["init", "iteration"])
        assert table.loc[("x", 0), "mse"] == 0 and table.loc[("x", 0), "ssim"] == 1
        assert table.loc[("blend", 0), "mse"] > 0.01


def test_a_study_with_more_images_than_prepared_fails_before_measuring(tmp_path):
    """Before measuring: with the studies' data prepared and no evaluation network trained."""
    bad = configuration.validate({**copy.deepcopy(REFINER), "scale": "smoke"})
    for dataset in ("svhn", "cifar10"):
        prepare_data(bad, tmp_path, dataset)
    bad["targets"]["fig6"]["study"]["images"] = 10_000
    with pytest.raises(ValueError, match=r"refiner_init study: 'images' 10000 is more than the "
                                         r"\d+ test images of 'cifar10'"):
        run_study(bad, tmp_path, "fig6")
    bad["targets"]["fig4"]["study"]["images"] = 10_000
    with pytest.raises(ValueError, match=r"evalnet_blend study: 'images' 10000 is more than "
                                         r"the \d+ test images of 'svhn'"):
        run_study(bad, tmp_path, "fig4")


def test_table10_compares_only_the_numbers_the_paper_prints():
    """Table 10's reference leaves robust_mse out of the undefended rows and sigma out of
    Refiner's: those pairs are not counted for or against the paper's order."""
    reference = copy.deepcopy(REFINER["reference"]["table10"])
    ours = pd.DataFrame(
        [["none", a, m, np.nan] for a, m in (("idlg", 1e-4), ("gradinversion", 5e-4),
                                             ("inverting_gradients", 4e-4), ("gga", 6e-3))]
        + [["refiner", a, 0.05, 0.08] for a in ("idlg", "gradinversion",
                                                 "inverting_gradients", "gga")],
        columns=["defense", "attack", "mse", "robust_mse"])
    comparison, agreement = compare(ours, ["defense", "attack"], reference)
    assert len(comparison) == 8
    assert agreement == {"mse": "6/6", "robust_mse": "-"}
