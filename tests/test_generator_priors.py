"""The generator kinds of the configuration (``gan.kind``): the pipeline's DCGAN (32x32 or
64x64, Radford et al.) and the papers' pretrained StyleGAN2 and BigGAN-deep, loaded from a
local weights file in the public ports' formats. Built small with random weights and saved
in the port's format, a configuration loads them back to the same images; GIAS, GGA, GIFD
and EOT search each kind (its latent, the generator's parameters, its blocks' features)
and lower their gradient loss; a pretrained kind plans no ``train_gan`` job and a missing
weights file stops Snakemake before any job, naming the path (docs/errors.md)."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import pytest
import torch
from project import SNAKEMAKE, copy_project, run

from gradleak import attacks, config, defenses
from gradleak.attacks.prior import BigGANPrior, DCGANPrior, StyleGAN2Prior
from gradleak.experiment import artifacts, configuration, pipeline, plan, priors
from gradleak.experiment.job import Job
from gradleak.experiment.phases.attack import build_attack, needed
from gradleak.models.biggan import BigGANGenerator
from gradleak.models.dcgan import Generator, load_generator, train_dcgan
from gradleak.models.lenet import LeNet
from gradleak.models.ported import architecture
from gradleak.models.stylegan2 import StyleGAN2Generator
from gradleak.settings import Setting
from gradleak.utils.io import save_torch

SG = {"latent_dim": 16, "n_mlp": 2, "widths": [8, 8, 4, 4], "space": "w_plus"}
BG = {"latent_dim": 8, "channel_width": 4, "num_classes": 5, "widths": [4, 4, 2, 1],
      "attention_resolution": 16, "classes": [4, 3, 2, 1, 0, 0, 1, 2, 3, 4]}


def _stylegan() -> StyleGAN2Generator:
    torch.manual_seed(0)
    net = StyleGAN2Generator(32, 16, 2, widths={4: 8, 8: 8, 16: 4, 32: 4}).eval()
    with torch.no_grad():  # non-zero noise strengths and biases: every parameter matters
        for name, p in net.named_parameters():
            if name.endswith(("noise.weight", "activate.bias", "to_rgb1.bias")):
                p.normal_(0, 0.1)
    return net


def _biggan() -> BigGANGenerator:
    torch.manual_seed(0)
    net = BigGANGenerator(32, **{k: v for k, v in BG.items() if k != "classes"}).eval()
    with torch.no_grad():  # the attention's gain starts at 0
        for name, p in net.named_parameters():
            if name.endswith("gamma"):
                p.fill_(0.5)
    return net


@pytest.fixture(scope="module")
def weights(tmp_path_factory, digits_generator):
    """Each pretrained kind's random generator, saved in its port's format, and the
    configuration that loads it; the DCGAN trained on the digits (the pipeline's kind)."""
    folder = tmp_path_factory.mktemp("weights")
    sg, bg = _stylegan(), _biggan()
    sg_file = save_torch(folder / "stylegan2.pt", {"g_ema": sg.state_dict(),
                                                   "latent_avg": torch.zeros(16)})
    bg_file = save_torch(folder / "pytorch_model.bin", bg.state_dict())
    return {"dcgan": (digits_generator, None),
            "stylegan2": (sg, configuration.validate({"gan": {
                "kind": "stylegan2", "weights": str(sg_file), "resolution": 32,
                "stylegan2": SG}})),
            "biggan": (bg, configuration.validate({"gan": {
                "kind": "biggan", "weights": str(bg_file), "resolution": 32,
                "biggan": BG}}))}


def _prior(kind: str, weights) -> torch.nn.Module:
    if kind == "dcgan":
        return weights["dcgan"][0]
    return priors.load(weights[kind][1])


def _observation(seed: int = 0) -> attacks.Observation:
    torch.manual_seed(seed)
    model = LeNet(3, 10, 32)
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    y = torch.tensor([1, 7])
    gradient = defenses.build("none")(defenses.DefenseContext(model=model, x=x, y=y))
    return attacks.Observation(model=model, gradient=gradient, batch_size=2)


@pytest.mark.slow
def test_a_saved_generator_reloads_from_the_configuration_to_the_same_images(weights):
    z = torch.randn(3, 16, generator=torch.Generator().manual_seed(1))
    sg, sg_config = weights["stylegan2"]
    loaded = priors.load(sg_config)
    assert isinstance(loaded, StyleGAN2Prior) and not loaded.training
    with torch.no_grad():
        w = sg.mapping(z).unsqueeze(1).expand(-1, sg.n_latent, -1)
        assert torch.equal(loaded.decode(w), sg.synthesis(w))
        assert torch.equal((loaded.decode(w) + 1) / 2, ((sg.synthesis(w) + 1) / 2))
    assert loaded.latent_shape == (8, 16)

    bg, bg_config = weights["biggan"]
    loaded = priors.load(bg_config)
    assert isinstance(loaded, BigGANPrior) and loaded.latent_shape == (8,)
    z, classes = z[:, :8], torch.tensor([0, 4, 2])
    with torch.no_grad():
        onehot = torch.nn.functional.one_hot(classes, 5).float()
        assert torch.equal(loaded.decode(z, onehot), bg.decode(z, classes))
    # the victim's label l is conditioned as gan.biggan.classes[l]
    assert loaded.class_of(torch.tensor([0, 1, 9])).tolist() == [4, 3, 4]
    with pytest.raises(ValueError, match=r"label 10 has no BigGAN class: expected a label "
                       r"within the 10 entries of gan.biggan.classes"):
        loaded.class_of(torch.tensor([10]))


def test_a_64x64_dcgan_is_radford_et_al_s(tmp_path):
    net = Generator(100, 3, 8, resolution=64)
    convs = [m for m in net.net if isinstance(m, torch.nn.ConvTranspose2d)]
    assert [m.out_channels for m in convs] == [64, 32, 16, 8, 3]
    assert net(torch.zeros(2, 100)).shape == (2, 3, 64, 64)
    small = Generator(100, 3, 8)  # the 32x32 default: one upsampling block fewer
    assert [m.out_channels for m in small.net if isinstance(m, torch.nn.ConvTranspose2d)] \
        == [32, 16, 8, 3]
    with pytest.raises(ValueError, match="DCGAN resolution must be one of \\(32, 64\\), got 48"):
        Generator(100, 3, 8, resolution=48)
    assert DCGANPrior(net).stages == 5
    images = torch.rand(8, 1, 64, 64, generator=torch.Generator().manual_seed(0))
    trained, log = train_dcgan(images, epochs=1, batch_size=4, lr=2e-4, latent_dim=10,
                               width=4, seed=0, progress=False)
    assert trained.resolution == 64 and len(log) == 1
    file = save_torch(tmp_path / "gan.pt", {  # as `gradleak train-gan` saves it
        "generator": trained.state_dict(), "latent_dim": 10, "width": 4, "channels": 1,
        "resolution": 64})
    z = torch.randn(3, 10, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(load_generator(file)(z), trained(z))


def _gradient_loss_falls(rec) -> bool:
    trace = [v for v in rec.loss_trace if v == v]
    return len(trace) > 1 and min(trace[1:]) < trace[0]


KINDS = ["dcgan", "stylegan2", "biggan"]


@pytest.mark.parametrize("kind", KINDS)
def test_gias_searches_the_latent_then_the_generator_of_every_kind(weights, kind):
    generator = _prior(kind, weights)
    gias = attacks.build("gias", generator=generator, variant="z/w", latent_iterations=8,
                         parameter_iterations=4, restarts=2)
    rec = gias(_observation())
    assert rec.images.shape == (2, 3, 32, 32) and rec.iterations == 12
    assert rec.extra["iterations"] == {"z": 8, "w": 4}
    assert rec.loss_trace[-1] < rec.loss_trace[0]
    assert rec.loss_trace[-1] <= rec.loss_trace[7] + 1e-6  # the parameter search went on


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("optimizer", ["adam", "cmaes"])
def test_gga_searches_every_kind(weights, kind, optimizer):
    """CMA-ES gets 20 rounds of 16: in 10 of 8, on the DCGAN's 200 latent dimensions, the
    first round's best was sometimes never beaten (near random search at that budget)."""
    gga = attacks.build("gga", generator=_prior(kind, weights), optimizer=optimizer,
                        iterations=20, population=16, restarts=1, lr=0.1)
    rec = gga(_observation())
    assert rec.images.shape == (2, 3, 32, 32)
    assert _gradient_loss_falls(rec)


@pytest.mark.parametrize("kind", KINDS)
def test_gifd_searches_the_blocks_of_every_kind(weights, kind):
    gifd = attacks.build("gifd", generator=_prior(kind, weights), steps=(6, 6, 6),
                         radii=(0.1, 0.125), restarts=1)
    rec = gifd(_observation())
    assert rec.images.shape == (2, 3, 32, 32) and rec.iterations == 18
    losses = rec.extra["stage_losses"]
    assert len(losses) == 3 and min(losses) < rec.loss_trace[0]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("wraps", ["gga", "gifd"])
def test_eot_wraps_the_generator_attacks_of_every_kind(weights, kind, wraps):
    params = {"gga": {"optimizer": "adam", "iterations": 8, "restarts": 1},
              "gifd": {"steps": [4, 4], "restarts": 1}}[wraps]
    eot = attacks.build("eot", wraps=wraps, wraps_params=params, samples=2,
                        defense=defenses.build("censor", trials=2),
                        generator=_prior(kind, weights))
    rec = eot(_observation())
    assert rec.extra["eot_samples"] == 2 and rec.images.shape == (2, 3, 32, 32)
    assert min(rec.loss_trace[1:]) < rec.loss_trace[0]


def test_gias_untrained_is_the_kind_s_architecture_with_seeded_weights(weights):
    _, sg_config = weights["stylegan2"]
    first, again = priors.untrained(sg_config), priors.untrained(sg_config)
    loaded = priors.load(sg_config)
    assert isinstance(first, StyleGAN2Prior) and not first.training
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(),
                                                 again.state_dict().values()))
    assert not torch.equal(first.net.conv1.noise.weight, loaded.net.conv1.noise.weight)
    other = configuration.validate({"gan": {**sg_config["gan"], "seed": 1}})
    assert not torch.equal(priors.untrained(other).net.input.input, first.net.input.input)


