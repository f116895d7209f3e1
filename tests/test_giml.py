"""GIML (Jeon et al., NeurIPS 2021, §4.2, §5.3, Fig. 6b) on real digits.

GIML's setting: no pretrained generator, only a set of observed gradients. The
meta-learning starts from a randomly initialised DCGAN generator (DCGAN init)
and sees the gradients of 8 digits from the train split (DLG's LeNet, one image
per update, labels by iDLG). Budgets are cut to run on one CPU thread: 8 outer
steps (one pass, one task per step) of 100 latent + 100 parameter iterations,
and the meta update is Alg. 2's own w <- w - beta (w - w') with beta = 0.5
(``meta_optimizer="sgd"``): the official Adam lr 1e-2 is meant for 200 steps,
and over 8 its sign-like first steps made the generator worse after 2-3 steps
on one of two victim draws. Each evaluation runs GI-z/w (100 + 100 iterations,
one start) on 4 of the 8 digits.

The pipeline's part of Fig. 6 and Fig. A4 (tiny budgets, seconds): GIML's generator kept at
'giml.checkpoints' and chosen by an attack's ``step``, a prior of another dataset
(``prior_dataset``, its own train_gan job), and the figures' levels and aligned traces.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradleak import attacks, defenses, metrics
from gradleak.attacks.giml import meta_learn_generator
from gradleak.experiment import configuration
from gradleak.experiment.job import build_model
from gradleak.experiment.phases.prepare_data import prepare_data
from gradleak.experiment.phases.train_giml import train_giml
from gradleak.models import Generator, LeNet
from gradleak.models.dcgan import init_weights

STEPS, INNER = 8, 100
EVALUATED = 4
META = {"meta_optimizer": "sgd", "meta_lr": 0.5}
GIML_DEFAULTS = configuration.validate({})["giml"]  # the schema's giml: block


def learn(observations, generator, steps: int, **params):
    """meta_learn_generator with the schema's defaults for what ``params`` leave out."""
    keys = ("tasks_per_step", "latent_iterations", "parameter_iterations", "lr_z", "lr_w",
            "meta_optimizer", "meta_lr", "tv", "z_norm", "seed")
    return meta_learn_generator(observations, generator, outer_steps=steps,
                                **{**{k: GIML_DEFAULTS[k] for k in keys}, **params})


@pytest.fixture(autouse=True)
def _native_convolutions():
    """oneDNN is ~2x slower than the native kernels on these tiny double-backward convolutions."""
    enabled = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    yield
    torch.backends.mkldnn.enabled = enabled


def random_generator(seed: int = 0) -> Generator:
    torch.manual_seed(seed)
    generator = Generator(100, 1, 32)
    generator.apply(init_weights)
    return generator.eval()


def observations(images, count: int, seed: int = 2024):
    """(observation, image) pairs: one train-split digit per update, a fresh LeNet each."""
    out = []
    for i, j in enumerate(np.random.default_rng(seed).choice(len(images.y), count, replace=False)):
        torch.manual_seed(i)
        model, x, y = LeNet(1, 10, 32), images.x[j:j + 1], images.y[j:j + 1]
        grad = defenses.build("none")(defenses.DefenseContext(model=model, x=x, y=y))
        out.append((attacks.Observation(model=model, gradient=grad, batch_size=1), x))
    return out


def gias_psnr(generator, pairs) -> float:
    attack = attacks.build("giml", generator=generator, latent_iterations=INNER,
                           parameter_iterations=INNER, restarts=1)
    return float(np.mean([metrics.psnr(attack(obs).images, x) for obs, x in pairs]))


