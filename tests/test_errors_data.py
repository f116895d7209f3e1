"""Missing or wrong data (docs/errors.md, "Data"): a dataset root that is absent or laid
out wrongly, a truncated archive, an unreadable image, a prepared data folder that was
deleted or damaged. Each fails with one line naming the path and how to obtain or fix
it, and no traceback: through `gradleak prepare-data` / `gradleak fl-run` and, before any
job, through `snakemake`."""

from __future__ import annotations

import gzip
import shutil
import struct

import numpy as np
import pytest
from project import SNAKEMAKE, copy_project, run

from gradleak import cli

CASE = "digits-lenet-iid-k4"


def idx_images(count: int = 20, side: int = 28) -> bytes:
    """An MNIST idx3 image file (torchvision's reader takes it)."""
    pixels = np.random.default_rng(0).integers(0, 256, count * side * side, dtype=np.uint8)
    return struct.pack(">IIII", 2051, count, side, side) + pixels.tobytes()


def idx_labels(count: int = 20) -> bytes:
    return struct.pack(">II", 2049, count) + bytes(i % 10 for i in range(count))


def mnist_config(tmp_path, root) -> str:
    path = tmp_path / "mnist.yaml"
    path.write_text(f"datasets: {{mnist: {{root: '{root}'}}}}\n"
                    f"cases: [{{dataset: mnist, model: lenet}}]\n")
    return str(path)


def fails_with_one_line(capsys, argv: list[str], *expected: str) -> str:
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for part in expected:
        assert part in lines[0], lines[0]
    return lines[0]


def mnist_root(tmp_path, images: bytes, gz: bool = True, layout: str = "MNIST/raw"):
    raw = tmp_path / "root" / layout
    raw.mkdir(parents=True)
    name = "t10k-images-idx3-ubyte"
    if gz:
        (raw / f"{name}.gz").write_bytes(images)
    else:
        (raw / name).write_bytes(images)
    (raw / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_labels()))
    return tmp_path / "root"


@pytest.mark.parametrize("make, expected", [
    (lambda t: t / "absent", ["absent/MNIST/raw/t10k-images-idx3-ubyte", "datasets.mnist.root",
                              "download"]),
    (lambda t: mnist_root(t, gzip.compress(idx_images()), layout="raw"),
     ["root/MNIST/raw/t10k-images-idx3-ubyte", "datasets.mnist.root"]),
    (lambda t: mnist_root(t, gzip.compress(idx_images())[:300]),
     ["t10k-images-idx3-ubyte.gz is truncated or corrupted", "download=True"]),
    (lambda t: mnist_root(t, idx_images()[:5000], gz=False),
     ["t10k-images-idx3-ubyte is truncated or corrupted", "fresh copy"]),
    (lambda t: mnist_root(t, b"<html>not found</html>"),
     ["t10k-images-idx3-ubyte.gz is truncated or corrupted", "Not a gzipped file"]),
], ids=["root_absent", "wrong_layout", "truncated_archive", "truncated_file", "not_an_archive"])
def test_mnist_problems_name_the_path_and_the_fix(tmp_path, capsys, make, expected):
    root = make(tmp_path)
    fails_with_one_line(capsys, ["prepare-data", "--config", mnist_config(tmp_path, root),
                                 "--dataset", "mnist", "--results", str(tmp_path / "results")],
                        *expected)
    assert not (tmp_path / "results" / "data" / "mnist" / "manifest.json").exists()


def test_a_good_synthetic_mnist_root_prepares(tmp_path, capsys):
    """The idx files the other cases damage are fine undamaged."""
    root = mnist_root(tmp_path, gzip.compress(idx_images()))
    assert cli.main(["prepare-data", "--config", mnist_config(tmp_path, root), "--dataset",
                     "mnist", "--results", str(tmp_path / "results")]) == 0


def image_folder(tmp_path, files: dict[str, bytes]):
    for name, content in files.items():
        (tmp_path / "imagenet" / "val" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "imagenet" / "val" / name).write_bytes(content)
    config = tmp_path / "imagenet.yaml"
    config.write_text(f"datasets: {{imagenet: {{root: '{tmp_path / 'imagenet'}', size: 16}}}}\n"
                      f"cases: [{{dataset: imagenet, model: lenet}}]\n")
    return str(config)


