"""Phase ``fl_run``: federated training of one case under one setting's defense (FedAvg,
``fl.run_federated``), the model saved at every round some job attacks, and at the end."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch

from gradleak import data, defenses
from gradleak.experiment import artifacts, cost, fl_runs, paths, plan
from gradleak.experiment.job import Job, build_model
from gradleak.experiment.phase import Output, Phase, by_model
from gradleak.experiment.resume import Resume
from gradleak.fl import FLSettings, run_federated
from gradleak.needs import artifact_parts
from gradleak.utils.device import select
from gradleak.utils.io import save_torch, write_json
from gradleak.utils.seeding import child_seeds, seed_everything


def run_fl(config: dict, results: Path, case: str, setting, seed: int,
           resume: Resume | None = None) -> None:
    """Federated training of one case under one setting's defense; the model is saved at
    every round some setting attacks, and at the end. With ``resume``, the run's state is
    kept there at each evaluation round, and a killed run's rerun continues from it."""
    plan.find_case(config, case)
    if setting != plan.NONE:  # every case's undefended run: the reference of PMM and of GIML
        plan.check_planned(fl_runs.fl_settings(config), case, plan.fl_setting(setting), "FL run")
    job = Job(config, results, case, plan.fl_setting(setting), seed)
    plan.check_seed(seed, config["fl"]["seeds"], "fl.seeds")
    seeds = child_seeds(seed, ["partition", "init", "rounds"])
    device = select(config["device"])
    seed_everything(seeds["init"], config["threads"])
    train = data.load_prepared(job.data_dir, "train")
    test = data.load_prepared(job.data_dir, "test").to(device)
    # the model first: every setting of one seed starts from the same weights, whatever
    # its defense draws while it is built (RecUP-FL's zoo, Refiner's network)
    model = build_model(job.spec, train).to(device)
    defense = artifacts.build_defense(job, model)
    part = job.spec["partition"]
    groups = train.attributes[part["attribute"]].numpy() if part["kind"] == "attribute" \
        else None  # RecUP-FL Fig. 7: whole identities per client
    shards = data.partition(train.y.numpy(), part["kind"], part["clients"],
                            np.random.default_rng(seeds["partition"]), part.get("alpha"), groups)
    train = train.to(device)  # once: the clients' batches are drawn on the device
    rounds = set(plan.checkpoint_rounds(config))

    diverged: list[int] = []  # the first round that starts from non-finite weights

    def checkpoint(r: int, m: torch.nn.Module) -> None:
        if not diverged and not all(torch.isfinite(p).all() for p in m.parameters()):
            diverged.append(r)
        if r in rounds:
            save_torch(paths.checkpoint(results, case, job.setting, seed, r), m.state_dict())
            if resume is not None:  # the job's outputs go when it is killed; this stays
                resume.keep(f"round{r}", m.state_dict())

    kept = resume.latest("state") if resume is not None else None
    if kept is not None:  # the killed run's checkpoints, then its state
        print(f"FL {case} {job.setting} seed {seed}: resuming at round {kept['round']} of "
              f"{job.resolved['fl']['rounds']} from {resume.folder}", file=sys.stderr)
        diverged += kept.pop("diverged")
        for r in sorted(rounds):
            if r <= kept["round"]:
                save_torch(paths.checkpoint(results, case, job.setting, seed, r),
                           resume.latest(f"round{r}", restore=False))
    start = time.perf_counter()
    history = run_federated(
        model, train, test, shards, defense, FLSettings.from_config(job.resolved["fl"]),
        seeds["rounds"], checkpoint, keep=None if resume is None else
        lambda state: resume.keep("state", {**state, "diverged": diverged}), resume_from=kept)
    failure = None
    if diverged:  # a defense (or the server optimiser) made the weights NaN/inf
        failure = (f"diverged: the model's weights are NaN/inf from round {diverged[0]} on (a "
                   f"defended upload or the server step was not finite); accuracy from then "
                   f"on is not measured")
        for entry in history:
            if entry["round"] >= diverged[0]:
                entry["accuracy"] = float("nan")
        print(f"FL {case} {job.setting} seed {seed}: {failure}", file=sys.stderr)
    save_torch(job.fl_dir / "final.pt", model.state_dict())
    uploads = sum(entry["uploads"] for entry in history)
    write_json(job.fl_dir / "metrics.json", {
        "case": case, "setting": job.setting.text, "defense": job.setting.label,
        "strength": job.setting.strength, "seed": seed, "history": history,
        "final_accuracy": history[-1]["accuracy"], "client_sizes": [len(s) for s in shards],
        "fallback_rate": sum(entry["fallbacks"] for entry in history) / max(uploads, 1),
        "wall_time": time.perf_counter() - start, "failure": failure,
    })
    print(f"FL {case} {job.setting} seed {seed}: accuracy {history[-1]['accuracy']:.4f}",
          file=sys.stderr)
    if resume is not None:
        resume.finish()



def _outputs(config: dict, results: Path, jobs=None) -> dict:
    folder = paths.fl_dir(results, "{case}", "{setting}", "{seed}")
    return {"metrics": Output(folder / "metrics.json"), "final": Output(folder / "final.pt"),
            "checkpoints": [Output(paths.checkpoint(results, "{case}", "{setting}", "{seed}", r))
                            for r in plan.checkpoint_rounds(config)]}


def _params(config: dict, results: Path, job: dict) -> dict:
    """What an FL run reads from the configuration."""
    resolved = plan.resolve(config, job["setting"])
    return {"fl": resolved["fl"], "case": plan.find_case(config, job["case"]),
            "defense": plan.defense_of(resolved, job["setting"]),
            "rounds": plan.checkpoint_rounds(config)}


def _work(config: dict, results: Path, job: dict) -> dict[str, int]:
    """The run's local steps (``cost.fl_steps``), each one client step of the case's model,
    and rounds x clients per round defended uploads."""
    resolved = plan.resolve(config, job["setting"])
    case = plan.find_case(config, job["case"])
    clients, batch = case["partition"]["clients"], resolved["fl"]["client_batch_size"]
    train = data.datasets.split_capacity(case["dataset"], config["datasets"].get(
        case["dataset"], {}))
    work = {cost.model_unit(config, results, job["case"], "fl_step", batch):
            cost.fl_steps(resolved, clients, train)}
    name, params = plan.defense_of(resolved, job["setting"])
    needs = {arg: artifact_parts(artifact)[0]
             for arg, artifact in defenses.needs(name, params).items()}
    defended = cost.defense_unit(config, results, job["case"], name, params, needs, batch)
    if defended is not None:
        work[defended] = cost.uploads(resolved, clients)
    return work


PHASE = Phase(
    name="fl_run",
    summary="federated training of one case under one setting",
    wildcards=("case", "setting", "seed"),
    folders=("fl",),
    reads=("prepare_data", "train_evalnet", "train_zoo"),
    outputs=_outputs,
    run=run_fl,
    planned=lambda config: [{"case": case, "setting": setting, "seed": seed}
                            for case, setting in fl_runs.fl_settings(config)
                            for seed in config["fl"]["seeds"]],
    inputs=lambda config, results, job: [
        paths.data_manifest(results, plan.find_case(config, job["case"])["dataset"])],
    artifacts=lambda config, results, job: list(
        artifacts.defense_needs(Job.of(config, results, job)).values()),
    params=_params,
    gpu=by_model,
    memory_mb=2000,
    timed=True,
    work=_work,
    priority=artifacts.trained_first,
    resumable=True,
)
