"""Shared fixtures: real data (digits, the MNIST test set) and a fixed thread count."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from gradleak.experiment import configuration
from gradleak.utils.threads import use_threads

REPO = Path(__file__).resolve().parents[1]
SHARED_DATASETS = REPO.parent / "shared" / "datasets"

os.environ.setdefault("DVC_NO_ANALYTICS", "1")
use_threads(1)  # each pytest-xdist worker on one core, its BLAS and OpenMP pools too


# session fixtures that train a network (half a minute each, ``made_once``): the tests that
# use one run on one worker (an ``xdist_group`` of its name), which makes it while the other
# workers run other tests instead of waiting on its lock
TRAINED_ONCE = ("digits_generator", "natural_evalnet")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items):
    """The tests of an ``xdist_group`` first (a group shares minutes-long fixtures and runs
    on one worker), then the modules that hold a slow test, each whole and in its order:
    pytest-xdist hands tests out in this order as workers free up, so the long pipeline runs
    start at once and the short tests fill in at the end, instead of one worker finishing a
    long run alone. A test that uses a fixture of ``TRAINED_ONCE`` joins its group."""
    for item in items:
        trained = [f for f in TRAINED_ONCE if f in getattr(item, "fixturenames", ())]
        if trained and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(trained[0]))
    slow = {item.module.__name__ for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: (item.get_closest_marker("xdist_group") is None,
                                 item.module.__name__ not in slow))


@pytest.fixture(autouse=True)
def _torch_state_as_at_start():
    """Each test starts from one thread and torch's own kernels: a job run in-process sets its
    thread counts (torch's, the BLAS pools') and deterministic kernels (``seed_everything``),
    and under pytest-xdist which tests ran before in the same worker would otherwise change
    what a later one trains."""
    yield
    use_threads(1)
    if torch.are_deterministic_algorithms_enabled():
        torch.use_deterministic_algorithms(False)


def doc_block(doc: str, heading: str, language: str, number: int = 1) -> str:
    """The ``number``-th ``language`` block after the heading ``heading`` of ``doc`` (the
    README or a page of the manual, a path from the repository's root)."""
    text = (REPO / doc).read_text()
    section = text[text.index(heading):]
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.S)[number - 1]


def commands(block: str) -> list[str]:
    """Shell lines, continuation lines joined, comments dropped."""
    text = block.replace("\\\n", " ")
    lines = (line.split("  #")[0].strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


@pytest.fixture
def float64():
    """float64 by default while a test runs (the attack draws its start in the default dtype)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def stacked_and_looped(name: str, params: dict, observations: list) -> tuple[list, list, float]:
    """Attack ``name`` with ``params`` (a ``seed`` among them) on all ``observations`` through
    ``reconstruct_all``, beside the engine's loop (one problem at a time, victim v with
    seed + v): both lists of Reconstructions and their largest pixel difference."""
    from gradleak import attacks

    stacked = attacks.reconstruct_all(attacks.build(name, **params), observations)
    looped = attacks.reconstruct_all(attacks.build(name, **params), observations, engine="loop")
    difference = max(float((a.images - b.images).abs().max()) for a, b in zip(stacked, looped))
    return stacked, looped, difference


def assert_like_the_loop(stacked: list, looped: list, difference: float, problems: int,
                         tolerance: float = 1e-8) -> None:
    """``stacked`` ran ``problems`` problems at once and gave the loop's Reconstructions:
    pixels within ``tolerance`` (1e-8: float64), the same restarts, iterations and stop
    reasons, and loss traces within ``tolerance``."""
    import numpy as np

    assert all(r.extra["vectorised_problems"] == problems for r in stacked)
    assert difference <= tolerance
    for a, b in zip(stacked, looped, strict=True):
        assert (a.restart, a.iterations, a.stop_reason) == (b.restart, b.iterations,
                                                            b.stop_reason)
        assert np.allclose(a.loss_trace, b.loss_trace, rtol=tolerance)


@pytest.fixture(scope="session")
def digits():
    from gradleak.data import load_digits

    return load_digits(channels=1)


@pytest.fixture(scope="session")
def mnist_root() -> Path:
    """The real MNIST test set beside the repository; CI must have it, elsewhere it is optional."""
    raw = SHARED_DATASETS / "MNIST" / "raw"
    if not raw.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"CI needs the MNIST test set at {raw}")
        pytest.skip(f"the MNIST test set is not at {raw}")
    return SHARED_DATASETS


@pytest.fixture(scope="session")
def digit_batch(digits):
    """Three real digits (a fixed draw) and their labels: a batch of victims."""
    chosen = np.random.default_rng(5).choice(len(digits.x), 3, replace=False)
    return digits.x[chosen], digits.y[chosen]


@pytest.fixture(scope="session")
def digits_splits(digits):
    """The embedded default's stratified digits splits: {"train", "public", "test"} -> ImageData."""
    from gradleak.data import ImageData
    from gradleak.data.splits import stratified_splits

    parts = stratified_splits(digits.y.numpy(), {"train": 0.6, "public": 0.2, "test": 0.2}, 0)
    return {name: ImageData(digits.x[torch.from_numpy(idx)], digits.y[torch.from_numpy(idx)], 10)
            for name, idx in parts.items()}