def test_arguments_are_checked(digits_splits):
    (obs, _), = observations(digits_splits["train"], 1)
    with pytest.raises(ValueError, match="at least one observation"):
        learn([], random_generator(), 1)
    with pytest.raises(ValueError, match="tasks_per_step must be in"):
        learn([obs], random_generator(), 1, tasks_per_step=2)
    with pytest.raises(ValueError, match="meta_optimizer must be one of"):
        learn([obs], random_generator(), 1, meta_optimizer="rmsprop")
    with pytest.raises(ValueError, match="latent_dim"):
        learn([obs], torch.nn.Linear(100, 1024), 1)
    with pytest.raises(ValueError, match="needs generator="):
        attacks.build("giml")


def test_meta_learning_leaves_the_input_generator_alone(digits_splits):
    pairs = observations(digits_splits["train"], 2)
    start = random_generator()
    before = {k: v.clone() for k, v in start.state_dict().items()}
    seen = []
    meta, log = learn([obs for obs, _ in pairs], start, 2, latent_iterations=3,
                      parameter_iterations=2, callback=lambda step, _g, _e: seen.append(step))
    assert all(torch.equal(before[k], v) for k, v in start.state_dict().items())
    assert seen == [1, 2] and [e["step"] for e in log] == [1, 2]
    assert sorted(e["tasks"][0] for e in log) == [0, 1]  # one pass over the set
    assert not meta.training and all(e["meta_gap"] > 0 for e in log)


@pytest.mark.slow
def test_meta_learned_generator_improves_gias_over_steps_and_over_random(digits_splits):
    """Fig. 6b: GI-z/w with the GIML generator improves with the outer steps and beats
    GI-z/w from the untrained generator it started from."""
    pairs = observations(digits_splits["train"], STEPS)
    evaluated = pairs[:EVALUATED]
    start = random_generator()
    untrained = gias_psnr(start, evaluated)
    psnr = {}

    def evaluate(step: int, generator, _entry: dict) -> None:
        if step in (1, STEPS):
            psnr[step] = gias_psnr(generator, evaluated)

    learn([obs for obs, _ in pairs], start, STEPS, latent_iterations=INNER,
          parameter_iterations=INNER, callback=evaluate, **META)
    print(f"GIML: GI-z/w mean PSNR untrained {untrained:.2f} dB, after step 1 {psnr[1]:.2f} dB, "
          f"after step {STEPS} {psnr[STEPS]:.2f} dB")
    assert psnr[STEPS] > psnr[1] + 2.0
    assert psnr[STEPS] > untrained + 5.0


# ---------------------------------------------------------------------------------------
# GIAS Fig. 6 and Fig. A4 in the pipeline: GIML's generator kept at several outer steps
# (attacks.<label>.step), against a prior trained on another dataset (prior_dataset) and
# an untrained one. Tiny budgets: the phases and the artifacts' resolution, not the numbers.

def fig6_config(**giml) -> dict:
    """Victims: digits; GIML kept at steps 0, 1 and the final 3; GI-z/w with the prior of
    digits (gan.dataset) and of natural crops (a wrong prior); GI-w untrained."""

    budget = {"latent_iterations": 2, "parameter_iterations": 2, "restarts": 1}
    return configuration.validate({
        "threads": 1,
        "datasets": {"digits": {"channels": 1}, "natural": {"channels": 3, "count": 60}},
        "cases": [{"dataset": "digits", "model": "lenet",
                   "partition": {"kind": "iid", "clients": 2}}],
        "fl": {"seeds": [0], "rounds": 1},
        "defenses": {"none": {"strengths": [0]}},
        "attack": {"victims": {"count": 1}, "attacker": {"seeds": [0]},
                   "outputs": {"grid_victims": 1, "metrics": ["psnr"]}},
        "attacks": {"giml_zw": {"attack": "giml", **budget},
                    "right_zw": {"attack": "gias", **budget},
                    "wrong_zw": {"attack": "gias", "prior_dataset": "natural", **budget},
                    "untrained_w": {"attack": "gias", "variant": "w", "prior": "untrained",
                                    **budget}},
        "giml": {"observations": 2, "outer_steps": 3, "checkpoints": [0, 1],
                 "latent_iterations": 2, "parameter_iterations": 2, "latent_dim": 16,
                 "width": 8, **giml},
        "gan": {"dataset": "digits", "split": "train", "epochs": 1, "width": 8,
                "latent_dim": 16},
        "targets": {"fig6": {
            "title": "Fig. 6(b)",
            "select": [{"attacks": ["giml_zw"], "sweep": {"attacks.giml_zw.step": [0, 1, 3]}},
                       {"attacks": ["right_zw", "wrong_zw", "untrained_w"]}],
            "figure": {"kind": "line", "x": "step", "y": "psnr", "hue": "attack"}}},
    })


