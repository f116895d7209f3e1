"""Phase ``train_gan``: the DCGAN prior of the GAN-based attacks (Radford et al. 2016) on
one dataset's ``gan.split`` (``gan.resolution``, ``gan.width``, ...). A pretrained prior
(StyleGAN2, BigGAN) has no job: its file is its weights file itself
(``experiment.priors``), and no job asks for its dataset's DCGAN."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from gradleak import data, models
from gradleak.data.image_data import resized
from gradleak.experiment import cost, paths
from gradleak.experiment.phase import Output, Phase, always
from gradleak.experiment.resume import Resume, resumed
from gradleak.utils.device import select
from gradleak.utils.io import load_state, save_image_grid, save_torch, write_json
from gradleak.utils.seeding import seed_everything


def save_generator(out: Path, generator: models.Generator, spec: dict, channels: int,
                   log: dict, checkpoints: dict[int, dict] | None = None) -> None:
    """The generator (and GIML's ``checkpoints``, outer step -> state), its samples and
    log. With several checkpoints the samples are one row per kept step, the same 8 latent
    codes in every row (GIAS Fig. 6(a)); else 64 samples, rendered on the generator's
    device from the same codes on every device."""
    device = next(generator.parameters()).device
    save_torch(out, {"generator": generator.state_dict(), "latent_dim": spec["latent_dim"],
                     "width": spec["width"], "channels": channels,
                     "resolution": generator.resolution,
                     **({"checkpoints": checkpoints} if checkpoints else {})})
    with torch.no_grad():
        z = torch.randn(64, spec["latent_dim"], generator=torch.Generator().manual_seed(0))
        z = z.to(device)
        images = generator(z)
        if checkpoints and len(checkpoints) > 1:
            shown = models.Generator(spec["latent_dim"], channels, spec["width"],
                                     generator.resolution).to(device)
            shown.eval()
            images = torch.cat([load_state(shown, state, out, f"step {step}")(z[:8])
                                for step, state in sorted(checkpoints.items())])
        save_image_grid((images + 1) / 2, out.with_suffix(".png"), nrow=8)
    write_json(out.with_suffix(".json"), log)


def train_gan(config: dict, results: Path, dataset: str, resume: Resume | None = None
              ) -> None:
    """The DCGAN prior on ``dataset``'s ``gan.split`` (``gan.dataset``, or the wrong prior an
    attack's ``prior_dataset`` names); with ``resume``, its state is kept there after each
    epoch and a killed job's rerun continues from it."""
    spec = config["gan"]
    if dataset not in config["datasets"]:
        raise ValueError(f"dataset {dataset!r} is not configured; expected one of "
                         f"{sorted(config['datasets'])}")
    device = select(config["device"])
    seed_everything(spec["seed"], config["threads"])
    images = data.load_prepared(paths.data_dir(results, dataset), spec["split"]).x.to(device)
    # the DCGAN generates gan.resolution (32 or 64); attacks resize to the model's input
    size = spec["resolution"]
    images = resized(images, (size, size)).clamp(0, 1)
    generator, log = models.dcgan.train_dcgan(
        images, epochs=spec["epochs"], batch_size=spec["batch_size"], lr=spec["lr"],
        latent_dim=spec["latent_dim"], width=spec["width"], seed=spec["seed"],
        **resumed(resume, f"DCGAN of {dataset}", "epoch"))
    save_generator(paths.gan_file(results, dataset), generator, spec, images.shape[1],
                   {"dataset": dataset, "split": spec["split"], "log": log})
    if resume is not None:
        resume.finish()


def _work(config: dict, results: Path, job: dict) -> dict[str, int]:
    """Epochs x batches of the split, each one step of the DCGAN at its batch."""
    spec = config["gan"]
    size = cost.split_size(config, results, job["dataset"], spec["split"])
    (c, _, _), _ = cost.shape(config, results, job["dataset"])
    size_tag = "" if spec["resolution"] == 32 else f":r{spec['resolution']}"  # 64x64
    return {f"gan_step:{c}:{spec['latent_dim']}:{spec['width']}{size_tag}"
            f":b{spec['batch_size']}": spec["epochs"] * math.ceil(size / spec["batch_size"])}


def _time_step(parts: list[str], batch: int, device, gen):
    """One epoch of the DCGAN on one batch of random images (``gan_step:<channels>:<latent>:
    <width>[:r<resolution>]``)."""
    channels, latent, width = (int(v) for v in parts[:3])
    size = int(parts[3].removeprefix("r")) if len(parts) == 4 else 32
    images = torch.rand((batch, channels, size, size), generator=gen).to(device)
    return lambda: models.dcgan.train_dcgan(images, epochs=1, batch_size=batch, lr=2e-4,
                                            latent_dim=latent, width=width, seed=0,
                                            progress=False)


def _outputs(config: dict, results: Path, jobs=None) -> dict[str, Output]:
    model = paths.gan_file(results, "{dataset}")
    return {"model": Output(model),
            "samples": Output(model.with_suffix(".png"), caption="gan", category="Priors"),
            "log": Output(model.with_suffix(".json"))}


PHASE = Phase(
    name="train_gan",
    summary="train the DCGAN prior on a dataset",
    wildcards=("dataset",),
    folders=("gan",),
    reads=("prepare_data",),
    outputs=_outputs,
    run=train_gan,
    inputs=lambda config, results, job: [paths.data_manifest(results, job["dataset"])],
    params=lambda config, results, job: config["gan"],
    gpu=always,
    work=_work,
    units={"gan_step": _time_step},
    resumable=True,
)
