"""Generator priors for GAN-based attacks (GGA/GGL, GIAS, GIML, GIFD).

A generator emits images in [-1, 1]; attacks see them as (x + 1) / 2 in [0, 1], resized
and converted to the model's input shape (``to_model_input``). The searching attacks
(``gga``, ``gias``, ``gifd``, and ``eot`` wrapping them) reach any of the configuration's
generator kinds (``gan.kind``) through one interface, :class:`GeneratorPrior`:

- ``draw(obs, rng)``: a restart's start, the latent variable (B, *latent_shape) followed
  by the constants it is decoded with (``conditions``: BigGAN's class vectors);
- ``decode(latent, *constants)``: images in [-1, 1] (also ``forward``);
- ``searched()``: the parameters GIAS's parameter search (Eq. 7) copies per image;
- ``stages``, ``advance(k, variables)`` and ``decoder(k)``: GIFD's search spaces, stage 0
  the latent, stage k >= 1 the intermediate feature entering the generator's k-th block
  (``advance`` maps stage k - 1's variables to stage k's start, ``decoder(k)`` renders
  stage k's variables).

The kinds (docs/decisions/0070-pretrained-prior-kinds.md says what each search means on
each):

- :class:`DCGANPrior` (Radford et al. 2016, trained by ``rule train_gan``): latent z ~ N(0,
  I); parameter search over all its weights; GIFD's blocks the ConvTranspose2d blocks of
  ``generator.net``.
- :class:`StyleGAN2Prior` (Karras et al. 2020): ``space`` ``w_plus`` (default) searches the
  intermediate latent space W+ (one w per style input, (n_latent, latent)), started at
  w = mapping(z), z ~ N(0, I), broadcast to every input: GIAS App. H ("the latent space
  search over z implies the search over the intermediate latent space W", k = 512 x 16)
  and GIFD; ``z`` searches z through the mapping network. The parameter search copies the
  synthesis network (the mapping network is not searched); GIFD's feature of block k is
  the synthesis state (features and the ToRGB skip, concatenated over channels) that
  block k takes, the styles fixed at the latent stage's.
- :class:`BigGANPrior` (Brock et al. 2019, BigGAN-deep): class-conditional on the label the
  attack infers (GGL, Li et al. 2022: BigGAN conditioned on the inferred label), mapped to
  the generator's class by ``classes`` (``gan.biggan.classes``: entry l is the class of
  dataset label l; None: the label itself); z ~ truncation x N(0, I) truncated to [-2, 2]
  (the port's ``truncated_noise_sample``) when ``truncation`` < 1, else N(0, I); the
  parameter search copies every weight; GIFD's features are the stem's output and each
  layer's (residual blocks, the attention block), then the head's input.
"""

from __future__ import annotations

import abc
import copy
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from gradleak.types import Observation


def to_model_input(generated: torch.Tensor, input_shape: tuple[int, int, int]) -> torch.Tensor:
    """Map generator output in [-1, 1] to [0, 1] images of ``input_shape`` (C, H, W)."""
    channels, height, width = input_shape
    images = (generated + 1) / 2
    if images.shape[1] != channels:
        if images.shape[1] == 1:
            images = images.expand(-1, channels, -1, -1)
        elif channels == 1:
            images = images.mean(dim=1, keepdim=True)
        else:
            raise ValueError(f"cannot map {images.shape[1]}-channel generator output to "
                             f"{channels} channels")
    if images.shape[-2:] != (height, width):
        images = F.interpolate(images, size=(height, width), mode="bilinear",
                               align_corners=False)
    return images


def rendered(decode: Callable[..., torch.Tensor], input_shape: tuple[int, int, int]
             ) -> Callable[[list[torch.Tensor]], torch.Tensor]:
    """A generator stage's render: its variables (each (P, B, ...): the searched one, then
    the constants it is decoded with) decoded as one batch and mapped to model-input images
    (P, B, C, H, W)."""
    def render(variables: list[torch.Tensor]) -> torch.Tensor:
        v = variables[0]
        images = decode(*(x.flatten(0, 1) for x in variables))
        return to_model_input(images, input_shape).unflatten(0, v.shape[:2])

    return render


def frozen_copy(generator: nn.Module, device: torch.device | None = None) -> nn.Module:
    """An eval-mode copy of ``generator`` (on ``device``) without parameter gradients; the
    caller's generator is untouched."""
    if not isinstance(generator, nn.Module):
        raise ValueError(f"generator must be a torch.nn.Module, got {type(generator).__name__}")
    out = copy.deepcopy(generator).eval().requires_grad_(False)
    return out if device is None else out.to(device)


def latent_dim(generator: nn.Module) -> int:
    """The generator's integer ``latent_dim`` attribute (ValueError naming its type if absent)."""
    if not isinstance(getattr(generator, "latent_dim", None), int):
        raise ValueError(f"the generator needs an integer latent_dim attribute; "
                         f"{type(generator).__name__} has none")
    return generator.latent_dim


Variables = list[torch.Tensor]


