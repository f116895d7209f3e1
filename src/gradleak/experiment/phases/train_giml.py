"""Phase ``train_giml``: GIML's generator (GIAS §4.2, Alg. 2), meta-learned from client
gradients of a case's undefended FL run. Declares the ``giml_generator`` artifact (the
generator kept at an outer step, ``giml.checkpoints``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gradleak import data, defenses, models
from gradleak.attacks.giml import meta_learn_generator
from gradleak.experiment import cost, paths, plan
from gradleak.experiment.job import Job, model_at
from gradleak.experiment.phase import Kind, Output, Phase, always
from gradleak.experiment.phases.train_gan import save_generator
from gradleak.experiment.resume import Resume, resumed
from gradleak.types import Observation
from gradleak.utils.device import select
from gradleak.utils.seeding import seed_everything

META_KEYS = ("outer_steps", "tasks_per_step", "latent_iterations", "parameter_iterations",
             "lr_z", "lr_w", "meta_optimizer", "meta_lr", "tv", "z_norm", "seed")


def _undefended(config: dict, results: Path, case: str) -> Job:
    """The case's undefended run of the first attacked seed, whose clients GIML observes."""
    return Job(config, results, case, plan.NONE, config["attack"]["attacker"]["seeds"][0])


def train_giml(config: dict, results: Path, case: str, resume: Resume | None = None) -> None:
    """GIML's generator, meta-learned from client gradients of the undefended FL run; with
    ``resume``, its state (the kept steps' generators too) is kept there after each outer
    step and a killed job's rerun continues from it."""
    spec = config["giml"]
    job = _undefended(config, results, case)
    device = select(config["device"])
    seed_everything(spec["seed"], config["threads"])
    train = data.load_prepared(job.data_dir, "train").to(device)
    model = model_at(job, train, job.checkpoint).to(device)
    rng = np.random.default_rng(spec["seed"])
    chosen = rng.choice(len(train), spec["observations"] * spec["batch_size"], replace=False)
    observations = []
    none = defenses.build("none")
    for batch in np.sort(chosen).reshape(spec["observations"], spec["batch_size"]):
        idx = torch.from_numpy(batch)
        update = none(defenses.DefenseContext(model, train.x[idx], train.y[idx]))
        observations.append(Observation(model=model, gradient=update, batch_size=len(idx)))
    generator = models.Generator(spec["latent_dim"], train.x.shape[1], spec["width"])
    torch.manual_seed(spec["seed"])
    generator.apply(models.dcgan.init_weights)
    kept = sorted({*spec["checkpoints"], spec["outer_steps"]})  # Fig. 6: attacks' `step`
    checkpoints: dict[int, dict] = {}

    def keep(step: int, net: torch.nn.Module, _entry: dict | None = None) -> None:
        if step in kept:
            checkpoints[step] = {k: v.detach().cpu().clone() for k, v in net.state_dict().items()}

    keep(0, generator)  # the random start
    loop = resumed(resume, f"GIML of {case}", "step")
    if loop.get("resume_from"):  # the kept steps' generators made before the kill
        checkpoints.update(loop["resume_from"]["checkpoints"])
    if loop:  # kept with them
        save = loop["keep"]
        loop["keep"] = lambda state: save({**state, "checkpoints": checkpoints})
    meta, log = meta_learn_generator(observations, generator, callback=keep,
                                     **{k: spec[k] for k in META_KEYS}, **loop)
    save_generator(paths.giml_file(results, case), meta, spec, train.x.shape[1],
                   {"case": case, "spec": spec, "indices": sorted(chosen.tolist()),
                    "checkpoints": kept, "log": log}, checkpoints)
    if resume is not None:
        resume.finish()


def _work(config: dict, results: Path, job: dict) -> dict[str, int]:
    """Outer steps x tasks x (latent + parameter iterations) of the inner searches, each
    through the generator (``giml_iteration``, at ``giml.batch_size``)."""
    spec = config["giml"]
    iterations = spec["latent_iterations"] + spec["parameter_iterations"]
    model, batch = cost.model_unit(config, results, job["case"], "giml_iteration",
                                   spec["batch_size"]).rsplit(":", 1)
    return {f"{model}:{spec['latent_dim']}:{spec['width']}:{batch}":
            spec["outer_steps"] * spec["tasks_per_step"] * iterations}


def _time_iterations(parts: list[str], batch: int, device, gen):
    """``TIMED_ITERATIONS`` latent and as many parameter iterations of Alg. 2's inner
    searches (``adapt``) on one random task of the unit's model, through a random DCGAN of
    its ``latent_dim`` and ``width``: ``share`` iterations a call (``giml_iteration``)."""
    from gradleak.attacks.giml import adapt

    model, shape, classes = cost.model_of(parts[:-2], device)
    x = torch.rand((batch, *shape), generator=gen).to(device)
    y = torch.randint(classes, (batch,), generator=gen).to(device)
    task = Observation(model=model, batch_size=batch, input_shape=shape,
                       gradient=defenses.build("none")(defenses.DefenseContext(model, x, y)))
    generator = models.dcgan.untrained_generator(int(parts[-2]), shape[0], int(parts[-1]), 0,
                                                 shape[1]).to(device)
    return lambda: adapt(generator, [task], latent_iterations=TIMED_ITERATIONS,
                         parameter_iterations=TIMED_ITERATIONS, lr_z=0.03, lr_w=1e-3,
                         z_norm=1e-3, tv=1e-4, distance="cosine", rng=gen)


TIMED_ITERATIONS = 25
_time_iterations.share = 2 * TIMED_ITERATIONS


def _outputs(config: dict, results: Path, jobs=None) -> dict[str, Output]:
    model = paths.giml_file(results, "{case}")
    return {"model": Output(model),
            "samples": Output(model.with_suffix(".png"), caption="giml", category="Priors"),
            "log": Output(model.with_suffix(".json"))}


def _file(job: Job) -> Path:
    return paths.giml_file(job.results, job.case)


KINDS = {"giml_generator": Kind(
    lambda job, _of: [_file(job)],
    lambda job, _model, of: models.dcgan.load_generator(
        _file(job), step=None if of is None else int(of)))}

PHASE = Phase(
    name="train_giml",
    summary="meta-learn GIML's generator for a case",
    wildcards=("case",),
    folders=("giml",),
    reads=("prepare_data", "fl_run"),
    outputs=_outputs,
    run=train_giml,
    inputs=lambda config, results, job: [
        paths.data_manifest(results, plan.find_case(config, job["case"])["dataset"]),
        _undefended(config, results, job["case"]).checkpoint],
    params=lambda config, results, job: config["giml"],
    gpu=always,
    work=_work,
    units={"giml_iteration": _time_iterations},
    startup="startup:gradients",
    kinds=KINDS,
    resumable=True,
)
