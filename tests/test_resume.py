"""Long jobs resume where they stopped (``experiment.resume``, docs/errors.md "One job
killed"): an attack stopped after some chunks of victims, or an FL run stopped between
evaluation rounds, continues from what it kept and ends byte for byte as an uninterrupted
run; a kept piece is recomputed only when it was never finished."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import lenet_victims, observe_defended

from gradleak import attacks, data, defenses
from gradleak.adversaries.zoo import train_zoo
from gradleak.attacks.giml import meta_learn_generator
from gradleak.experiment.resume import Resume
from gradleak.fl import FLSettings, run_federated
from gradleak.models import Generator, LeNet
from gradleak.models.dcgan import init_weights, train_dcgan
from gradleak.types import Update
from gradleak.utils.io import save_torch


class Killed(Exception):
    """What a SIGKILL is to the job: it stops between two pieces of work."""


def interrupted(resume: Resume, after: int):
    """``resume``'s ``piece`` that dies when asked for piece ``after`` + 1."""
    asked = []

    def kept(begin, run):
        if len(asked) == after:
            raise Killed
        asked.append(begin)
        return resume.piece(f"ig.{begin}", run, lambda recs: [r.__dict__ for r in recs],
                            lambda kept: [attacks.Reconstruction(**r) for r in kept])
    return kept


def killed_attack(digits, tmp_path):
    """Inverting Gradients on 4 victims, run whole and then killed after 2 kept chunks:
    the attack, its observations, the whole run's reconstructions and the kept pieces."""
    observations = [observe_defended(v, "none") for v in lenet_victims(digits, 4)]
    attack = attacks.build("inverting_gradients", iterations=8, seed=3)
    whole = attacks.reconstruct_all(attack, observations, engine="loop")
    resume = Resume(tmp_path / "job")
    with pytest.raises(Killed):
        attacks.reconstruct_all(attack, observations, engine="loop",
                                kept=interrupted(resume, 2))
    return attack, observations, whole, resume


def test_an_attack_resumes_after_its_last_kept_chunk(digits, tmp_path):
    attack, observations, whole, resume = killed_attack(digits, tmp_path)
    assert sorted(p.name for p in resume.folder.iterdir()) == ["ig.0.pt", "ig.1.pt"]
    computed = []

    def counted(begin, run):
        return resume.piece(f"ig.{begin}", lambda: computed.append(begin) or run(),
                            lambda recs: [r.__dict__ for r in recs],
                            lambda kept: [attacks.Reconstruction(**r) for r in kept])
    torch.manual_seed(123)  # the rerun's generators differ until a kept piece restores them
    again = attacks.reconstruct_all(attack, observations, engine="loop", kept=counted)
    assert computed == [2, 3]  # the two kept chunks were read, not recomputed
    for a, b in zip(whole, again):
        assert torch.equal(a.images, b.images) and a.loss_trace == b.loss_trace
    resume.finish()
    assert not (tmp_path / "job").exists()


def test_the_kept_piece_puts_the_global_generators_back(tmp_path):
    resume = Resume(tmp_path / "job")
    torch.manual_seed(0)
    np.random.seed(0)
    first = resume.piece("p", lambda: torch.rand(2), lambda t: t, lambda t: t)
    after = (torch.rand(1), np.random.rand())
    torch.manual_seed(99)
    np.random.seed(99)
    assert torch.equal(resume.piece("p", lambda: torch.rand(2), lambda t: t, lambda t: t),
                       first)
    assert (torch.rand(1), np.random.rand()) == after


def federated(digits, keep=None, resume_from=None) -> tuple[dict, list[dict]]:
    """Nine rounds of FedAvg under DP-Gaussian (its noise: the run's own generator),
    evaluated every third; the final weights and the history."""
    torch.manual_seed(0)
    model = LeNet(1, 10, 32)
    train, test = digits.subset(torch.arange(400)), digits.subset(torch.arange(400, 600))
    shards = data.partition(train.y.numpy(), "iid", 4, np.random.default_rng(0))
    settings = FLSettings(rounds=9, client_batch_size=8, local_steps=1, local_lr=0.1,
                          local_epochs=0, server_optimizer="adam", server_lr=0.01,
                          participation=0.5, eval_every=3)
    history = run_federated(model, train, test, shards, defenses.build("dp_gaussian", sigma=0.01),
                            settings, seed=5, progress=False, keep=keep,
                            resume_from=resume_from)
    return model.state_dict(), history


