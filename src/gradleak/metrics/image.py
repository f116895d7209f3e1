"""Image-similarity metrics after optimal matching (Refiner App. E; EPAFL §5).

PSNR, SSIM (scikit-image, data range 1), MSE and LPIPS (``lpips`` package, AlexNet
or VGG-16 backbone from torchvision's weights file in the hub cache). For batches, each
reconstruction is matched to one true image by the assignment that minimises total MSE
(``scipy.optimize.linear_sum_assignment``).
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from gradleak.utils.io import load_torch

# torchvision's ImageNet weights of each LPIPS backbone, as lpips downloads them
LPIPS_BACKBONE_FILES = {"alex": "alexnet-owt-7be5be79.pth", "vgg": "vgg16-397923af.pth"}


def _check(rec: torch.Tensor, truth: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    for name, value in (("rec", rec), ("truth", truth)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of shape (B, C, H, W) in [0, 1], "
                            f"got {type(value).__name__}; pass torch.as_tensor({name})")
    if rec.shape != truth.shape or rec.ndim != 4:
        raise ValueError(f"expected two (B, C, H, W) batches of one shape, got "
                         f"{tuple(rec.shape)} and {tuple(truth.shape)}")
    return rec.detach().float().cpu().clamp(0, 1), truth.detach().float().cpu()


def match(rec: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Reorder ``rec`` so that ``rec[i]`` is the reconstruction assigned to ``truth[i]``."""
    rec, truth = _check(rec, truth)
    if rec.shape[0] == 1:
        return rec
    cost = ((truth.flatten(1)[:, None] - rec.flatten(1)[None]) ** 2).mean(-1)
    cost = torch.nan_to_num(cost, nan=1e30, posinf=1e30)  # NaN images: matched last, kept NaN
    from scipy.optimize import linear_sum_assignment  # imported on use: slow to import

    rows, cols = linear_sum_assignment(cost.numpy())
    return rec[torch.from_numpy(cols[np.argsort(rows)])]


def _reduce(values: np.ndarray, reduction: str) -> float | np.ndarray:
    if reduction == "none":
        return values
    if reduction == "mean":
        return float(np.mean(values))
    raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")


def mse(rec: torch.Tensor, truth: torch.Tensor, reduction: str = "mean"):
    rec, truth = _check(match(rec, truth), truth)
    return _reduce(((rec - truth) ** 2).flatten(1).mean(1).numpy().astype(np.float64), reduction)


def psnr(rec: torch.Tensor, truth: torch.Tensor, reduction: str = "mean"):
    """Peak signal-to-noise ratio in dB for images in [0, 1] (capped at 100 dB)."""
    return _reduce(_decibels(mse(rec, truth, reduction="none")), reduction)


def _decibels(errors) -> np.ndarray:
    """Each MSE as a PSNR in dB for images in [0, 1], capped at 100 dB."""
    return np.array([100.0 if e <= 1e-10 else 10 * math.log10(1.0 / e) for e in errors])


def flat_psnr(truth: torch.Tensor, colour: torch.Tensor, reduction: str = "mean"):
    """PSNR of a uniform image in ``colour`` (one value per channel, in [0, 1]) against
    each true image: what a guess that knows only the data's mean colour scores, the bar
    an attack must clear to reconstruct at all (decision 0111)."""
    truth = _check(truth, truth)[1]
    flat = torch.as_tensor(colour, dtype=truth.dtype).reshape(1, -1, 1, 1)
    errors = ((truth - flat) ** 2).flatten(1).mean(1)
    return _reduce(_decibels(errors.tolist()), reduction)


def ssim(rec: torch.Tensor, truth: torch.Tensor, reduction: str = "mean"):
    """Structural similarity (Wang et al., 2004), scikit-image, data range 1."""
    from skimage.metrics import structural_similarity  # imported on use: slow to import

    rec, truth = _check(match(rec, truth), truth)
    values = np.array([
        structural_similarity(t.permute(1, 2, 0).numpy(), r.permute(1, 2, 0).numpy(),
                              data_range=1.0, channel_axis=-1)
        for r, t in zip(rec, truth)
    ])
    return _reduce(values, reduction)


def lpips_backbone_path(net: str = "alex") -> Path:
    """Where torchvision's hub cache keeps the ``net`` backbone's ImageNet weights."""
    return Path(torch.hub.get_dir()) / "checkpoints" / LPIPS_BACKBONE_FILES[net]