class GeneratorPrior(nn.Module, abc.ABC):
    """The interface the searching attacks use (module docstring); ``net`` the generator.
    Subclasses set ``kind`` and implement the latent, decode and GIFD methods."""

    kind = "generator"
    n_conditions = 0  # the constants after the latent (``conditions``)

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net
        self.train(net.training)  # the generator's mode (a loaded one: eval)

    @property
    @abc.abstractmethod
    def latent_shape(self) -> tuple[int, ...]:
        """One image's latent variable shape."""

    @property
    def latent_dim(self) -> int:
        """The number of latent entries per image."""
        return math.prod(self.latent_shape)

    def conditions(self, obs: Observation) -> Variables:
        """The constants (B, ...) the latent stage decodes ``obs``'s images with."""
        return []

    def start(self, obs: Observation, rng: torch.Generator) -> torch.Tensor:
        """A restart's latent (B, *latent_shape), z ~ N(0, I) drawn from ``rng``."""
        return obs.randn((obs.batch_size, *self.latent_shape), rng)

    def draw(self, obs: Observation, rng: torch.Generator) -> Variables:
        """A restart's start: the latent, then the conditions."""
        return [self.start(obs, rng), *self.conditions(obs)]

    @abc.abstractmethod
    def decode(self, latent: torch.Tensor, *constants: torch.Tensor) -> torch.Tensor:
        """Images in [-1, 1] of a latent (N, *latent_shape) and its constants."""

    def forward(self, latent: torch.Tensor, *constants: torch.Tensor) -> torch.Tensor:
        return self.decode(latent, *constants)

    def searched(self) -> list[str]:
        """The parameters (names in this module) of GIAS's parameter search, in order."""
        return [name for name, _ in self.named_parameters()]

    @property
    @abc.abstractmethod
    def stages(self) -> int:
        """GIFD's search spaces: the latent and the intermediate features."""

    @abc.abstractmethod
    def advance(self, k: int, variables: Variables) -> Variables:
        """Stage ``k``'s start (each (N, ...)) from stage k - 1's final ``variables``."""

    @abc.abstractmethod
    def decoder(self, k: int) -> Callable[..., torch.Tensor]:
        """Stage ``k``'s variables -> images in [-1, 1] (stage 0: ``decode``)."""


def conv_blocks(generator: nn.Module) -> list[nn.Sequential]:
    """``generator.net`` split before each ConvTranspose2d: the blocks B_1, ..., B_K."""
    net = getattr(generator, "net", None)
    if not isinstance(net, nn.Sequential):
        raise ValueError(f"GIFD needs generator.net, an nn.Sequential of ConvTranspose2d blocks; "
                         f"{type(generator).__name__} has none")
    starts = [i for i, m in enumerate(net) if isinstance(m, nn.ConvTranspose2d)]
    if not starts or starts[0] != 0:
        raise ValueError("generator.net must start with a ConvTranspose2d layer")
    return [net[a:b] for a, b in zip(starts, starts[1:] + [len(net)])]


class DCGANPrior(GeneratorPrior):
    """A generator mapping z (B, latent_dim) to [-1, 1] images (the pipeline's DCGAN, GIML's
    meta-learned one); GIFD's blocks are ``net.net``'s ConvTranspose2d blocks."""

    kind = "dcgan"

    def __init__(self, net: nn.Module) -> None:
        super().__init__(net)
        self._latent = latent_dim(net)

    @property
    def latent_shape(self) -> tuple[int, ...]:
        return (self._latent,)

    def decode(self, latent: torch.Tensor, *constants: torch.Tensor) -> torch.Tensor:
        return self.net(latent)

    @property
    def stages(self) -> int:
        return len(conv_blocks(self.net))

    def advance(self, k: int, variables: Variables) -> Variables:
        blocks = conv_blocks(self.net)
        if k == 1:
            return [blocks[0](variables[0].view(-1, self._latent, 1, 1))]
        return [blocks[k - 1](variables[0])]

    def decoder(self, k: int) -> Callable[..., torch.Tensor]:
        return self if k == 0 else nn.Sequential(*conv_blocks(self.net)[k:])