CASE = "digits-lenet-iid-k2"


def _prepared(tmp_path, conf):
    """The digits and natural splits, and a round-0 LeNet where the FL run would save it."""
    from gradleak import data
    from gradleak.experiment import paths, plan
    from gradleak.utils.io import save_torch

    for dataset in ("digits", "natural"):
        prepare_data(conf, tmp_path, dataset)
    train = data.load_prepared(paths.data_dir(tmp_path, "digits"), "train")
    torch.manual_seed(0)
    model = build_model(plan.find_case(conf, CASE), train)
    save_torch(paths.checkpoint(tmp_path, CASE, plan.NONE, 0, 0), model.state_dict())
    return model


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_giml_keeps_its_checkpoints_and_the_step_parameter_selects_one(tmp_path):
    """Fig. 6(a)/(b): train-giml keeps the generator at 'giml.checkpoints' (0: the random
    start) and the final step, distinct, with one sample row per step from the same codes;
    attacks.<label>.step loads that step's weights, null the final."""
    from PIL import Image

    from gradleak.experiment import artifacts, paths, plan
    from gradleak.experiment.job import Job
    from gradleak.experiment.phases.attack import build_attack, needed
    from gradleak.models.dcgan import load_generator
    from gradleak.utils.io import ArtifactError, load_torch, read_json

    conf = fig6_config()
    model = _prepared(tmp_path, conf)
    train_giml(conf, tmp_path, CASE)
    out = paths.giml_file(tmp_path, CASE)
    saved = load_torch(out)
    kept = saved["checkpoints"]
    assert sorted(kept) == [0, 1, 3] and read_json(out.with_suffix(".json"))["checkpoints"] == [
        0, 1, 3]
    assert _same(kept[3], saved["generator"])
    assert not any(_same(kept[a], kept[b]) for a, b in ((0, 1), (1, 3), (0, 3)))
    width, height = Image.open(out.with_suffix(".png")).size
    assert (width, height) == (8 * 34 + 2, 3 * 34 + 2)  # 8 samples x one row per step

    steps = {}
    for (case, setting), labels in plan.jobs(conf).items():
        if "giml_zw" in labels:
            job = Job(conf, tmp_path, case, setting, 0)
            assert artifacts.files(job, needed(job)) == [out]
            built = build_attack(job, "giml_zw", model, None, 0)
            steps[setting.config_overrides.get("attacks.giml_zw.step")] = built.generator
    assert sorted(steps, key=str) == [0, 1, 3]
    for step, generator in steps.items():
        assert _same(generator.state_dict(), kept[step]), step
    assert _same(load_generator(out).state_dict(), saved["generator"])  # step null: the final
    with pytest.raises(ArtifactError, match=r"holds no generator of GIML step 2 \(it holds "
                                            r"steps \[0, 1, 3\]"):
        load_generator(out, step=2)


