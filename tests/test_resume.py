"""Long jobs resume where they stopped (``experiment.resume``, docs/errors.md "One job
killed"): an attack stopped after some chunks of victims, or an FL run stopped between
evaluation rounds, continues from what it kept and ends byte for byte as an uninterrupted
run; a kept piece is recomputed only when it was never finished."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import lenet_victims, observe_defended

from fedleak import attacks, data, defenses
from fedleak.experiment.resume import Resume
from fedleak.fl import FLSettings, run_federated
from fedleak.models import LeNet


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


def test_an_attack_resumes_after_its_last_kept_chunk(digits, tmp_path):
    observations = [observe_defended(v, "none") for v in lenet_victims(digits, 4)]
    attack = attacks.build("inverting_gradients", iterations=8, seed=3)
    whole = attacks.reconstruct_all(attack, observations, engine="loop")
    resume = Resume(tmp_path / "job")
    with pytest.raises(Killed):
        attacks.reconstruct_all(attack, observations, engine="loop",
                                kept=interrupted(resume, 2))
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
                          server_optimizer="adam", server_lr=0.01, participation=0.5,
                          eval_every=3)
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
