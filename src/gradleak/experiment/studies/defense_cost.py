"""What a defense costs a client: seconds per client update with the defense applied.

- Refiner (Fan et al.) Table 5, §6.2: "the runtime required for a single iteration of
  models when employing different defenses", LeNet and ResNet-10/18/34 on CIFAR-10-sized
  inputs, on an NVIDIA A10 (clients' batches of 128, App. D).
- RecUP-FL (Cui et al.) Table 1, §6.6: "average consumed time to apply the defenses per
  communication round (i.e., ClientUpdate() in Algorithm 1 line 10 to 25)", LFW's CNN
  (Table 2c, 3x62x47, one-sample uploads), on an NVIDIA A100.

Both time the whole client update (the local gradient, then the defense), so a row is the
upload as FL clients make theirs (``fl.client_update``: ``fl.local_steps`` steps at
``fl.local_lr``, then the defense) of one random batch of ``batch_size`` inputs of
``input_shape`` (the papers' data only set the shape; the cost does not depend on the
pixels) on each of ``models`` (initialised from ``seed``), on the configuration's
``device`` with ``threads`` CPU threads. Each defense label of ``defenses`` runs with its
configured parameters at its first configured strength; the undefended update (``none``)
is timed beside them. Every repeat runs each defense once, the order rotated by one per
repeat (``utils.timing.rotated``), after ``warmup`` discarded repeats; ``seconds`` is the
median wall time of ``repeats`` runs and ``ratio_to_none`` that median over the undefended
update's median on the same model.

A defense that needs a trained artifact gets an untrained one of the right shape: the cost
of a forward and backward pass does not depend on the weights. Refiner's evaluation
network is ``evalnet.widths`` wide for the input's channels and size (square inputs only,
as the network is); RecUP-FL's model zoo holds ``attribute.zoo_size`` untrained defender
models (widths drawn from 128 .. 2048 as ``adversaries.train_zoo`` draws them) per
protected attribute over ``attribute.feature_size`` gradient features, each attribute
with its class count from ``attribute_classes`` (2 where not named), and the batch's
attribute values are random. A defense that needs anything else (data, a generator) is
refused before any timing.

Timings are measured, not computed: the rows, their order and columns are deterministic,
the seconds are not (other processes, clocks, caches, the machine). What compares with
the papers' printed seconds, taken on their GPUs, is the order: which defense costs more
than which on a model (``gradleak compare``'s agreement).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from gradleak import adversaries, defenses, models
from gradleak.experiment import plan
from gradleak.experiment.studies.registry import StudyResult, register
from gradleak.fl import client_update
from gradleak.needs import artifact_parts
from gradleak.settings import Setting
from gradleak.utils.device import select, to_device
from gradleak.utils.seeding import seed_everything
from gradleak.utils.timing import rotated

BASELINE = "none"  # the undefended upload every defense's time is a ratio to


def build_model(name: str, input_shape: tuple[int, int, int], classes: int, layout: str,
                seed: int) -> nn.Module:
    """Model ``name`` for inputs of ``input_shape`` (C, H, W), initialised from ``seed``."""
    options = {"layout": layout} if name == "attribute_cnn" else {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return models.build(name, input_shape[0], classes, input_shape[1],
                            input_shape=input_shape, **options)


def untrained_evalnet(input_shape: tuple[int, int, int], widths: list[int], label: str
                      ) -> nn.Module:
    """Refiner's evaluation network for ``input_shape``, untrained."""
    channels, height, width = input_shape
    if height != width:
        raise ValueError(f"defense_cost study: defense {label!r} needs the evaluation network, "
                         f"which takes square images; input_shape {list(input_shape)} is not "
                         f"square")
    return models.EvaluationNetwork(channels, height, tuple(widths)).eval()


def untrained_zoo(attributes: list[str], classes: dict[str, int], feature_size: int,
                  size: int, seed: int) -> adversaries.ModelZoo:
    """RecUP-FL's model zoo for ``attributes``, its defender models untrained (standardised
    on random features, as the zoo's training would first do on real ones)."""
    features = torch.randn(8, feature_size, generator=torch.Generator().manual_seed(seed))
    return adversaries.train_zoo(features, {a: torch.zeros(8, dtype=torch.int64)
                                            for a in attributes},
                                 {a: classes.get(a, 2) for a in attributes}, size=size,
                                 epochs=0, seed=seed)