@pytest.mark.parametrize("gan, expected", [
    ({"kind": "stylegan2", "resolution": 64},
     "'gan.weights': gan.kind stylegan2 is pretrained; expected the path"),
    ({"resolution": 48}, "'gan.resolution': 48 is not a DCGAN size; expected 32 or 64"),
    ({"kind": "stylegan2", "weights": "g.pt", "resolution": 48},
     "'gan.resolution': 48 is not a stylegan2 size; expected a power of 2, at least 4"),
    ({"kind": "stylegan2", "weights": "g.pt", "resolution": 32,
      "stylegan2": {"widths": [8, 8, 4]}},
     "'gan.stylegan2.widths': 3 widths; expected 4, one per resolution 4..32"),
    ({"kind": "biggan", "weights": "g.bin", "resolution": 64},
     "'gan.biggan.widths': null (the port's) needs 'gan.resolution' 128, 256 or 512"),
    ({"kind": "biggan", "weights": "g.bin", "resolution": 128, "biggan": {"classes": [3, 1000]}},
     "'gan.biggan.classes': class 1000 is not one of the generator's; expected 0..999"),
    ({"kind": "stylegan2", "weights": "g.pt", "resolution": 64,
      "by_dataset": {"natural": {"kind": "biggan", "weights": "b.bin", "resolution": 64}}},
     "'gan.by_dataset.natural.biggan.widths': null (the port's) needs "
     "'gan.by_dataset.natural.resolution' 128, 256 or 512, got 64"),
], ids=["no_weights", "dcgan_size", "stylegan2_size", "stylegan2_widths",
        "biggan_port_widths", "biggan_class", "by_dataset_widths"])