def test_an_fl_run_resumes_from_its_last_kept_round(digits, tmp_path):
    weights, history = federated(digits)
    resume = Resume(tmp_path / "job")

    def keep(state):
        if state["round"] == 6:
            raise Killed
        resume.keep("state", state)
    with pytest.raises(Killed):
        federated(digits, keep=keep)
    kept = resume.latest("state")
    assert kept["round"] == 3 and [e["round"] for e in kept["history"]] == [0, 3]
    again, resumed = federated(digits, resume_from=kept)
    assert resumed == history
    assert all(torch.equal(weights[k], again[k]) for k in weights)


def interrupted_at(count: int, resume: Resume):
    """A ``keep`` that keeps each state in ``resume`` (written, as a job's) until it is
    handed its ``count``-th, then dies."""
    handed = []

    def keep(state):
        handed.append(1)
        if len(handed) == count:
            raise Killed
        resume.keep("state", state)
    return keep


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("damaged", [False, True], ids=["kept", "damaged"])
def test_dcgan_training_resumes_after_its_last_kept_epoch(digits, tmp_path, damaged):
    """Killed after one kept epoch, the rerun continues from it; its kept state damaged,
    the rerun discards it and trains again from the start: the same weights either way."""
    images = digits.x[:48]
    train = dict(epochs=3, batch_size=16, lr=2e-4, latent_dim=8, width=8, seed=0,
                 progress=False)
    whole, log = train_dcgan(images, **train)
    resume = Resume(tmp_path / "gan")
    with pytest.raises(Killed):
        train_dcgan(images, **train, keep=interrupted_at(2, resume))
    if damaged:
        damage(resume.folder / "state.pt")
    kept = resume.latest("state")
    again, resumed_log = train_dcgan(images, **train, resume_from=kept)
    assert (kept is None if damaged else kept["epoch"] == 1) and resumed_log == log
    assert same_weights(whole.state_dict(), again.state_dict())


@pytest.mark.parametrize("damaged", [False, True], ids=["kept", "damaged"])
def test_giml_resumes_after_its_last_kept_outer_step(digits, tmp_path, damaged):
    tasks = []
    for i in range(3):
        torch.manual_seed(i)
        model, x, y = LeNet(1, 10, 32), digits.x[i:i + 1], digits.y[i:i + 1]
        tasks.append(attacks.Observation(model=model, gradient=Update.of(model, x, y),
                                         batch_size=1))
    torch.manual_seed(0)
    generator = Generator(16, 1, 8)
    generator.apply(init_weights)
    learn = dict(outer_steps=3, tasks_per_step=2, latent_iterations=2,
                 parameter_iterations=2, lr_z=0.01, lr_w=1e-4, meta_optimizer="adam",
                 meta_lr=1e-3, tv=1e-4, z_norm=1e-4, seed=0)
    whole, log = meta_learn_generator(tasks, generator, **learn)
    resume = Resume(tmp_path / "giml")
    with pytest.raises(Killed):
        meta_learn_generator(tasks, generator, **learn, keep=interrupted_at(3, resume))
    if damaged:
        damage(resume.folder / "state.pt")
    kept = resume.latest("state")
    again, resumed_log = meta_learn_generator(tasks, generator, **learn, resume_from=kept)
    assert (kept is None if damaged else kept["step"] == 2) and resumed_log == log
    assert same_weights(whole.state_dict(), again.state_dict())


@pytest.mark.parametrize("damaged", [False, True], ids=["kept", "damaged"])
def test_a_model_zoo_trains_only_the_models_it_did_not_keep(tmp_path, damaged):
    """A killed zoo's rerun trains the models it did not keep, and one whose kept file is
    damaged again: the same models as a zoo trained whole."""
    rng = torch.Generator().manual_seed(0)
    features, labels = torch.randn(40, 12, generator=rng), {"a": torch.arange(40) % 2}
    train = dict(size=3, epochs=2, lr=0.01, seed=0, widths=(8, 16))
    whole = train_zoo(features, labels, {"a": 2}, **train)
    resume, trained = Resume(tmp_path / "zoo"), []

    def kept(name, run, stop=None):
        if name == stop:
            raise Killed
        return resume.piece(name, lambda: trained.append(name) or run(), dict, dict)
    with pytest.raises(Killed):
        train_zoo(features, labels, {"a": 2}, **train,
                  kept=lambda name, run: kept(name, run, stop="a.2"))
    trained.clear()
    if damaged:
        damage(resume.folder / "a.0.pt")
    again = train_zoo(features, labels, {"a": 2}, **train, kept=kept)
    assert trained == (["a.0", "a.2"] if damaged else ["a.2"])
    assert all(same_weights(m.state_dict(), n.state_dict())
               for m, n in zip(whole.models["a"], again.models["a"]))


