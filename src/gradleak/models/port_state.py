"""Loading a public PyTorch port's generator weights into gradleak's re-implementation.

The ports (rosinality/stylegan2-pytorch, huggingface/pytorch-pretrained-BigGAN) publish
their weights as a ``torch.save`` of a state dict (StyleGAN2: inside a dict under ``g_ema``).
gradleak's modules use the same parameter and buffer names, so the file loads key for key,
read with ``weights_only=True`` (``gradleak.utils.io.load_torch``); a file that does not fit
is refused naming the file and the first missing, unexpected or mis-shaped key.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from gradleak.utils.io import ArtifactError, load_torch

REMEDY = "check the file and the architecture settings (resolution, widths, latent size)"


def load_port_state(module: nn.Module, path: str | os.PathLike, what: str,
                    container: str | None = None, check_only: bool = False) -> nn.Module:
    """``module`` with the state dict read from ``path`` (under the key ``container`` when
    the file is a dict holding it, or the file itself), in eval mode. FileNotFoundError
    when ``path`` is absent; ArtifactError naming ``path`` and the first missing,
    unexpected or mis-shaped key when the state does not fit ``what``. ``check_only``:
    the keys and shapes compared with the tensors mapped, not read, and ``module`` (e.g.
    on the meta device) returned as it is."""
    saved = load_torch(path, mmap=check_only)
    state = saved.get(container, saved) if container and isinstance(saved, dict) else saved
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor)
                                              for v in state.values()):
        holder = f" or a dict holding one under {container!r}" if container else ""
        raise ArtifactError(f"{path} is not a state dict of {what} (expected a dict of "
                            f"tensors{holder}); {REMEDY}")
    expected = module.state_dict()
    missing = [k for k in expected if k not in state]
    if missing:
        raise ArtifactError(f"{path} does not fit {what}: missing key {missing[0]!r} "
                            f"({len(missing)} missing); {REMEDY}")
    unexpected = [k for k in state if k not in expected]
    if unexpected:
        raise ArtifactError(f"{path} does not fit {what}: unexpected key {unexpected[0]!r} "
                            f"({len(unexpected)} unexpected); {REMEDY}")
    for key, value in expected.items():
        if state[key].shape != value.shape:
            raise ArtifactError(f"{path} does not fit {what}: key {key!r} has shape "
                                f"{tuple(state[key].shape)}, expected {tuple(value.shape)}; "
                                f"{REMEDY}")
    if check_only:
        return module
    module.load_state_dict(state)
    return module.eval()