def test_generator_settings_that_do_not_fit_the_kind_are_refused(gan, expected):
    with pytest.raises(config.ConfigError) as error:
        configuration.validate({"gan": gan})
    assert expected in str(error.value)


@pytest.mark.slow
def test_the_architecture_is_checked_before_any_job(tmp_path):
    """The constructor's own refusals, on the meta device, then the weights file."""
    gan = {"kind": "biggan", "weights": str(tmp_path / "g.bin"), "resolution": 32,
           "biggan": {"widths": [4, 4, 2, 1]}}
    assert priors.problem(configuration.validate({"gan": gan})) == (
        "invalid config: 'gan.biggan': BigGAN attention_resolution must be one of [4, 8, 16]; "
        "got 64")
    gan["biggan"]["attention_resolution"] = 16
    assert priors.problem(configuration.validate({"gan": gan})).startswith(
        f"gan.weights: '{tmp_path / 'g.bin'}' does not exist (biggan loads")
    (tmp_path / "g.bin").write_bytes(b"")  # then its keys and shapes, no tensor data read
    assert priors.problem(configuration.validate({"gan": gan})).startswith(
        f"gan.weights: {tmp_path / 'g.bin'} is not a readable torch file")
    build, arguments = architecture(priors.spec(configuration.validate({"gan": gan})))
    save_torch(tmp_path / "g.bin", build(**arguments).state_dict())
    assert priors.problem(configuration.validate({"gan": gan})) is None
    assert priors.problem(configuration.validate({})) is None  # the DCGAN: trained here