def damage(path) -> None:
    """What a disk error or a half-copied folder leaves: 64 random bytes."""
    path.write_bytes(np.random.default_rng(0).bytes(64))


def test_a_damaged_kept_attack_chunk_is_recomputed_with_a_warning(digits, tmp_path, capsys):
    attack, observations, whole, resume = killed_attack(digits, tmp_path)
    damage(resume.folder / "ig.1.pt")
    computed = []

    def counted(begin, run):
        return resume.piece(f"ig.{begin}", lambda: computed.append(begin) or run(),
                            lambda recs: [r.__dict__ for r in recs],
                            lambda kept: [attacks.Reconstruction(**r) for r in kept])
    again = attacks.reconstruct_all(attack, observations, engine="loop", kept=counted)
    assert computed == [1, 2, 3]  # the damaged chunk is done again, the good one read
    assert all(torch.equal(a.images, b.images) for a, b in zip(whole, again))
    warned = capsys.readouterr().err
    assert "gradleak: warning: a damaged kept piece is discarded and its work done again" in \
        warned and "ig.1.pt is not a readable torch file" in warned


def test_a_damaged_kept_fl_state_is_discarded_and_the_run_done_again(digits, tmp_path,
                                                                    capsys):
    # the FL run, the DCGAN and GIML keep their state alike (``Resume.latest``)
    weights, history = federated(digits)
    resume = Resume(tmp_path / "job")
    with pytest.raises(Killed):
        federated(digits, keep=interrupted_at(2, resume))
    damage(resume.folder / "state.pt")
    kept = resume.latest("state")
    assert kept is None and not (resume.folder / "state.pt").exists()
    assert "state.pt is not a readable torch file" in capsys.readouterr().err
    again, rerun = federated(digits, keep=lambda state: resume.keep("state", state),
                             resume_from=kept)
    assert rerun == history and same_weights(weights, again)
    save_torch(resume.folder / "state.pt", {"round": 3})  # it loads, but holds no generators
    assert resume.latest("state") is None
    assert "holds no kept state and generator state" in capsys.readouterr().err


def test_two_jobs_beside_each_other_one_finishing_the_other_keeping_a_piece(tmp_path,
                                                                          monkeypatch):
    """A finished job removes the empty folders above its own while another job makes its
    folder there (CI, 2026-12-02: ``mkdir`` of a parent just removed): both go on."""
    partial = tmp_path / ".partial"
    finishing = Resume(partial / "fl_run" / "case" / "none-0" / "seed0" / "digest")
    finishing.keep("state", {"round": 1})
    real_mkdir, raced = os.mkdir, []

    def mkdir_while_the_other_finishes(path, mode=0o777):
        real_mkdir(path, mode)
        if Path(path).name == "attack" and not raced:  # the other's finish: .partial goes
            raced.append(path)
            os.rmdir(path)
            finishing.finish()
    monkeypatch.setattr(os, "mkdir", mkdir_while_the_other_finishes)
    keeping = Resume(partial / "attack" / "case" / "rounding-0.01" / "seed0" / "digest")
    keeping.keep("state", {"victims": 2})
    assert raced and not (partial / "fl_run").exists()
    assert keeping.latest("state") == {"victims": 2}

    real_rmdir = os.rmdir

    def rmdir_of_a_folder_just_filled(path, **kw):
        if Path(path).name == "case":  # the other job made its folder there a moment ago
            raise OSError(errno.ENOTEMPTY, "Directory not empty", str(path))
        real_rmdir(path, **kw)
    monkeypatch.setattr(os, "rmdir", rmdir_of_a_folder_just_filled)
    keeping.finish()
    assert (partial / "attack" / "case").is_dir() and not keeping.folder.exists()