def test_a_prior_of_another_dataset_resolves_its_own_gan_file(tmp_path, capsys):
    """Fig. 6's wrong prior: prior_dataset natural loads results/gan/natural.pt (trained by
    `gradleak train-gan --dataset natural`, on 3-channel crops), gan.dataset's label
    results/gan/digits.pt; the plan trains both and prepares both datasets."""
    import yaml

    from gradleak import cli
    from gradleak.experiment import artifacts, paths, pipeline, plan
    from gradleak.experiment.job import Job
    from gradleak.experiment.phases.attack import build_attack, needed
    from gradleak.models.dcgan import load_generator

    conf = fig6_config()
    model = _prepared(tmp_path, conf)
    job = Job(conf, tmp_path, CASE, plan.NONE, 0)
    assert job.attacks == ("right_zw", "untrained_w", "wrong_zw")
    gans = [paths.gan_file(tmp_path, d) for d in ("digits", "natural")]
    assert needed(job) == ["gan", "gan:natural", "untrained_gan"]
    assert artifacts.files(job, needed(job)) == sorted(
        [*gans, paths.data_manifest(tmp_path, "digits")])
    jobs = pipeline.walk(conf, tmp_path)
    assert [p for p in pipeline.outputs_of(conf, tmp_path, ["train_gan"], jobs)
            if p.suffix == ".pt"] == gans
    assert pipeline.outputs_of(conf, tmp_path, ["prepare_data"], jobs) == [
        paths.data_manifest(tmp_path, d) for d in ("digits", "natural")]

    path = tmp_path / "fig6.yaml"
    path.write_text(yaml.safe_dump(conf))
    assert cli.main(["train-gan", "--config", str(path), "--results", str(tmp_path),
                     "--dataset", "natural"]) == 0, capsys.readouterr().err
    assert gans[1].is_file() and not gans[0].is_file()
    wrong = build_attack(job, "wrong_zw", model, None, 0).generator
    assert _same(wrong.state_dict(), load_generator(gans[1]).state_dict())
    assert wrong(torch.zeros(1, 16)).shape[1] == 3  # natural's channels; digits' model: 1
    untrained = build_attack(job, "untrained_w", model, None, 0).generator
    assert untrained(torch.zeros(1, 16)).shape[1] == 1  # gan.dataset's channels


@pytest.mark.slow
def test_two_prior_datasets_plan_two_train_gan_jobs(tmp_path):
    """The Snakefile's dry run: one train_gan job per prior dataset, each told its dataset."""
    import yaml
    from project import SNAKEMAKE, copy_project, run

    root = copy_project(tmp_path / "project")
    (root / "config" / "fig6.yaml").write_text(yaml.safe_dump(fig6_config()))
    proc = run([*SNAKEMAKE, "-n", "-p", "--configfile", "config/fig6.yaml"], root)
    assert proc.stdout.count("rule train_gan:") == 2, proc.stdout
    for dataset in ("digits", "natural"):
        assert f"train-gan --config results/config.resolved.json --dataset {dataset}" \
            in proc.stdout
    assert proc.stdout.count("rule train_giml:") == 1


def test_a_series_its_selection_does_not_sweep_is_a_level_in_the_line_figure():
    """Fig. 6(b): PSNR against the GIML step, the wrong prior and GI-w untrained (no step)
    drawn as horizontal lines in their own colours."""
    import pandas as pd

    from gradleak.report.target_curves import line_figure
    from gradleak.report.target_data import TargetInputs

    frame = pd.DataFrame({"attack": ["giml_zw"] * 3 + ["wrong_zw", "untrained_w"],
                          "step": [0, 1, 3, np.nan, np.nan],
                          "psnr": [10.0, 12.0, 14.0, 11.0, 9.0]})
    empty = pd.DataFrame()
    fig = line_figure({"x": "step", "y": "psnr", "hue": "attack"},
                      TargetInputs(frame, empty, empty, empty), "Fig. 6(b)")
    lines = {}
    for line in fig.axes[0].get_lines():
        if len(line.get_xdata()):
            lines.setdefault(line.get_label(), []).append(line)
    assert list(lines["giml_zw"][0].get_ydata()) == [10.0, 12.0, 14.0]
    for label, level in (("wrong_zw", 11.0), ("untrained_w", 9.0)):
        flat = lines[label][0]
        assert list(flat.get_xdata()) == [0, 1, 3] and list(flat.get_ydata()) == [level] * 3
    styles = {label: (found[0].get_color(), found[0].get_marker(), found[0].get_linestyle())
              for label, found in lines.items()}
    assert len(set(styles.values())) == 3
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert sorted(legend) == ["giml_zw", "untrained_w", "wrong_zw"]


