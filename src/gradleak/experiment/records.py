"""What an attack job records per victim: the image metrics of its reconstruction
(matched to the truth), why a victim's numbers are missing, each layer's error where a
reconstruction recovered every layer's input, how alike the victims of one class are
(CENSOR Fig. 3), and the reconstruction grids, snapshots and loss traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gradleak import attacks, metrics
from gradleak.types import Observation
from gradleak.utils.io import save_image_grid, save_npy, write_json

IMAGE_METRICS = {"psnr": metrics.psnr, "ssim": metrics.ssim, "mse": metrics.mse,
                 "stlpips": metrics.stlpips}  # and lpips, on the configured backbone


def victim_record(v: int, truth: tuple, obs: Observation, rec: attacks.Reconstruction,
                   wanted: list[str], evalnet: torch.nn.Module | None, attacker: str,
                   lpips_net: str = "alex", colour: torch.Tensor | None = None
                   ) -> tuple[dict, torch.Tensor]:
    """One victim's metrics (batch means, and per image for batches of more than one), by
    the ``attacker`` (``paper``, or ``adaptive``: ``attack.attacker.adaptive``); LPIPS on
    the ``lpips_net`` backbone.

    ``psnr_flat`` (with ``psnr`` and a ``colour``, the training data's mean colour) is
    what a uniform image in that colour scores against the victim's images.

    ``failure`` says why a victim's numbers are not a reconstruction's: a defended upload
    with NaN/inf values, a reconstruction with NaN/inf pixels (its image metrics are NaN,
    never averaged: tables count such victims) or a metric that came out NaN.

    A reconstruction that recovered every layer's input (``extra["inputs"]``, input layer
    first: R-GAP's recursion) adds ``layer_errors``, each one's |x_r - x_r*| / |x_r*|
    against the true batch's, and ``layers``, its per-layer report (``extra["layers"]``:
    rank analysis, residual, how the layer was solved)."""
    idx, x, y = truth
    failure = None
    if not all(torch.isfinite(g).all() for g in obs.gradient.values()):
        failure = "the defended upload has NaN/inf values (the defense diverged)"
    images = rec.images.detach().cpu()
    finite = bool(torch.isfinite(images).all())
    if not finite:
        failure = f"diverged: the reconstruction has NaN/inf pixels (stop: {rec.stop_reason})"
        images = torch.nan_to_num(images, nan=0.0, posinf=1.0, neginf=0.0)  # the grid only
    matched = metrics.match(images, x)
    single = len(y) == 1
    record = {
        "victim": v, "attacker": attacker, "indices": idx.tolist(),
        "label": y.tolist()[0] if single else sorted(y.tolist()),
        "predicted_label": rec.labels.tolist()[0] if single else sorted(rec.labels.tolist()),
        "iterations": rec.iterations, "stop_reason": rec.stop_reason,
        # the objective evaluations of the victim's restarts: its per-victim clock
        "evaluations": rec.extra.get("evaluations"),
        "final_loss": rec.loss_trace[-1] if rec.loss_trace else None,
        "wall_time": rec.wall_time, "fallback": bool(obs.gradient.info.get("fallback", False)),
        # the numbers a defense reports about its upload (Refiner's robust_mse, Table 10)
        "upload_report": {k: v for k, v in obs.gradient.info.items() if isinstance(v, float)},
    }
    for name in wanted:
        if not finite:
            values = np.full(len(y), np.nan)
        else:
            values = np.asarray(metrics.noise_ratio(matched, evalnet, reduction="none")
                                if name == "noise_ratio"
                                else metrics.lpips(matched, x, "none", lpips_net)
                                if name == "lpips"
                                else IMAGE_METRICS[name](matched, x, reduction="none"), float)
            if name != "lpips" and not np.isfinite(values).all():  # lpips: NaN when offline
                failure = failure or f"the {name} metric is NaN/inf on this reconstruction"
        record[name] = float(np.mean(values))
        if not single:
            record[f"{name}_per_image"] = [float(value) for value in values]
    if "psnr" in wanted and colour is not None:  # the bar of decision 0111
        record["psnr_flat"] = float(metrics.flat_psnr(x, colour))
    if "inputs" in rec.extra:  # GIAS Figs. A1, A2: the error of every layer's input
        record["layer_errors"] = metrics.layer_errors(obs.model, x, rec.extra["inputs"])
        record["layers"] = rec.extra.get("layers")
    record["failure"] = failure
    return record, matched


def save_details(out: Path, label: str, recs: list[attacks.Reconstruction], truths: list,
                  matched: list[torch.Tensor], spec: dict) -> None:
    """The reconstruction grid, and the snapshots and loss traces when asked for."""
    shown = min(spec["outputs"]["grid_victims"], len(recs))
    truth_images = torch.cat([t[1] for t in truths[:shown]])
    save_image_grid(torch.cat([truth_images, torch.cat(matched[:shown])]),
                    out / f"recon_{label}.png", nrow=len(truth_images))
    if spec["outputs"]["snapshots"]:  # (victims, snapshots + the truth, batch, C, H, W), uint8
        frames = np.stack([np.stack([*(metrics.match(torch.nan_to_num(rec.snapshots[t]),
                                                     truth[1]).numpy()
                                       for t in spec["outputs"]["snapshots"]), truth[1].numpy()])
                           for rec, truth in zip(recs, truths)])
        save_npy(out / f"snapshots_{label}.npy", (frames * 255).round().astype(np.uint8))
    if spec["outputs"]["traces"]:
        write_json(out / f"traces_{label}.json", [rec.loss_trace for rec in recs])


def failed(obs: Observation, reason: str, snapshots: list[int]) -> attacks.Reconstruction:
    """What an attack that broke down numerically recorded: NaN images, the reason."""
    images = torch.full((obs.batch_size, *obs.input_shape), float("nan"))
    return attacks.Reconstruction(images, torch.zeros(obs.batch_size, dtype=torch.long), [], 0,
                                  0.0, reason, snapshots={t: images for t in snapshots})


def finite_mean(values: list[float]) -> float:
    finite = [v for v in values if np.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


def add_likeness(records: list[dict], matched: list[torch.Tensor], truths: list) -> None:
    """CENSOR Fig. 3 (victims of one class): GGL's reconstructions "are similar to each
    other, and notably distinct from the ground-truth image". Each victim's record gets
    ``pairwise_ssim``, the mean SSIM of its reconstruction to every other victim's, and
    ``truth_pairwise_ssim``, the same between the true images (how alike the inputs
    are); NaN with one victim."""

    def mean_to_others(images: list[torch.Tensor], v: int) -> float:
        values = [float(metrics.ssim(images[v], images[w]))
                  for w in range(len(images)) if w != v]
        return float(np.mean(values)) if values else float("nan")

    truth_images = [t[1] for t in truths]
    for v, record in enumerate(records):
        record["pairwise_ssim"] = mean_to_others(list(matched), v)
        record["truth_pairwise_ssim"] = mean_to_others(truth_images, v)