def png(side: int = 20) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.full((side, side, 3), 127, np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.parametrize("files, expected", [
    ({"a.png": png()}, ["imagenet/val", "Couldn't find any class folder",
                        "<class>/<image>", "datasets.imagenet.root"]),
    ({"cat/a.png": png(), "cat/b.png": b"<html>"}, ["cannot read image", "cat/b.png",
                                                    "replace or delete it"]),
    ({"cat/a.png": png(), "cat/b.png": png()[:60]}, ["cannot read image", "cat/b.png"]),
], ids=["no_class_folders", "not_an_image", "truncated_image"])
def test_image_folder_problems_name_the_file(tmp_path, capsys, files, expected):
    config = image_folder(tmp_path, files)
    fails_with_one_line(capsys, ["prepare-data", "--config", config, "--dataset", "imagenet",
                                 "--results", str(tmp_path / "results")], *expected)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The digits prepared once, with a configuration for `gradleak fl-run`."""
    root = tmp_path_factory.mktemp("prepared")
    config = root / "config.yaml"
    config.write_text("threads: 1\ncases: [{dataset: digits, model: lenet, "
                      "partition: {clients: 4}}]\nfl: {seeds: [0], rounds: 1}\n")
    assert cli.main(["prepare-data", "--config", str(config), "--dataset", "digits",
                     "--results", str(root / "results")]) == 0
    return root


def damaged(prepared, tmp_path, damage):
    results = tmp_path / "results"
    shutil.copytree(prepared / "results", results)
    damage(results / "data" / "digits")
    return ["fl-run", "--config", str(prepared / "config.yaml"), "--results", str(results),
            "--case", CASE, "--setting", "none-0", "--seed", "0"]


@pytest.mark.parametrize("damage, expected", [
    (shutil.rmtree, ["no prepared dataset at", "data/digits", "prepare-data --dataset digits"]),
    (lambda d: (d / "train_x.npy").unlink(), ["train_x.npy", "is missing", "prepare-data"]),
    (lambda d: (d / "train_y.npy").write_bytes(b"\x93NUMPY"), ["train_y.npy",
                                                               "sha256", "prepare-data"]),
    (lambda d: (d / "manifest.json").write_text('{"dataset": "digits", "spl'),
     ["manifest.json is not valid JSON", "truncated"]),
    (lambda d: (d / "manifest.json").write_text('{"dataset": "digits"}'),
     ["manifest.json is not a prepared-data manifest", "'splits'", "prepare-data"]),
], ids=["data_dir_deleted", "split_deleted", "split_replaced", "manifest_truncated",
        "manifest_of_something_else"])
def test_a_damaged_prepared_folder_is_named(prepared, tmp_path, capsys, damage, expected):
    fails_with_one_line(capsys, damaged(prepared, tmp_path, damage), *expected)


@pytest.mark.slow
def test_snakemake_names_a_missing_dataset_root_before_any_job(tmp_path):
    root = copy_project(tmp_path / "project")
    config = tmp_path / "mnist.yaml"
    config.write_text(f"datasets: {{mnist: {{root: '{tmp_path / 'nowhere'}'}}}}\n"
                      f"cases: [{{dataset: mnist, model: lenet}}]\n")
    proc = run([*SNAKEMAKE, "--cores", "1", "--configfile", str(config)], root, check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("gradleak: ")]
    assert len(lines) == 1, proc.stderr
    assert f"not found at {tmp_path / 'nowhere' / 'MNIST' / 'raw'}" in lines[0]
    assert "download" in lines[0]
    assert not (root / "results" / "logs").exists()


PHASE_JOBS = {  # each phase that reads the prepared data, with a planned job's identity
    "train-evalnet": ["--dataset", "digits"],
    "train-gan": ["--dataset", "digits"],
    "train-giml": ["--case", CASE],
    "fl-run": ["--case", CASE, "--setting", "none-0", "--seed", "0"],
    "train-zoo": ["--case", CASE, "--seed", "0", "--round", "0"],
    "fit-adversaries": ["--case", CASE, "--setting", "none-0", "--seed", "0", "--round", "0"],
    "attack": ["--case", CASE, "--setting", "none-0", "--seed", "0"],
    "attribute": ["--case", CASE, "--setting", "none-0", "--seed", "0"],
}


@pytest.mark.parametrize("command", sorted(PHASE_JOBS))
def test_each_phase_names_a_missing_prepared_data_folder_in_one_line(capsys, tmp_path,
                                                                       command):
    """Without results/data/digits (deleted, or never prepared), every phase that reads it
    stops with one line naming the folder and the command that makes it, before it reads
    anything else (an attack job once ended in a TypeError there)."""
    from conftest import REPO

    config = str(REPO / "config" / "test.yaml")
    fails_with_one_line(capsys, [command, "--config", config, "--results", str(tmp_path),
                                 *PHASE_JOBS[command]],
                        f"no prepared dataset at {tmp_path / 'data' / 'digits'}",
                        "gradleak prepare-data --dataset digits")


def test_gradleak_validate_names_a_missing_evaluation_network_dataset(tmp_path, capsys):
    """Refiner's evaluation network on TinyImageNet whose root points nowhere: `gradleak
    validate` says so in one warning line (a run stops on it before any job, as the
    dataset roots above)."""
    path = tmp_path / "evalnet.yaml"
    path.write_text(f"datasets: {{tinyimagenet: {{root: '{tmp_path / 'nowhere'}'}}}}\n"
                    f"evalnet: {{dataset: tinyimagenet}}\n"
                    f"cases: [{{dataset: digits, model: lenet}}]\n"
                    f"defenses: {{refiner: {{strengths: [0.1]}}}}\n")
    assert cli.main(["validate", "--config", str(path)]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"gradleak validate: warning: dataset 'tinyimagenet' not found at {tmp_path / 'nowhere'}")