@lru_cache(maxsize=2)
def _lpips_model(net: str = "alex"):
    """LPIPS with the ``net`` backbone (alex, vgg), every weight loaded with
    ``weights_only=True``: ``lpips`` itself would load the backbone through torchvision's
    hub loader, which unpickles with ``weights_only=False`` (a hostile file in the hub
    cache would run)."""
    import inspect
    import warnings

    import lpips

    with warnings.catch_warnings():  # torchvision's note on the deprecated `pretrained=`
        warnings.simplefilter("ignore", UserWarning)
        model = lpips.LPIPS(pretrained=False, pnet_rand=True, net=net, verbose=False)
    path = lpips_backbone_path(net)
    backbone = load_torch(path)
    try:  # each slice keeps the torchvision features' indices as its children's names
        state = {f"net.{name}.{key}": backbone[f"features.{key}"]
                 for name, sl in model.net.named_children() for key in sl.state_dict()}
    except (KeyError, TypeError, IndexError) as err:
        raise ValueError(f"{path} is not torchvision's {net} state dict (missing {err}); "
                         f"delete it: lpips downloads it again") from None
    linear = Path(inspect.getfile(lpips.LPIPS)).parent / "weights" / "v0.1" / f"{net}.pth"
    state.update(load_torch(linear))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or any(not key.startswith(("lins.", "scaling_layer.")) for key in missing):
        raise ValueError(f"{path} and {linear} do not fit LPIPS's {net}: "
                         f"missing {missing}, unexpected {unexpected}")
    return model.eval()


def lpips_unavailable_reason(net: str = "alex") -> str | None:
    """Why LPIPS with the ``net`` backbone cannot be computed offline, or None when it can."""
    path = lpips_backbone_path(net)
    if not path.is_file():
        return (f"LPIPS {net} backbone weights not found at {path} "
                f"(lpips downloads them once when a network is available)")
    return None


def lpips(rec: torch.Tensor, truth: torch.Tensor, reduction: str = "mean", net: str = "alex"):
    """LPIPS (Zhang et al., 2018) on AlexNet's (``alex``) or VGG-16's (``vgg``) features;
    NaN when the backbone's weights are missing."""
    rec, truth = _check(match(rec, truth), truth)
    if lpips_unavailable_reason(net) is not None:
        return _reduce(np.full(rec.shape[0], np.nan), reduction)
    if rec.shape[1] == 1:
        rec, truth = rec.repeat(1, 3, 1, 1), truth.repeat(1, 3, 1, 1)
    with torch.no_grad():
        values = _lpips_model(net)(rec * 2 - 1, truth * 2 - 1).flatten().double().numpy()
    return _reduce(values, reduction)


STLPIPS_MIN_SIDE = 32  # AlexNet's strided first layers need at least this many pixels


@lru_cache(maxsize=1)
def _stlpips_model() -> torch.nn.Module:
    """ST-LPIPS's shift-tolerant AlexNet with the weights its wheel ships, loaded with
    ``weights_only=True`` (the ``lins`` entries alias the ``lin0..4`` layers)."""
    import inspect

    from stlpips_pytorch import stlpips as package

    model = package.LPIPS(pretrained=False, net="alex", variant="shift_tolerant", verbose=False)
    path = Path(inspect.getfile(package)).parent / "weights" / "vST0.0" / "alex_shift_tolerant.pth"
    missing, unexpected = model.load_state_dict(load_torch(path), strict=False)
    if unexpected or any(not key.startswith("lins.") for key in missing):
        raise ValueError(f"{path} does not fit ST-LPIPS's AlexNet: missing {missing}, "
                         f"unexpected {unexpected}")
    return model.eval()


def stlpips(rec: torch.Tensor, truth: torch.Tensor, reduction: str = "mean"):
    """Shift-tolerant LPIPS (Ghildyal and Liu, ECCV 2022), AlexNet, from the weights in the
    ``stlpips-pytorch`` wheel (no download). Gray images are repeated to 3 channels and
    images under 32 pixels a side upsampled (bilinear) to 32, which its AlexNet needs."""
    rec, truth = _check(match(rec, truth), truth)
    if rec.shape[1] == 1:
        rec, truth = rec.repeat(1, 3, 1, 1), truth.repeat(1, 3, 1, 1)
    if min(rec.shape[-2:]) < STLPIPS_MIN_SIDE:
        scale = STLPIPS_MIN_SIDE / min(rec.shape[-2:])
        rec, truth = (torch.nn.functional.interpolate(t, scale_factor=scale, mode="bilinear",
                                                      align_corners=False) for t in (rec, truth))
    with torch.no_grad():
        values = _stlpips_model()(rec * 2 - 1, truth * 2 - 1).flatten().double().numpy()
    return _reduce(values, reduction)


def noise_ratio(images: torch.Tensor, evalnet: torch.nn.Module, reduction: str = "mean"):
    """Refiner's evaluation-network score: the predicted proportion of noise in each image."""
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise TypeError(f"images must be a (B, C, H, W) torch.Tensor, got "
                        f"{getattr(images, 'shape', type(images).__name__)}")
    if not callable(evalnet):
        raise TypeError(f"evalnet must be the trained evaluation network (an nn.Module: "
                        f"models.evalnet.load_evaluation_network(path)), got "
                        f"{type(evalnet).__name__}")
    with torch.no_grad():
        values = evalnet(images.detach().float().cpu().clamp(0, 1)).double().numpy()
    return _reduce(values, reduction)
