"""Attribute datasets (RecUP-FL): task labels with sensitive attributes, their prepared
folders, offline errors, stand-ins in the paper's shapes and the paper's FL models."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.io import wavfile
from scipy.stats import chi2_contingency

from gradleak import data, models
from gradleak.data import attributes as A
from gradleak.data.adult import ADULT_CONTINUOUS, adult_feature_names
from gradleak.data.audiomnist import AUDIO_RATE, spectrogram
from gradleak.data.digit_attributes import shape_measures, slant, stroke_width, within_class_bins
from gradleak.utils.io import read_json

PAPER_SHAPES = {"lfw": (3, 62, 47), "celeba": (3, 32, 32), "audiomnist": (1, 64, 64),
                "adult": (1, 1, 103), "mnist_attributes": (1, 28, 28)}
MODELS = {"lfw": ("attribute_cnn", {"layout": "lfw"}),
          "celeba": ("attribute_cnn", {"layout": "celeba"}),
          "audiomnist": ("attribute_cnn", {"layout": "audiomnist"}),
          "adult": ("tabular_fc", {}), "mnist_attributes": ("attribute_cnn", {})}


def _independence_p(a: torch.Tensor, b: torch.Tensor) -> float:
    table = np.zeros((int(a.max()) + 1, int(b.max()) + 1))
    np.add.at(table, (a.numpy(), b.numpy()), 1)
    return float(chi2_contingency(table)[1])


@pytest.fixture(scope="module")
def digit_attrs():
    return data.load_digits_attributes()


# --- digits and MNIST ------------------------------------------------------------------

def test_digit_attributes_have_documented_classes_and_are_balanced(digit_attrs):
    assert digit_attrs.x.shape == (1797, 1, 32, 32) and digit_attrs.num_classes == 2
    digits = data.load_digits().y
    assert torch.equal(digit_attrs.y, digits % 2)
    assert set(digit_attrs.attributes) == set(A.CLASSES["digits_attributes"])
    for name, k in A.CLASSES["digits_attributes"].items():
        values = digit_attrs.attributes[name]
        assert values.dtype == torch.int64 and values.shape == (1797,)
        counts = torch.bincount(values, minlength=k)
        assert len(counts) == k and counts.min() >= 0.95 * len(values) / k, (name, counts)
    assert torch.equal(digit_attrs.attributes["group"], (digits >= 5).long())


def test_within_class_terciles_are_independent_of_task_and_digit(digit_attrs):
    digits = data.load_digits().y
    for name in ("ink", "slant", "stroke"):
        values = digit_attrs.attributes[name]
        assert _independence_p(values, digit_attrs.y) > 0.99, name
        for d in range(10):  # exactly balanced within every digit
            counts = torch.bincount(values[digits == d], minlength=3)
            assert int(counts.max() - counts.min()) <= 1, (name, d, counts)
    # group is not implied by parity: both groups within both parities
    table = torch.zeros(2, 2, dtype=torch.long)
    table.index_put_((digit_attrs.y, digit_attrs.attributes["group"]), torch.tensor(1),
                     accumulate=True)
    assert table.min() > 300


def test_digit_task_option_and_errors():
    ten = data.load_digits_attributes(task="digit")
    assert ten.num_classes == 10 and torch.equal(ten.y, data.load_digits().y)
    with pytest.raises(ValueError, match="task must be one of"):
        data.load_digits_attributes(task="colour")


def test_within_class_bins_are_exact_quantiles_per_class():
    values = np.array([5.0, 1.0, 3.0, 2.0, 4.0, 6.0, 9.0, 7.0, 8.0])
    labels = np.array([0, 0, 0, 0, 0, 0, 1, 1, 1])
    bins = within_class_bins(values, labels, 3)
    assert bins.tolist() == [2, 0, 1, 0, 1, 2, 2, 0, 1]


def test_slant_and_stroke_measure_what_they_say():
    image = np.zeros((32, 32))
    image[4:28, 15] = 1.0  # a vertical bar, 1 pixel wide
    leaning = np.zeros((32, 32))
    for r in range(4, 28):
        leaning[r, 15 + (16 - r) // 3] = 1.0  # top to the right
    assert abs(slant(image[None])[0]) < 1e-9
    assert slant(leaning[None])[0] > 0.2
    assert slant(leaning[None, :, ::-1].copy())[0] < -0.2
    thick = np.zeros((32, 32))
    thick[4:28, 14:17] = 1.0
    widths = stroke_width(np.stack([image, thick]))
    assert widths[0] == pytest.approx(1.0, abs=0.15) and widths[1] == pytest.approx(3.0, abs=0.5)


def test_mnist_attributes_from_the_local_test_set(mnist_root):
    mnist = data.load_mnist_attributes(mnist_root)
    assert mnist.x.shape == (10000, 1, 28, 28) and mnist.num_classes == 2
    assert mnist.y[:5].tolist() == [1, 0, 1, 0, 0]  # digits 7 2 1 0 4
    for name in ("ink", "slant", "stroke"):
        assert _independence_p(mnist.attributes[name], mnist.y) > 0.99
    assert torch.bincount(mnist.attributes["group"]).tolist() == [5139, 4861]


# --- prepared folders ------------------------------------------------------------------

def test_prepared_round_trip_keeps_attributes_and_checks_them(tmp_path, digit_attrs):
    manifest = data.prepare("digits_attributes", tmp_path, {},
                            {"train": 0.6, "public": 0.2, "test": 0.2}, seed=0)
    assert manifest["attributes"] == A.CLASSES["digits_attributes"]
    assert data.attribute_classes(tmp_path) == A.CLASSES["digits_attributes"]
    parts = data.stratified_splits(digit_attrs.y.numpy(), {"train": 0.6, "public": 0.2,
                                                           "test": 0.2}, 0)
    for split, idx in parts.items():
        loaded = data.load_prepared(tmp_path, split)
        expected = digit_attrs.subset(torch.from_numpy(idx))
        assert set(loaded.attributes) == set(expected.attributes)
        for name, values in expected.attributes.items():
            assert torch.equal(loaded.attributes[name], values)
            entry = manifest["splits"][split]["attributes"][name]
            assert entry["class_counts"] == torch.bincount(
                values, minlength=A.CLASSES["digits_attributes"][name]).tolist()
    assert read_json(tmp_path / "manifest.json") == manifest
    (tmp_path / "test_attr_ink.npy").write_bytes(b"corrupt")
    with pytest.raises(ValueError, match="test_attr_ink.npy does not match its manifest sha256"):
        data.load_prepared(tmp_path, "test")
    (tmp_path / "train_attr_slant.npy").unlink()
    with pytest.raises(FileNotFoundError, match="train_attr_slant.npy"):
        data.load_prepared(tmp_path, "train")


def test_prepared_folder_without_attributes_still_loads(tmp_path):
    manifest = data.prepare("natural", tmp_path, {"channels": 1, "count": 40, "seed": 0},
                            {"train": 0.8, "test": 0.2}, 0)
    assert "attributes" not in manifest
    assert data.load_prepared(tmp_path, "test").attributes == {}
    assert data.attribute_classes(tmp_path) == {}


# --- offline errors --------------------------------------------------------------------

@pytest.mark.parametrize("name, options, expected", [
    ("lfw", {}, "lfw-py/lfw_funneled"),
    ("celeba", {}, "celeba/img_align_celeba"),
    ("audiomnist", {}, "data/audioMNIST_meta.txt"),
    ("adult", {}, "adult.data"),
    ("mnist_attributes", {}, "MNIST/raw"),
])
def test_missing_local_data_fails_first_naming_the_path(tmp_path, name, options, expected):
    root = tmp_path / "nowhere"
    reason = data.datasets.missing(name, {"root": str(root), **options})
    assert reason and str(root) in reason and expected in reason
    with pytest.raises(FileNotFoundError) as err:
        data.load(name, root=str(root), **options)
    assert str(err.value) == reason
    assert not root.exists()  # nothing was created or downloaded
    assert data.datasets.missing(name, {"root": str(root), "stand_in": "digits"}) is None


def test_digits_attributes_needs_nothing_local():
    assert data.datasets.missing("digits_attributes", {}) is None
    assert data.load("digits_attributes", channels=1, size=16, task="parity").x.shape[-1] == 16


# --- stand-ins and models --------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(PAPER_SHAPES))
def test_stand_ins_have_paper_shapes_and_attribute_classes(name):
    stand_in = data.load(name, stand_in="digits", root="/nonexistent")
    assert tuple(stand_in.x.shape[1:]) == PAPER_SHAPES[name]
    assert 0 <= float(stand_in.x.min()) and float(stand_in.x.max()) <= 1
    assert int(stand_in.y.max()) < stand_in.num_classes == data.datasets.SHAPES[name][3]
    assert set(stand_in.attributes) == set(A.CLASSES[name]) | set(A.GROUPS.get(name, ()))
    for attr, k in A.CLASSES[name].items():
        counts = torch.bincount(stand_in.attributes[attr], minlength=k)
        assert len(counts) == k and counts.min() >= 0.9 * len(stand_in) / k, (attr, counts)
        assert _independence_p(stand_in.attributes[attr], stand_in.y) > 0.99
    fake = data.datasets.load_stand_in(name, "fake", seed=1)
    assert tuple(fake.x.shape[1:]) == PAPER_SHAPES[name]
    assert {a: int(fake.attributes[a].max()) < k for a, k in A.CLASSES[name].items()} == \
        {a: True for a in A.CLASSES[name]}
    assert torch.equal(fake.x, data.datasets.load_stand_in(name, "fake", seed=1).x)


def test_each_stand_in_attribute_bins_its_own_measure_within_each_digit():
    digits = data.load_digits(1, 32)
    measures, labels = shape_measures(digits.x), digits.y.numpy()
    for name, chosen in A.STAND_IN_MEASURES.items():
        assert chosen.keys() == A.CLASSES[name].keys()
        assert len(set(chosen.values())) == len(chosen), name  # no two share a measure
        found = A.stand_in(name, "digits").attributes
        for attr, k in A.CLASSES[name].items():
            expected = within_class_bins(measures[chosen[attr]], labels, k)
            assert np.array_equal(found[attr].numpy(), expected), (name, attr)
    # LFW race and age on measures apart (m97): not ink and stroke (ink / skeleton length)
    lfw = A.stand_in("lfw", "digits").attributes
    assert A.STAND_IN_MEASURES["lfw"]["race"] != A.STAND_IN_MEASURES["lfw"]["age"]
    assert abs(np.corrcoef(lfw["race"].numpy(), lfw["age"].numpy())[0, 1]) < 0.1


@pytest.mark.parametrize("name", sorted(PAPER_SHAPES))
def test_paper_models_build_and_train_on_the_paper_shapes(name):
    torch.manual_seed(0)
    c, h, w = PAPER_SHAPES[name]
    classes = data.datasets.SHAPES[name][3]
    model_name, options = MODELS[name]
    model = models.build(model_name, c, classes, h, input_shape=(c, h, w), **options)
    assert model.input_shape == (c, h, w)
    x = torch.rand(1, c, h, w)  # one sample per client, as in the paper
    loss = torch.nn.functional.cross_entropy(model(x), torch.tensor([classes - 1]))
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    last = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
    assert last.out_features == classes and model.features(x).shape[1] == last.in_features


def test_build_rejects_shapes_a_model_cannot_take():
    with pytest.raises(ValueError, match="lenet needs a square 62x62 input"):
        models.build("lenet", 3, 2, 62, input_shape=(3, 62, 47))
    with pytest.raises(ValueError, match="tabular_fc needs input_shape"):
        models.build("tabular_fc", 1, 2, 1)
    with pytest.raises(ValueError, match="layout must be one of"):
        models.build("attribute_cnn", 3, 2, 32, layout="vgg")
    assert models.build("lenet", 1, 10, 32, input_shape=(1, 32, 32)).input_shape == (1, 32, 32)


# --- Adult -----------------------------------------------------------------------------

ADULT_ROWS = [
    "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, "
    "Male, 2174, 0, 40, United-States, <=50K",
    "50, Self-emp-not-inc, 83311, Bachelors, 13, Married-civ-spouse, Exec-managerial, Husband, "
    "Black, Male, 0, 0, 13, United-States, >50K",
    "38, ?, 215646, HS-grad, 9, Divorced, ?, Not-in-family, Asian-Pac-Islander, Female, 0, 0, "
    "40, ?, <=50K",
]
ADULT_TEST_ROWS = [
    "25, Private, 226802, 11th, 7, Never-married, Machine-op-inspct, Own-child, Other, Female, "
    "0, 0, 40, Mexico, <=50K.",
    "44, Private, 160323, Some-college, 10, Married-civ-spouse, Machine-op-inspct, Husband, "
    "Amer-Indian-Eskimo, Male, 7688, 0, 40, United-States, >50K.",
]


def _write_adult(root, data_rows=ADULT_ROWS, test_rows=ADULT_TEST_ROWS):
    root.mkdir(parents=True, exist_ok=True)
    (root / "adult.data").write_text("\n".join(data_rows) + "\n\n")
    (root / "adult.test").write_text("|1x3 Cross validator\n" + "\n".join(test_rows) + "\n")
    return root


def test_adult_from_local_uci_files(tmp_path):
    root = _write_adult(tmp_path / "adult")
    adult = data.load("adult", root=str(root), split="all", drop=["race"])
    names = adult_feature_names(["race"])
    assert adult.x.shape == (5, 1, 1, 103) and len(names) == 103
    assert adult.y.tolist() == [0, 1, 0, 0, 1] and adult.num_classes == 2
    assert adult.attributes["race"].tolist() == [0, 3, 1, 4, 2]  # White Black Asian Other Indian
    assert adult.attributes["sex"].tolist() == [1, 1, 0, 0, 1]
    rows = adult.x.view(5, -1)
    assert 0 <= float(rows.min()) and float(rows.max()) <= 1
    age = rows[:, names.index("age")].tolist()
    assert age == pytest.approx([14 / 25, 1.0, 13 / 25, 0, 19 / 25])
    assert rows[2, names.index("workclass=?")] == 1
    assert rows[3, names.index("native-country=Mexico")] == 1
    assert (rows[:, len(ADULT_CONTINUOUS):].sum(1) == 7).all()  # one hot per categorical
    assert not any(n.startswith("race=") for n in names)
    assert data.load_adult(root, split="test", drop=["race", "sex"]).x.shape == (2, 1, 1, 101)


def test_adult_rejects_values_outside_uci_categories(tmp_path):
    root = _write_adult(tmp_path / "adult", data_rows=[ADULT_ROWS[0].replace("State-gov", "Gov")])
    with pytest.raises(ValueError, match="unknown workclass value.*'Gov'"):
        data.load_adult(root)
    with pytest.raises(ValueError, match="cannot drop \\['colour'\\]"):
        data.load_adult(root, drop=["colour"])


# --- LFW, CelebA, AudioMNIST from small local folders in their real layouts -------------

LFW_COLUMNS = ["Male", "Asian", "White", "Black", "Baby", "Child", "Youth", "Middle Aged",
               "Senior", "Black Hair", "Blond Hair", "Brown Hair", "Bald", "No Eyewear",
               "Eyeglasses", "Sunglasses", "Smiling"]


def _jpeg(path, height, width, seed):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)


def test_lfw_from_a_local_folder(tmp_path):
    base = tmp_path / "lfw-py"
    people = [("Aaron Eckhart", 1), ("Ann Veneman", 2), ("Ann Veneman", 3)]
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(3, len(LFW_COLUMNS)))
    lines = ["# ", "#\tperson\timagenum\t" + "\t".join(LFW_COLUMNS)]
    for (person, number), row in zip(people, scores):
        lines.append("\t".join([person, str(number), *(f"{v:.5f}" for v in row)]))
        folder = person.replace(" ", "_")
        _jpeg(base / "lfw_funneled" / folder / f"{folder}_{number:04d}.jpg", 250, 250, number)
    (base / "lfw_attributes.txt").write_text("\n".join(lines) + "\n")
    lfw = data.load("lfw", root=str(tmp_path), image_set="funneled")
    assert lfw.x.shape == (3, 3, 62, 47) and lfw.num_classes == 2
    col = {c: scores[:, i] for i, c in enumerate(LFW_COLUMNS)}
    assert lfw.y.tolist() == (col["Smiling"] > 0).astype(int).tolist()
    assert lfw.attributes["race"].tolist() == np.argmax(
        np.stack([col["Asian"], col["White"], col["Black"]], 1), 1).tolist()
    assert lfw.attributes["gender"].tolist() == (col["Male"] > 0).astype(int).tolist()
    assert {k: int(lfw.attributes[k].max()) < n for k, n in A.CLASSES["lfw"].items()} == \
        {k: True for k in A.CLASSES["lfw"]}
    assert lfw.attributes["identity"].tolist() == [0, 1, 1]  # one index per person
    (base / "lfw_funneled" / "Ann_Veneman" / "Ann_Veneman_0003.jpg").unlink()
    with pytest.raises(FileNotFoundError, match="1 image.*Ann_Veneman_0003.jpg"):
        data.load_lfw(tmp_path)


def test_celeba_from_a_local_folder(tmp_path):
    base = tmp_path / "celeba"
    names = ["Eyeglasses", "Male", "Smiling", "Young"]
    rows = [[-1, 1, 1, 1], [1, -1, -1, 1], [-1, 1, -1, -1]]
    lines = [str(len(rows)), " ".join(names)]
    for i, row in enumerate(rows, 1):
        lines.append(f"{i:06d}.jpg " + " ".join(f"{v:2d}" for v in row))
        _jpeg(base / "img_align_celeba" / f"{i:06d}.jpg", 218, 178, i)
    (base / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")
    (base / "list_eval_partition.txt").write_text("000001.jpg 0\n000002.jpg 2\n000003.jpg 0\n")
    celeba = data.load_celeba(tmp_path)
    assert celeba.x.shape == (3, 3, 32, 32) and celeba.y.tolist() == [1, 0, 1]
    assert celeba.attributes["age"].tolist() == [0, 0, 1]
    assert celeba.attributes["eyeglasses"].tolist() == [0, 1, 0]
    train = data.load_celeba(tmp_path, split="train", max_images=1)
    assert len(train) == 1 and train.attributes["smiling"].tolist() == [1]


def test_spectrogram_places_a_tone_at_its_frequency():
    rate, size = 48000, 64
    t = np.arange(int(0.6 * rate)) / rate
    image = spectrogram(np.sin(2 * np.pi * 1000 * t), rate, size)
    assert image.shape == (size, size) and 0 <= float(image.min()) and float(image.max()) <= 1
    row = int(image.mean(1).argmax())
    expected = size - 1 - round(1000 / (AUDIO_RATE / 2) * (size - 1))
    assert abs(row - expected) <= 1


def test_audiomnist_from_a_local_folder(tmp_path):
    data_dir = tmp_path / "data"
    meta = {"01": {"accent": "german", "age": 30, "gender": "male", "native speaker": "no"},
            "02": {"accent": "English", "age": "1234", "gender": "female",
                   "native speaker": "yes"},
            "03": {"accent": "German", "age": "22", "gender": "female", "native speaker": "no"}}
    data_dir.mkdir()
    (data_dir / "audioMNIST_meta.txt").write_text(json.dumps(meta, indent=4))
    rng = np.random.default_rng(0)
    for speaker in meta:
        for digit in (3, 7):
            wave = (rng.normal(size=30000) * 3000).astype(np.int16)
            path = data_dir / speaker / f"{digit}_{speaker}_0.wav"
            path.parent.mkdir(exist_ok=True)
            wavfile.write(path, 48000, wave)
    audio = data.load("audiomnist", root=str(tmp_path), size=32)
    assert audio.x.shape == (6, 1, 32, 32) and audio.num_classes == 10
    assert audio.y.tolist() == [3, 7, 3, 7, 3, 7]
    assert audio.attributes["gender"].tolist() == [1, 1, 0, 0, 0, 0]
    assert audio.attributes["identity"].tolist() == [2, 2, 1, 1, 3, 3]
    assert audio.attributes["accent"].tolist() == [0, 0, 1, 1, 0, 0]
    # speaker 02's implausible age '1234' counts as the median of 30 and 22: 26 -> 25-29
    assert audio.attributes["age"].tolist() == [2, 2, 1, 1, 0, 0]
    assert audio.attributes["native"].tolist() == [0, 0, 1, 1, 0, 0]
