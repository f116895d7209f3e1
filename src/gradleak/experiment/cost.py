"""The work of a job, counted from the configuration's budgets in units whose cost depends
only on the model, the input shape and the batch size; each phase's ``work`` counts its
jobs' units here, ``gradleak estimate`` prices them with rates measured on the machine
(``experiment.estimate``; a phase's own kinds with the timers it declares in ``units``)
and the cluster's wall times with assumed ones (``experiment.cluster``). The units:

- ``fl_step:<model>:<CxHxW>:<classes>:<option>:b<batch>``: one client's local SGD step
  (forward, backward, step) of the case's model at that batch;
- ``match:...``: one gradient-matching iteration of an optimisation attack (the model's
  gradient of a dummy batch with ``create_graph``, its L2 distance to a target gradient,
  the backward pass to the dummy input); the generator's forward pass of the GAN-based
  attacks is not in it;
- ``lbfgs:...``: one iteration of an L-BFGS attack (DLG, iDLG, EPAFL's stopped iDLG) as the
  engine runs it (up to 20 evaluations in its line search, the iterate checked and copied);
- ``gan_step:...``, ``evalnet_step:...``, ``mlp_step:...``: one training step of the DCGAN
  prior, Refiner's evaluation network, a RecUP-FL defender MLP;
- ``giml_iteration:<model>...:<latent_dim>:<width>:b<batch>``: one iteration of GIML's
  inner searches, through the generator being meta-learned;
- ``inverter_step:<hidden>:<features>:<model>...``: one training step of Learning to
  Invert's inversion network, reading ``features`` of the model's upload (0: all of it);
- ``defend:<spec>:<model>:...:b<batch>``: one client's upload through its setting's
  defense beyond the batch's gradient, which ``fl_step`` counts, for a defense whose work
  grows with the batch (per-sample passes: Soteria, Refiner, CENSOR); ``defend_gradient``
  the same for one whose work reads the gradient alone (noise, pruning, quantisation:
  the defense's ``work`` in the schema) (``spec``: the defense,
  its parameters and the artifacts it loads, as URL-safe
  base64 of their JSON, so that the unit names itself); timed with stand-ins for the
  artifacts (an untrained evaluation network of the configured widths, random public
  images), whose weights do not change the cost; a defense that loads the model zoo
  (RecUP-FL) is not priced;
- ``figure``: drawing and saving one figure;
- ``startup``, ``startup:gradients``, ``startup:figures``: starting a job's process (with
  torch.func's first call; with matplotlib and seaborn), once per job.

A job's data loading, metrics and file writing are not in the model. The attack phase
counts its attacks' iterations itself (``phases.attack.attack_work``): that needs the
attack classes, which no other phase's code imports.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from gradleak import config as cfg
from gradleak import data
from gradleak.experiment import paths, plan

UNPRICED_ARTIFACTS = frozenset({"model_zoo"})  # no stand-in: the defense's upload is not priced


def uploads(config: dict, clients: int) -> int:
    """Defended uploads of one FL run: rounds x clients per round."""
    fl = config["fl"]
    return fl["rounds"] * max(1, round(fl["participation"] * clients))


def defense_unit(config: dict, results: Path, case: str, defense: str, params: dict,
                 needs: dict[str, str], batch: int) -> str | None:
    """The ``defend`` unit of one upload of ``case`` through ``defense`` with ``params``
    (``needs``: argument -> artifact kind it loads); None for a defense that loads an
    artifact with no stand-in."""
    if UNPRICED_ARTIFACTS & set(needs.values()):
        return None
    spec = {"defense": defense, "params": params, "needs": needs,
            "evalnet_widths": config["evalnet"]["widths"]}
    encoded = base64.urlsafe_b64encode(json.dumps(spec, sort_keys=True).encode()).decode()
    kind = "defend" if cfg.work(defense) == "batch" else "defend_gradient"
    return model_unit(config, results, case, f"{kind}:{encoded}", batch)


def defense_spec(encoded: str) -> dict:
    """A ``defend`` unit's spec from its encoded part."""
    return json.loads(base64.urlsafe_b64decode(encoded))


def fl_steps(config: dict, clients: int, train: int | None) -> int:
    """Local steps of one FL run: rounds x clients per round x local steps, or with
    ``fl.local_epochs`` x epochs x mini-batches of a shard of ``train`` / clients images
    (unknown ``train``: one mini-batch)."""
    fl = config["fl"]
    if not fl["local_epochs"]:
        return uploads(config, clients) * fl["local_steps"]
    shard = max(1, (train or 0) // clients)
    return uploads(config, clients) * fl["local_epochs"] * -(-shard // fl["client_batch_size"])


def shape(config: dict, results: Path, dataset: str) -> tuple[tuple[int, int, int], int]:
    """(C, H, W) and classes of a dataset: from its prepared manifest, else its options."""
    manifest = paths.data_manifest(results, dataset)
    if manifest.is_file():
        found = json.loads(manifest.read_text())
        return tuple(found["shape"]), found["num_classes"]
    return data.datasets.shape(dataset, config["datasets"].get(dataset, {}))


def split_size(config: dict, results: Path, dataset: str, split: str) -> int:
    """Images in a split: from the prepared manifest, else the configuration's bound."""
    manifest = paths.data_manifest(results, dataset)
    if manifest.is_file():
        return json.loads(manifest.read_text())["splits"][split]["count"]
    return data.datasets.split_capacity(dataset, config["datasets"].get(dataset, {}), split) \
        or data.datasets.STAND_IN_SIZE


def model_of(parts: list[str], device):
    """The model a unit names (its ``<model>:<CxHxW>:<classes>:<option>`` parts, as
    :func:`model_unit` writes them) on ``device``, its input shape and class count."""
    from gradleak import models

    name, shape, classes, option = parts
    c, h, w = (int(v) for v in shape.split("x"))
    options = {}
    if name == "lenet" and option:
        options["uniform_init"] = option == "True"
    if name == "attribute_cnn" and option:
        options["layout"] = option
    model = models.build(name, c, int(classes), h, input_shape=(c, h, w), **options)
    return model.to(device), (c, h, w), int(classes)


def model_unit(config: dict, results: Path, case: str, kind: str, batch: int) -> str:
    """The unit ``kind`` (``fl_step``, ``match``, ``lbfgs``) of the case's model."""
    spec = plan.find_case(config, case)
    (c, h, w), classes = shape(config, results, spec["dataset"])
    option = {"lenet": spec.get("uniform_init"), "attribute_cnn": spec.get("layout")}.get(
        spec["model"])  # the constructor option that changes the network
    return f"{kind}:{spec['model']}:{c}x{h}x{w}:{classes}:{'' if option is None else option}" \
           f":b{batch}"