def test_a_dataset_without_a_pretrained_prior_gets_a_dcgan_and_rgap_only_that():
    """Beside a pretrained prior, an attack's prior_dataset with none is a DCGAN trained
    here (GIAS Fig. 6's wrong prior), at a DCGAN's resolution; R-GAP's latent search runs
    only through such a DCGAN."""
    gan = {"kind": "stylegan2", "weights": "g.pt", "resolution": 64}
    wrong = {"attacks": {"g": {"attack": "gias", "prior_dataset": "mnist"}}}
    resolved = configuration.validate({"gan": gan, **wrong})
    assert priors.pretrained_datasets(resolved) == ["digits"]
    assert priors.spec(resolved, "mnist")["kind"] == "dcgan"
    assert priors.spec(resolved)["weights"] == "g.pt"
    with pytest.raises(config.ConfigError, match=r"'attacks.g.prior_dataset': the prior of "
                       r"'mnist' is a DCGAN trained here .* 'gan.resolution' 128 does not "
                       r"fit; expected 32 or 64"):
        configuration.validate({"gan": {**gan, "resolution": 128}, **wrong})
    with pytest.raises(config.ConfigError, match=r"'attacks.r.prior_layers': R-GAP's latent "
                       r"search needs a DCGAN trained here; the prior of 'digits' "
                       r"is pretrained \(gan.kind stylegan2\); expected 0"):
        configuration.validate({"gan": gan,
                                "attacks": {"r": {"attack": "rgap", "prior_layers": 2}}})
    configuration.validate({"gan": gan, "attacks": {"r": {
        "attack": "rgap", "prior_layers": 2, "prior_dataset": "mnist"}}})


def test_a_case_of_a_by_dataset_entry_is_attacked_with_its_own_pretrained_prior(weights):
    """CENSOR's layout: gan.dataset's prior, and one of its own for a dataset of
    gan.by_dataset (its kind, file and class map); a missing file of either is named by
    its key before any job."""
    bg = weights["biggan"][1]["gan"]
    sg = weights["stylegan2"][1]["gan"]
    resolved = configuration.validate({
        "cases": [{"dataset": "digits", "model": "lenet"},
                  {"dataset": "mnist", "model": "lenet"}],
        "attacks": {"gga": {"optimizer": "adam", "iterations": 2}},
        "gan": {**sg, "by_dataset": {"mnist": {k: bg[k] for k in (
            "kind", "weights", "resolution", "biggan")}}}})
    assert priors.pretrained_datasets(resolved) == ["digits", "mnist"]
    results = Path("results")
    files = {case: artifacts.files(job, needed(job)) for case, job in (
        (case, Job(resolved, results, case, Setting("none", 0), 0))
        for case in plan.case_names(resolved))}
    assert {str(f) for f in files["digits-lenet-iid-k10"]} >= {sg["weights"]}
    assert {str(f) for f in files["mnist-lenet-iid-k10"]} >= {bg["weights"]}
    assert isinstance(priors.load(resolved, "mnist"), BigGANPrior)
    assert isinstance(priors.load(resolved), StyleGAN2Prior)
    missing = {**resolved["gan"]["by_dataset"]["mnist"], "weights": "absent.bin"}
    resolved["gan"]["by_dataset"]["mnist"] = missing
    assert priors.problem(resolved).startswith(
        "gan.by_dataset.mnist.weights: 'absent.bin' does not exist (biggan loads mnist's "
        "generator from it")


