"""Phase ``train_inverter``: Learning to Invert's inversion network (UAI 2023, §3) for one
attack job (case, setting, FL seed), trained as ``inverter:`` says on the public split's
uploads through the setting's defense under the model the job attacks. Declares the
``inverter`` artifact, which the attack ``lti`` loads."""

from __future__ import annotations

import math
from pathlib import Path

from gradleak import data
from gradleak.attacks.lti import Inverter, defended_uploads, train_inverter
from gradleak.experiment import artifacts, cost, paths, plan
from gradleak.experiment.job import Job, model_at
from gradleak.experiment.phase import Kind, Output, Phase, by_model
from gradleak.utils.device import select
from gradleak.utils.io import load_torch, save_torch, write_json
from gradleak.utils.seeding import seed_everything

KIND = "inverter"


def inverter_file(results: Path, case: str, setting, seed) -> Path:
    """The inversion network of one attack job's uploads."""
    return Path(results) / "inverter" / case / str(setting) / f"seed{seed}.pt"


def train_job_inverter(config: dict, results: Path, case: str, setting, seed: int) -> None:
    """The inversion network of one attack job's uploads."""
    job = Job(config, results, case, setting, seed)
    spec = config["inverter"]
    device = select(config["device"])
    seed_everything(spec["seed"], config["threads"])
    public = data.load_prepared(job.data_dir, "public").to(device)
    model = model_at(job, data.load_prepared(job.data_dir, "train"), job.checkpoint).to(device)
    defense = artifacts.build_defense(job, model)
    uploads = defended_uploads(model, public.x, public.y, defense, spec["draws"], spec["seed"],
                               progress=True)
    inverter, losses = train_inverter(
        uploads, public.x, hidden=spec["hidden"], epochs=spec["epochs"],
        batch_size=spec["batch_size"], lr=spec["lr"], features=spec["features"],
        seed=spec["seed"], progress=True)
    out = inverter_file(results, case, setting, seed)
    save_torch(out, {"state": inverter.state_dict(), "inputs": uploads.shape[1] if
                     inverter.keep.numel() == 0 else inverter.keep.numel(),
                     "hidden": spec["hidden"], "image_shape": list(public.x.shape[1:])})
    write_json(out.with_suffix(".json"), {"case": case, "setting": str(setting), "seed": seed,
                                          "public_images": len(public), "spec": spec,
                                          "epoch_losses": losses})


def load_inverter(path: Path) -> Inverter:
    """An inversion network saved by :func:`train_job_inverter` (``weights_only``)."""
    saved = load_torch(path)
    state = saved["state"]
    inverter = Inverter(int(saved["inputs"]), int(saved["hidden"]),
                        tuple(saved["image_shape"]),
                        state["keep"] if state["keep"].numel() else None)
    inverter.load_state_dict(state)
    return inverter.eval()



def _work(config: dict, results: Path, identity: dict) -> dict[str, int]:
    """Each public image's upload (a step of the model at batch 1 and the defense), draws
    times; the training as epochs x batches of a model step at the inverter's batch."""
    job = Job.of(config, results, identity)
    spec = config["inverter"]
    public = cost.split_size(config, results, job.dataset, "public") * spec["draws"]
    name, params = plan.defense_of(job.resolved, job.setting)
    unit = cost.defense_unit(config, results, job.case, name, params,
                             artifacts.defense_needs(job), 1)
    steps = spec["epochs"] * math.ceil(public / spec["batch_size"])
    return {cost.model_unit(config, results, job.case, "fl_step", 1): public,
            **({unit: public} if unit else {}),
            cost.model_unit(config, results, job.case,
                            f"inverter_step:{spec['hidden']}:{spec['features'] or 0}",
                            spec["batch_size"]): steps}


def _time_step(parts: list[str], batch: int, device, gen):
    """One Adam step of the inversion network on random uploads and images
    (``inverter_step:<hidden>:<features, 0: all>:<the case's model>``)."""
    import torch

    model, shape, _ = cost.model_of(parts[2:], device)
    inputs = int(parts[1]) or sum(p.numel() for p in model.parameters())
    net = Inverter(inputs, int(parts[0]), shape).to(device)
    x = torch.rand((batch, inputs), generator=gen).to(device)
    y = torch.rand((batch, *shape), generator=gen).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=0.0)

    def step() -> None:
        opt.zero_grad()
        ((net(x) - y) ** 2).mean().backward()
        opt.step()
    return step


KINDS = {KIND: Kind(
    lambda job, _of: [inverter_file(job.results, job.case, job.setting, job.seed)],
    lambda job, _model, _of: load_inverter(
        inverter_file(job.results, job.case, job.setting, job.seed)))}

PHASE = Phase(
    name="train_inverter",
    summary="train Learning to Invert's inversion network for one attack job's uploads",
    wildcards=("case", "setting", "seed"),
    folders=("inverter",),
    reads=("prepare_data", "train_evalnet", "fl_run", "train_zoo"),
    outputs=lambda config, results, jobs=None: {
        "model": Output(inverter_file(results, "{case}", "{setting}", "{seed}")),
        "log": Output(inverter_file(results, "{case}", "{setting}", "{seed}")
                      .with_suffix(".json"))},
    run=train_job_inverter,
    inputs=lambda config, results, job: [
        paths.data_manifest(results, plan.find_case(config, job["case"])["dataset"]),
        Job.of(config, results, job).checkpoint],
    artifacts=lambda config, results, job: sorted(
        set(artifacts.defense_needs(Job.of(config, results, job)).values())),
    params=lambda config, results, job: {
        "inverter": config["inverter"],
        "defense": plan.defense_of(plan.resolve(config, job["setting"]), job["setting"]),
        "round": plan.resolve(config, job["setting"])["attack"]["protocol"]["round"]},
    gpu=by_model,
    work=_work,
    units={"inverter_step": _time_step},
    startup="startup:gradients",
    priority=artifacts.trained_first,
    kinds=KINDS,
)
