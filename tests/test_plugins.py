"""A defense from a separate package (entry-point group ``gradleak.defenses``): listed,
validated like a built-in one, built through the Python API, and ranked in the
matched-utility table beside the built-in defenses; a broken plugin stops with one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from project import ENV, SNAKEMAKE, copy_project, own_source, run

PLUGIN = '''"""Round-to-nearest on a grid of step ``step`` (Gupta et al., ICML 2015, Eq. 1)."""
import torch

from gradleak.defenses import Defense


class Rounding(Defense):
    cites = "Gupta et al., Deep Learning with Limited Numerical Precision, ICML 2015"
    schema = {"knob": "step", "stronger": "higher",
              "properties": {"step": {"type": "number", "exclusiveMinimum": 0,
                                      "default": 0.01}}}
    deterministic = True

    def __init__(self, step):
        self.step = step

    def __call__(self, ctx):
        return ctx.true_gradient().map(lambda g: torch.round(g / self.step) * self.step)
'''


ATTACK = '''"""Gradient matching by cosine distance in the box [0, 1], without a prior
(Geiping et al., NeurIPS 2020, Eq. 4 with lambda_TV = 0)."""
from gradleak.attacks import Attack, Stage, image_start


class PlainCosine(Attack):
    cites = "Geiping et al., Inverting Gradients, NeurIPS 2020, Eq. 4 without TV"
    schema = {"properties": {"iterations": {"type": "integer", "minimum": 1, "default": 400},
                             "lr": {"type": "number", "exclusiveMinimum": 0, "default": 0.1},
                             "restarts": {"type": "integer", "minimum": 1, "default": 1}}}

    def __init__(self, *, iterations, lr, restarts, seed=0):
        self.iterations, self.lr, self.restarts, self.seed = iterations, lr, restarts, seed

    def stage(self, victims):
        return Stage("cosine", self.lr, self.iterations, draw=image_start, boxed=True)
'''


def install(site: Path, source: str = PLUGIN, entry: str = "gradleak_rounding:Rounding",
            group: str = "gradleak.defenses", name: str = "rounding") -> dict:
    """The plugin as pip installs a distribution (its module and a .dist-info with its
    entry point) into ``site``; the environment that puts ``site`` on the path."""
    module = entry.split(":")[0]
    info = site / f"{module}-0.1.dist-info"
    info.mkdir(parents=True)
    (site / f"{module}.py").write_text(source)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}"
                                   f"\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{name} = {entry}\n")
    return {**ENV, "PYTHONPATH": str(site)}


def gradleak(args: list[str], env: dict, cwd: Path | None = None):
    return subprocess.run([sys.executable, "-m", "gradleak.cli", *args], env=env, cwd=cwd,
                          capture_output=True, text=True)


def test_a_plugin_defense_is_listed_validated_and_built_like_a_built_in(tmp_path):
    env = install(tmp_path / "site")
    listed = gradleak(["list"], env)
    assert listed.returncode == 0, listed.stderr
    assert "rounding (step)" in listed.stdout
    assert "plugin defense rounding (gradleak_rounding): Gupta et al." in listed.stdout

    config = tmp_path / "plugin.yaml"
    config.write_text("defenses: {none: {strengths: [0]}, rounding: {strengths: [0]}}\n")
    refused = gradleak(["validate", "--config", str(config)], env)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert refused.stderr.strip() == ("gradleak validate: error: invalid config: "
                                      "'defenses.rounding.strengths[0]': 0 is less than or "
                                      "equal to the minimum of 0")

    built = subprocess.run([sys.executable, "-c", (
        "import torch\nfrom gradleak import defenses, models\n"
        "m = models.build('lenet', channels=1, num_classes=10, image_size=16)\n"
        "ctx = defenses.DefenseContext(model=m, x=torch.rand(1, 1, 16, 16), "
        "y=torch.tensor([3]), rng=torch.Generator().manual_seed(0))\n"
        "g = defenses.build('rounding', step=0.05)(ctx)\n"
        "true = ctx.true_gradient()\n"
        "print(max(float((g[k] - true[k]).abs().max()) for k in g), "
        "all(torch.allclose(g[k] / 0.05, torch.round(g[k] / 0.05)) for k in g))")],
        env=env, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    error, on_grid = built.stdout.split()
    assert 0 < float(error) <= 0.025 + 1e-6 and on_grid == "True"


def test_a_plugin_attack_reconstructs_a_digit_through_the_python_api(tmp_path):
    env = install(tmp_path / "site", ATTACK, "gradleak_cosine:PlainCosine",
                  "gradleak.attacks", "plain_cosine")
    proc = subprocess.run([sys.executable, "-c", (
        "import torch\nfrom gradleak import attacks, data, metrics, models\n"
        "digits = data.load_digits(channels=1, size=16)\nx, y = digits.x[:1], digits.y[:1]\n"
        "torch.manual_seed(0)\n"
        "m = models.build('lenet', channels=1, num_classes=10, image_size=16)\n"
        "g = {k: v.detach() for k, v in zip(dict(m.named_parameters()), torch.autograd.grad("
        "torch.nn.functional.cross_entropy(m(x), y), list(m.parameters())))}\n"
        "rec = attacks.build('plain_cosine')(attacks.Observation(model=m, gradient=g, "
        "batch_size=1, labels=None))\n"
        "print('plain_cosine' in attacks.available(), metrics.psnr(rec.images, x))")],
        env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    listed, psnr = proc.stdout.split()
    assert listed == "True" and float(psnr) > 18, psnr


@pytest.mark.parametrize(("source", "entry", "says"), [
    (PLUGIN.replace("    cites = ", "    cited = "), None, "needs `cites`"),
    (PLUGIN.replace('"default": 0.01', '"minimum": 0'), None, "has no default"),
    (PLUGIN, "gradleak_rounding:Missing", "does not load"),
    (PLUGIN.replace('"stronger": "higher",', '"stronger": "higher", "work": "sample",'), None,
     "work 'sample'; expected 'gradient' or 'batch'"),
], ids=["no-cites", "no-default", "no-class", "bad-work"])
def test_a_broken_plugin_stops_with_one_line_naming_it(tmp_path, source, entry, says):
    env = install(tmp_path / "site", source, entry or "gradleak_rounding:Rounding")
    proc = gradleak(["list"], env)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    line, = proc.stderr.strip().splitlines()
    assert "defense plugin 'rounding' (gradleak-rounding: gradleak_rounding:" in line
    assert says in line


@pytest.mark.slow
def test_a_plugin_defense_is_ranked_beside_the_built_in_ones(tmp_path):
    """The plugin's FL runs, attacks and curve in the pipeline's matched-utility table."""
    root = copy_project(tmp_path / "project")
    env = install(tmp_path / "site")
    env["PYTHONPATH"] += ":" + own_source(root)["PYTHONPATH"]
    (root / "config" / "plugin.yaml").write_text("""\
datasets: {digits: {channels: 1, size: 16}}
cases: [{dataset: digits, model: lenet, partition: {kind: iid, clients: 4}}]
fl: {seeds: [0], rounds: 4, client_batch_size: 8, eval_every: 2}
defenses:
  none: {strengths: [0]}
  dp_gaussian: {strengths: [0.01, 0.1]}
  rounding: {strengths: [0.01, 0.1]}
attack: {victims: {count: 2}, attacker: {seeds: [0]}, outputs: {metrics: [psnr, ssim]}}
attacks: {inverting_gradients: {iterations: 20}}
""")
    run([*SNAKEMAKE, "--cores", "2", "--configfile", "config/plugin.yaml"], root, env=env)
    table = pd.read_csv(root / "results" / "tables" / "matched_utility.csv")
    ranked = table.query("attack == 'inverting_gradients' and attacker == 'paper'")
    assert {"rounding", "dp_gaussian"} <= set(ranked["defense"])
    assert set(ranked["best"]) <= {"yes", "tied", "no"}
    tradeoff = pd.read_csv(root / "results" / "tables" / "tradeoff.csv")
    assert set(tradeoff.query("defense == 'rounding'")["strength"]) == {0.01, 0.1}