TINY = """threads: 1
cases: [{{dataset: digits, model: lenet, partition: {{kind: iid, clients: 2}}}}]
fl: {{rounds: 1, seeds: [0], client_batch_size: 8}}
attack: {{victims: {{count: 1}}, attacker: {{seeds: [0]}}, outputs: {{grid_victims: 1}}}}
defenses: {{none: {{strengths: [0]}}}}
attacks: {{gga: {{optimizer: adam, iterations: 2}}, gifd: {{steps: [2]}}}}
gan: {{kind: stylegan2, weights: {weights}, resolution: 32,
       stylegan2: {{latent_dim: 16, n_mlp: 2, widths: [8, 8, 4, 4]}}}}
"""


@pytest.mark.slow
def test_a_pretrained_kind_plans_no_gan_training_and_waits_for_its_file(weights, tmp_path):
    from gradleak.experiment.phases.aggregate import substitutions

    root = copy_project(tmp_path / "project")
    file = weights["stylegan2"][1]["gan"]["weights"]
    (root / "priors").mkdir()
    (root / "priors" / "g_ema.pt").write_bytes(open(file, "rb").read())
    tiny = root / "tiny.yaml"
    tiny.write_text(TINY.format(weights="priors/g_ema.pt"))
    resolved = configuration.validate(config.read(tiny))
    planned = pipeline.walk(resolved, root / "results")
    assert planned["train_gan"] == [] and substitutions(resolved) == []
    job = Job(resolved, root / "results", "digits-lenet-iid-k2", Setting("none", 0), 0)
    assert Path("priors/g_ema.pt") in artifacts.files(job, needed(job))
    with contextlib.chdir(root):  # the attack job's generator: the file, as configured
        gga = build_attack(job, "gga", LeNet(1, 10, 32), defenses.build("none"), 0)
    assert isinstance(gga.generator, StyleGAN2Prior) and gga.generator.space == "w_plus"
    w = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(gga.generator.decode(w), weights["stylegan2"][0].synthesis(w))
    dry = run([*SNAKEMAKE, "-n", "--cores", "1", "--configfile", str(tiny)], root)
    assert "rule attack:" in dry.stdout and "train_gan" not in dry.stdout
    attack = dry.stdout[dry.stdout.index("rule attack:"):]
    assert "priors/g_ema.pt" in attack.split("output:")[0]  # the weights: the job's input

    (root / "priors" / "g_ema.pt").unlink()
    shutil.rmtree(root / "results")
    proc = run([*SNAKEMAKE, "-n", "--cores", "1", "--configfile", str(tiny)], root, check=False)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("gradleak: ")]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert lines == ["gradleak: gan.weights: 'priors/g_ema.pt' does not exist (stylegan2 "
                     "loads digits's generator from it: expected a rosinality/"
                     "stylegan2-pytorch checkpoint holding 'g_ema', or the bare g_ema state "
                     "dict, downloaded to that path); or run DCGANs trained here: --config "
                     "'gan={kind: dcgan}'"], proc.stderr
    assert not (root / "results" / "config.resolved.json").exists(), "a job could start"


def test_biggan_is_conditioned_on_the_inferred_labels_mapped_to_its_classes(weights):
    from gradleak.attacks.victims import Victims

    obs = _observation()
    gga = attacks.build("gga", generator=_prior("biggan", weights), optimizer="adam",
                        iterations=3, restarts=2)
    victims = Victims([obs], restarts=2, seed=0, stacked=False)
    solution = victims.solve(gga.stage(victims))
    expected = torch.nn.functional.one_hot(torch.tensor([3, 2]), 5).float()  # labels 1, 7
    assert torch.equal(solution.variables[1][0, 0], expected)  # held fixed by the search
    assert torch.equal(solution.variables[1][0, 1], expected)
