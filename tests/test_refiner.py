"""Refiner (Fan et al.): robust data is noisy to the evaluation network, and the
uploaded gradient stays inside the epsilon-ball around the true gradient."""

import numpy as np
import pytest
import torch

from gradleak import defenses, metrics
from gradleak.models import LeNet
from gradleak.models.evalnet import monotonicity, train_evaluation_network


@pytest.fixture(scope="module")
def evalnet(natural_evalnet):
    return natural_evalnet  # as the embedded default trains it


@pytest.fixture()
def context(digits):
    torch.manual_seed(0)
    model = LeNet(1, 10, 32)
    return lambda: defenses.DefenseContext(model=model, x=digits.x[:8], y=digits.y[:8],
                                           generator=torch.Generator().manual_seed(0))


def test_the_evaluation_network_is_its_seed_s_whatever_ran_before(digits):
    """``seed`` sets the initial weights too: the global RNG neither changes the network nor
    is changed by its training (under pytest-xdist, what a worker ran before differs)."""
    nets = []
    for before in (0, 1):
        torch.manual_seed(before)
        state = torch.get_rng_state()
        net, _ = train_evaluation_network(digits.x[:64], epochs=1, batch_size=32, lr=1e-3,
                                          seed=0, widths=(4, 4, 4), progress=False)
        assert torch.equal(torch.get_rng_state(), state)
        nets.append(net.state_dict())
    assert all(torch.equal(nets[0][k], nets[1][k]) for k in nets[0])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_evaluation_network_predictions_increase_strictly_with_the_noise_ratio(evalnet, digits,
                                                                               seed):
    """Refiner Fig. 4 on images it never saw (digits; trained on photographs), for three
    draws of the noise: every step of 0.1 in the ratio raises the mean prediction."""
    predictions = [row["prediction"] for row in monotonicity(evalnet, digits.x[:200], seed=seed)]
    print(f"seed {seed}: " + ", ".join(f"{p:.3f}" for p in predictions))
    assert np.all(np.diff(predictions) > 0)


def test_robust_data_is_noisy_to_the_evaluation_network(evalnet, digits):
    """Eq. 2's -beta * PM term: the iota steps raise the evaluation network's noise score above
    the noise-blended start (iota = 0) and far above the clean images. Relative bounds: the
    network's absolute scores move with the CPU's float summation order (0.58 here, 0.49 on
    the CI machine for one batch against a bound of 0.5)."""
    scores = {"clean": [], "start": [], "robust": []}
    for batch in range(3):
        x, y = digits.x[8 * batch:8 * batch + 8], digits.y[8 * batch:8 * batch + 8]
        for name, iterations in (("start", 0), ("robust", 10)):
            torch.manual_seed(batch)
            ctx = defenses.DefenseContext(model=LeNet(1, 10, 32), x=x, y=y,
                                          generator=torch.Generator().manual_seed(batch))
            robust = defenses.build("refiner", evalnet=evalnet,
                                    iterations=iterations).robust_data(ctx)
            assert robust.shape == x.shape
            assert 0 <= float(robust.min()) <= float(robust.max()) <= 1
            scores[name].append(metrics.noise_ratio(robust, evalnet))
        scores["clean"].append(metrics.noise_ratio(x, evalnet))
    clean, start, robust = (float(np.mean(scores[k])) for k in ("clean", "start", "robust"))
    print(f"noise ratio: clean {clean:.3f}, start {start:.3f}, robust {robust:.3f}")
    assert robust >= start + 0.05
    assert robust >= clean + 0.25


@pytest.mark.parametrize("epsilon", [0.01, 0.1, 0.5])
def test_upload_lies_within_epsilon_of_the_true_gradient(evalnet, context, epsilon):
    ctx = context()
    upload = defenses.build("refiner", evalnet=evalnet, epsilon=epsilon)(ctx)
    true = ctx.true_gradient()
    norm = torch.sqrt(sum((g ** 2).sum() for g in true.values()))
    distance = torch.sqrt(sum(((upload[k] - true[k]) ** 2).sum() for k in true))
    assert float(distance) <= epsilon * float(norm) * (1 + 1e-5)
    assert float(distance) > 0


def test_refiner_needs_the_evaluation_network():
    with pytest.raises(ValueError, match="evaluation network"):
        defenses.build("refiner", evalnet=None)


def test_the_evaluation_network_trains_on_tinyimagenet_s_train_folder(tmp_path):
    """App. D: `evalnet.dataset: tinyimagenet` reads TinyImageNet's own layout
    (train/<wnid>/images/*.JPEG, written here: 2 classes of 6 photos), all of it the
    `train` split, and trains the network for the digits' 1x16x16 images on it."""
    import json

    from conftest import tiny_config
    from PIL import Image

    from gradleak.experiment import configuration, paths
    from gradleak.experiment.phases.prepare_data import prepare_data
    from gradleak.experiment.phases.train_evalnet import train_evalnet

    rng = np.random.default_rng(0)
    for wnid in ("n01443537", "n01629819"):
        folder = tmp_path / "tiny-imagenet-200" / "train" / wnid / "images"
        folder.mkdir(parents=True)
        for i in range(6):
            pixels = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{wnid}_{i}.JPEG", "JPEG")
    config = configuration.validate({
        **tiny_config(), "evalnet": {"dataset": "tinyimagenet", "epochs": 1, "batch_size": 4,
                                     "widths": [4, 8, 8]},
        "datasets": {"digits": {"channels": 1, "size": 16}, "tinyimagenet": {
            "root": str(tmp_path / "tiny-imagenet-200"), "split": "train", "size": 32,
            "splits": {"train": 1.0, "public": 0.0, "test": 0.0}}}})
    results = tmp_path / "results"
    for dataset in ("digits", "tinyimagenet"):
        prepare_data(config, results, dataset)
    manifest = json.loads(paths.data_manifest(results, "tinyimagenet").read_text())
    assert manifest["splits"]["train"]["count"] == 12 and manifest["shape"] == [3, 32, 32]
    train_evalnet(config, results, "digits")
    log = json.loads(paths.evalnet_file(results, "digits").with_suffix(".json").read_text())
    assert log["trained_on"] == "tinyimagenet" and log["input_shape"] == [1, 16, 16]
    assert len(log["epoch_losses"]) == 1 and np.isfinite(log["epoch_losses"]).all()
    errors = [abs(row["prediction"] - row["ratio"]) for row in log["monotonicity"]]
    assert log["ratio_error"] == max(errors) and log["max_error"] == 0.05