def test_fig_a4_draws_the_attacks_of_one_uploads_in_one_panel_ending_together(tmp_path):
    """Fig. A4: GI-z/w with GIML's generator (a setting with its own `step` override), the
    wrong prior and GI-w untrained share a panel; ``align: end`` starts GI-w (no latent
    search) where the others' parameter search starts."""
    import pandas as pd

    from gradleak.report.target_data import TargetInputs
    from gradleak.report.target_victims import trace_figure
    from gradleak.utils.io import write_json

    runs = [("none~attacks.giml_zw.step=8", "giml_zw", 6), ("none", "wrong_zw", 6),
            ("none", "untrained_w", 3)]
    victims, details = [], []
    for defense, attack, length in runs:
        folder = tmp_path / defense
        write_json(folder / f"traces_{attack}.json", [[1.0 / (i + 1) for i in range(length)]])
        keys = {"case": "c", "dataset": "digits", "defense": defense, "strength": 0.0,
                "series": "", "seed": 0, "attack": attack}
        victims.append({**keys, "victim": 0, "ssim": 0.5})
        details.append({**keys, "details": str(folder), "snapshots": []})
    inputs = TargetInputs(pd.DataFrame(victims), pd.DataFrame(), pd.DataFrame(),
                          pd.DataFrame(details))
    spec = {"kind": "trace", "hue": "attack", "victims": 1, "pick": "first"}
    fig = trace_figure({**spec, "align": "end"}, inputs, "Fig. A4")
    assert len(fig.axes) == 1
    starts = {line.get_label(): list(line.get_xdata()) for line in fig.axes[0].get_lines()}
    assert starts == {"giml_zw": [1, 2, 3, 4, 5, 6], "wrong_zw": [1, 2, 3, 4, 5, 6],
                      "untrained_w": [4, 5, 6]}
    fig = trace_figure(spec, inputs, "Fig. A4")
    assert [list(line.get_xdata())[0] for line in fig.axes[0].get_lines()] == [1, 1, 1]


def test_giml_under_pruning_only_still_plans_the_undefended_run_it_learns_from():
    """Fig. 6 attacks pruned uploads (sparsity 0.95) only: GIML's generator still learns
    from the undefended FL run, which the plan trains (also as the reference whose initial
    model the round-0 attacks load, ``fl_runs.model_setting``), and train_giml reads it; the
    pruned run is not trained (nothing reads its FL metrics or a later round)."""
    from pathlib import Path

    from gradleak.experiment import fl_runs, pipeline, plan

    def trained(conf: dict) -> list:
        """(case, setting) of every FL run the pipeline plans."""
        return sorted({(job["case"], job["setting"])
                       for job in pipeline.walk(conf, Path("results"))["fl_run"]}, key=str)

    conf = configuration.validate({
        "cases": [{"dataset": "digits", "model": "lenet",
                   "partition": {"kind": "iid", "clients": 2}}],
        "defenses": {"pruning": {"strengths": [0.95]}},
        "attacks": {"giml_zw": {"attack": "giml"}, "wrong_zw": {"attack": "gias"}},
        "targets": {"fig6": {"title": "t", "select": [{"defenses": ["pruning"]}]}}})
    undefended = [(CASE, plan.NONE)]
    assert trained(conf) == undefended and fl_runs.fl_settings(conf) == undefended
    giml = [job for job in pipeline.walk(conf, Path("results"))["train_giml"]]
    assert giml and all(job["case"] == CASE for job in giml)
    conf["attacks"].pop("giml_zw")
    conf["targets"]["fig6"]["select"][0]["attacks"] = ["wrong_zw"]
    assert trained(conf) == undefended
    assert not pipeline.walk(conf, Path("results"))["train_giml"]