def made_once(tmp_path_factory, name: str, make: Callable[[Path], None]) -> Path:
    """``name`` in this test run's folder, written by ``make(path)`` in the first xdist
    worker that asks and read by the others: a session fixture is one per worker, and the
    trained ones below cost half a minute each."""
    from filelock import FileLock

    run = tmp_path_factory.getbasetemp()  # a worker's is popen-gwN in the run's folder
    path = (run.parent if os.environ.get("PYTEST_XDIST_WORKER") else run) / name
    with FileLock(f"{path}.lock"):
        if not path.is_file():
            make(path)
    return path


@pytest.fixture(scope="session")
def digits_generator(digits_splits, tmp_path_factory):
    """A DCGAN trained on the public digits split: the attacker's prior (victims: train),
    saved as `gradleak train-gan` does (training is seeded: the same weights anywhere)."""
    from gradleak.models.dcgan import load_generator, train_dcgan
    from gradleak.utils.io import save_torch

    public = digits_splits["public"].x

    def make(path: Path) -> None:
        # lr 1e-3: at DCGAN's 2e-4 the discriminator wins on 359 digits, samples stay grey
        generator, _ = train_dcgan(public, epochs=40, batch_size=64, lr=1e-3, latent_dim=100,
                                   width=32, seed=0, progress=False)
        save_torch(path, {"generator": generator.state_dict(), "latent_dim": 100,
                          "width": 32, "channels": public.shape[1],
                          "resolution": generator.resolution})

    return load_generator(made_once(tmp_path_factory, "digits_gan.pt", make))


@pytest.fixture(scope="session")
def natural_evalnet(tmp_path_factory):
    """The evaluation network as the embedded default trains it (natural crops, 1 channel),
    saved as `gradleak train-evalnet` does."""
    from gradleak.data import load_natural
    from gradleak.models.evalnet import load_evaluation_network, train_evaluation_network
    from gradleak.utils.io import save_torch, write_json

    def make(path: Path) -> None:
        natural = load_natural(2000, seed=0, channels=1)
        net, _ = train_evaluation_network(natural.x, epochs=3, batch_size=128, lr=1e-3,
                                          seed=0, widths=(32, 64, 128), progress=False)
        write_json(path.with_suffix(".json"), {"input_shape": list(natural.x.shape[1:]),
                                               "widths": [32, 64, 128]})
        save_torch(path, net.state_dict())

    return load_evaluation_network(made_once(tmp_path_factory, "natural_evalnet.pt", make))


def lenet_victims(images, count: int, seed: int = 2024) -> list[tuple]:
    """``count`` (model, x, y) triples: a fresh LeNet per victim, images drawn by seed."""
    import numpy as np

    from gradleak.models import LeNet

    rng = np.random.default_rng(seed)
    out = []
    for i, j in enumerate(rng.choice(len(images.x), count, replace=False)):
        torch.manual_seed(i)
        c, h, _ = images.x.shape[1:]
        out.append((LeNet(c, 10, h), images.x[j:j + 1], images.y[j:j + 1]))
    return out


def default_victims(digits_splits, count: int, seed: int) -> list[tuple]:
    """The embedded default's victims: 16x16 digits of the train split, a LeNet each."""
    from gradleak.data import ImageData

    train = digits_splits["train"]
    x = torch.nn.functional.interpolate(train.x, size=(16, 16), mode="bilinear",
                                        antialias=True, align_corners=False).clamp(0, 1)
    return lenet_victims(ImageData(x, train.y, 10), count, seed=seed)


def observe_defended(victim, defense: str, **params):
    """What the attacker sees of ``victim``'s update under ``defense`` (seeded)."""
    from gradleak import attacks, defenses

    model, x, y = victim
    ctx = defenses.DefenseContext(model=model, x=x, y=y, generator=torch.Generator().manual_seed(0))
    return attacks.Observation(model=model, gradient=defenses.build(defense, **params)(ctx),
                               batch_size=len(x))


def tiny_config(defenses: dict | None = None, attacks: dict | None = None, **attack) -> dict:
    """A validated one-round configuration: 16x16 digits, LeNet, 4 clients, 2 victims;
    ``attack`` updates the `attack:` subsections it names (victims={"stride": 3}, ...)."""
    sections = {"victims": {"count": 2}, "outputs": {"metrics": ["psnr"]}}
    for name, values in attack.items():
        sections[name] = {**sections.get(name, {}), **values}

    return configuration.validate({
        "threads": 1, "device": "cpu",
        "datasets": {"digits": {"channels": 1, "size": 16}},
        "cases": [{"dataset": "digits", "model": "lenet", "partition": {"clients": 4}}],
        "fl": {"seeds": [0], "rounds": 1, "eval_every": 1, "client_batch_size": 8,
               "server_optimizer": "sgd", "server_lr": 0.1},
        "defenses": {"none": {"strengths": [0]}, **(defenses or {})},
        "attack": sections,
        "attacks": {"dlg": {"iterations": 1}, **(attacks or {})},
    })
