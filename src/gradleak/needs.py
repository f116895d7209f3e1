"""The artifacts a defense or attack takes as constructor arguments (a leaf, torch-free):
:data:`ARTIFACTS` (each kind, what it is, the phase that declares its files and loader) and
:class:`Need` (one such argument, and when it applies)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# artifact kind -> what it is, and the pipeline phase (experiment/phases/<phase>.py) that
# declares its files and loader
ARTIFACTS = {
    "evalnet": ("the trained evaluation network (Refiner §3.3; gradleak train-evalnet)",
                "train_evalnet"),
    "gan": ("a trained generator prior (gradleak train-gan, or gan.weights)", "attack"),
    "untrained_gan": ("the prior's architecture (gan:) with seeded initial weights, untrained",
                      "attack"),
    "giml_generator": ("the generator meta-learned from client gradients (GIML; gradleak "
                       "train-giml)", "train_giml"),
    "public_data": ("public labelled images (x, y), the prepared dataset's public split",
                    "prepare_data"),
    "bn_proxy": ("BatchNorm statistics of public images (GradInversion BN_proxy)", "attack"),
    "defense": ("the defense whose uploads are attacked (a Defense or a registered name)",
                "attack"),
    "model_zoo": ("defender models that infer sensitive attributes from gradients (RecUP-FL "
                  "§4)", "train_zoo"),
    "inverter": ("an inversion network from a setting's uploads to images (Learning to "
                 "Invert; gradleak train-inverter)", "train_inverter"),
}


@dataclass(frozen=True)
class Need:
    """A constructor argument that the experiment layer supplies: an artifact of ``kind``
    (one of ``ARTIFACTS``: ``evalnet``, ``gan``, ``untrained_gan``, ``giml_generator``,
    ``public_data``, ``bn_proxy``, ``model_zoo``, ``inverter``, ``defense``), needed only
    when every parameter named in ``when`` takes one of the values listed there."""

    kind: str
    when: Mapping[str, tuple] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in ARTIFACTS:
            raise ValueError(f"unknown artifact kind {self.kind!r}; expected one of "
                             f"{sorted(ARTIFACTS)}")

    def applies(self, params: Mapping[str, Any]) -> bool:
        return all(params.get(key) in values for key, values in self.when.items())


def artifact(kind: str, of: Any = None) -> str:
    """A needed artifact as ``needs_for`` names it: ``kind``, or ``"kind:of"`` for the one of
    ``of`` (the prior trained on dataset ``natural``: ``"gan:natural"``; GIML's generator
    kept at outer step 4: ``"giml_generator:4"``); None: the configuration's own."""
    if kind not in ARTIFACTS:
        raise ValueError(f"unknown artifact kind {kind!r}; expected one of {sorted(ARTIFACTS)}")
    return kind if of is None else f"{kind}:{of}"


def artifact_parts(needed: str) -> tuple[str, str | None]:
    """``"gan:natural"`` -> ``("gan", "natural")``; ``"gan"`` -> ``("gan", None)``."""
    kind, _, of = needed.partition(":")
    return kind, of or None