class StyleGAN2Prior(GeneratorPrior):
    """StyleGAN2 (``gradleak.models.stylegan2``) searched in ``space`` ``w_plus`` or ``z``."""

    kind = "stylegan2"
    SPACES = ("w_plus", "z")

    def __init__(self, net: nn.Module, space: str = "w_plus") -> None:
        super().__init__(net)
        if space not in self.SPACES:
            raise ValueError(f"StyleGAN2 space must be one of {self.SPACES}, got {space!r}")
        self.space = space

    @property
    def latent_shape(self) -> tuple[int, ...]:
        if self.space == "z":
            return (self.net.latent_dim,)
        return (self.net.n_latent, self.net.latent_dim)

    def start(self, obs: Observation, rng: torch.Generator) -> torch.Tensor:
        z = obs.randn((obs.batch_size, self.net.latent_dim), rng)
        if self.space == "z":
            return z
        with torch.no_grad():
            w = self.net.mapping(z.to(next(self.net.parameters()).device)).to(z.device)
        return w.unsqueeze(1).expand(-1, self.net.n_latent, -1).contiguous()

    def styles(self, latent: torch.Tensor) -> torch.Tensor:
        """The synthesis styles (B, n_latent, latent) of a latent of the searched space."""
        if self.space == "w_plus":
            return latent
        return self.net.mapping(latent).unsqueeze(1).expand(-1, self.net.n_latent, -1)

    def decode(self, latent: torch.Tensor, *constants: torch.Tensor) -> torch.Tensor:
        return self.net.synthesis(self.styles(latent))

    def searched(self) -> list[str]:
        """The synthesis network's parameters (not the mapping network's)."""
        return [name for name, _ in self.named_parameters() if not name.startswith("net.style.")]

    @property
    def stages(self) -> int:
        return self.net.blocks

    def _unpack(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return state[:, :-3], state[:, -3:]

    def advance(self, k: int, variables: Variables) -> Variables:
        if k == 1:
            ws = self.styles(variables[0]).contiguous()
            return [torch.cat(self.net.block(0, ws), dim=1), ws]
        state, ws = variables
        return [torch.cat(self.net.block(k - 1, ws, self._unpack(state)), dim=1), ws]

    def decoder(self, k: int) -> Callable[..., torch.Tensor]:
        if k == 0:
            return self.decode
        return lambda state, ws: self.net.synthesis(ws, start=k, state=self._unpack(state))


class BigGANPrior(GeneratorPrior):
    """BigGAN-deep (``gradleak.models.biggan``) conditioned on the inferred labels, mapped to
    its classes by ``classes`` (entry l: the class of label l; None: the label itself)."""

    kind = "biggan"
    n_conditions = 1

    def __init__(self, net: nn.Module, classes: list[int] | None = None) -> None:
        super().__init__(net)
        self.classes = None if classes is None else [int(c) for c in classes]
        bad = [c for c in self.classes or [] if not 0 <= c < net.num_classes]
        if bad:
            raise ValueError(f"BigGAN classes must be in 0..{net.num_classes - 1} (the "
                             f"generator's classes), got {bad[0]!r}")

    @property
    def latent_shape(self) -> tuple[int, ...]:
        return (self.net.latent_dim,)

    def class_of(self, labels: torch.Tensor) -> torch.Tensor:
        """The generator's class of each dataset label (ValueError naming a label without)."""
        labels = labels.long()
        size = self.net.num_classes if self.classes is None else len(self.classes)
        outside = [int(v) for v in labels if not 0 <= int(v) < size]
        if outside:
            where = (f"the {size} entries of gan.biggan.classes" if self.classes is not None
                     else f"the generator's {size} classes (gan.biggan.classes null: the label "
                          f"is the class)")
            raise ValueError(f"label {outside[0]} has no BigGAN class: expected a label within "
                             f"{where}")
        if self.classes is None:
            return labels
        return torch.tensor(self.classes, device=labels.device)[labels]

    def conditions(self, obs: Observation) -> Variables:
        from gradleak.attacks.label_inference import infer_labels

        classes = self.class_of(infer_labels(obs))
        return [F.one_hot(classes, self.net.num_classes).to(torch.get_default_dtype())
                .to(obs.device)]

    def start(self, obs: Observation, rng: torch.Generator) -> torch.Tensor:
        z = torch.randn((obs.batch_size, self.net.latent_dim), generator=rng)
        if self.net.truncation < 1:
            while (outside := z.abs() > 2).any():
                z[outside] = torch.randn(int(outside.sum()), generator=rng)
            z = z * self.net.truncation
        return z.to(obs.device)

    def decode(self, latent: torch.Tensor, *constants: torch.Tensor) -> torch.Tensor:
        return self.net.decode(latent, constants[0].to(latent.dtype))

    @property
    def stages(self) -> int:
        return self.net.blocks + 2

    def advance(self, k: int, variables: Variables) -> Variables:
        if k == 1:
            cond = self.net.condition(variables[0], variables[1].to(variables[0].dtype))
            return [self.net.stem(cond), cond]
        h, cond = variables
        return [self.net.block(k - 2, h, cond), cond]

    def decoder(self, k: int) -> Callable[..., torch.Tensor]:
        if k == 0:
            return self.decode

        def decode(h: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
            for j in range(k - 1, self.net.blocks):
                h = self.net.block(j, h, cond)
            return self.net.head(h)

        return decode


def as_prior(generator: nn.Module) -> GeneratorPrior:
    """``generator`` as a :class:`GeneratorPrior`: itself when it is one, else a
    :class:`DCGANPrior` (a module with an integer ``latent_dim`` mapping z to [-1, 1])."""
    if isinstance(generator, GeneratorPrior):
        return generator
    if not isinstance(generator, nn.Module):
        raise ValueError(f"generator must be a torch.nn.Module, got {type(generator).__name__}")
    return DCGANPrior(generator)