def labels(params: dict) -> list[str]:
    """The defense labels timed, ``none`` (the undefended update) first."""
    return [BASELINE, *dict.fromkeys(d for d in params["defenses"] if d != BASELINE)]


def build_defense(config: dict, params: dict, label: str, device: torch.device
                  ) -> tuple[defenses.Defense, float, list[str]]:
    """The defense of ``label`` at its first configured strength, with stand-ins for what
    it needs on ``device``; the strength and the attributes whose values its batches must
    carry."""
    if label == BASELINE:
        return defenses.build(BASELINE), 0.0, []
    strength = config["defenses"][label]["strengths"][0]
    name, kwargs = plan.defense_of(config, Setting(label, strength))
    shape = tuple(params["input_shape"])
    loaded, attributes = {}, []
    for arg, needed in defenses.needs(name, kwargs).items():
        kind, _ = artifact_parts(needed)
        if kind == "evalnet":
            loaded[arg] = untrained_evalnet(shape, config["evalnet"]["widths"], label)
        elif kind == "model_zoo":
            attributes = list(kwargs.get("attributes") or params["attribute_classes"])
            if not attributes:
                raise ValueError(f"defense_cost study: defense {label!r} protects every "
                                 f"attribute of its model zoo (attributes: null), so the "
                                 f"stand-in zoo needs them named; expected "
                                 f"'attribute_classes' {{attribute: classes}} or the label's "
                                 f"params.attributes")
            loaded[arg] = untrained_zoo(attributes, params["attribute_classes"],
                                        config["attribute"]["feature_size"],
                                        config["attribute"]["zoo_size"], params["seed"])
        else:
            raise ValueError(f"defense_cost study: defense {label!r} needs {needed!r}, for "
                             f"which the study has no stand-in; expected defenses that need "
                             f"nothing, the evaluation network or the model zoo")
    return (defenses.build(name, **kwargs, **to_device(loaded, device)), float(strength),
            attributes)


@register("defense_cost", datasets=lambda params: [], device="times")
def defense_cost(config: dict, results: Path, params: dict) -> StudyResult:
    device = select(config["device"])
    seed_everything(params["seed"], config["threads"])
    shape, batch, fl = tuple(params["input_shape"]), params["batch_size"], config["fl"]
    timed = labels(params)
    # everything is built (and every refusal raised) before the first timing
    nets = {name: build_model(name, shape, params["classes"], params["layout"],
                              params["seed"]).to(device) for name in params["models"]}
    built = {label: build_defense(config, params, label, device) for label in timed}
    generator = torch.Generator().manual_seed(params["seed"])
    x = torch.rand(batch, *shape, generator=generator).to(device)
    y = torch.randint(0, params["classes"], (batch,), generator=generator).to(device)
    protected = {a for _, _, attributes in built.values() for a in attributes}
    values = {a: torch.randint(0, params["attribute_classes"].get(a, 2), (batch,),
                               generator=generator) for a in sorted(protected)}
    data = (x, y, values) if values else (x, y)
    runs = len(nets) * len(timed) * (params["warmup"] + params["repeats"])
    rows = []
    with tqdm(total=runs, desc="defense cost", unit="update") as bar:
        for name, model in nets.items():
            def update(label: str, model: nn.Module = model):
                defense = built[label][0]
                return lambda r: client_update(
                    model, lambda _step: data, fl["local_steps"], fl["local_lr"], defense,
                    torch.Generator().manual_seed(params["seed"] + r), client=0)

            def done(label: str, name: str = name) -> None:
                bar.set_postfix_str(f"{name} {label}", refresh=False)
                bar.update()

            times = rotated({label: update(label) for label in timed}, params["repeats"],
                            params["warmup"], device, done)
            seconds = {label: statistics.median(wall for wall, _ in times[label])
                       for label in timed}
            rows += [{"model": name, "defense": label, "strength": built[label][1],
                      "seconds": seconds[label],
                      "ratio_to_none": seconds[label] / seconds[BASELINE]}
                     for label in timed]
    return StudyResult(rows)
