"""Which FL runs the plan trains, and whose saved model each attack job loads.

Every setting of a seed starts from the same weights (``fl_run`` builds the model before
its defense), so an attack at round 0 loads the initial model of its undefended reference
run (``Setting.reference``, which the plan trains anyway: PMM's reference), unless its
setting changes more than the FL protocol and the defense. A setting's own FL run is
trained only where something reads it: its target's FL metrics (accuracy, PMM, ...), its
attacks after round 0, or attribute inference (RecUP-FL). A defense that costs seconds an
upload (Soteria, Refiner) then costs nothing in FL where only its attack is read.
"""

from __future__ import annotations

from collections.abc import Iterator

from gradleak.config import ConfigError
from gradleak.experiment import plan
from gradleak.settings import Setting
from gradleak.utils.metric_kinds import FL_METRICS, reads_fl


def model_setting(config: dict, setting: Setting) -> Setting:
    """The FL setting whose saved model an attack job of ``setting`` loads."""
    own = plan.fl_setting(setting)
    if plan.saved_round(plan.resolve(config, setting)["attack"]) == 0 and all(
            key.startswith(("fl.", "defenses.")) for key in own.config_overrides):
        return setting.reference
    return own


def _texts(value) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)


def target_reads_fl(config: dict, name: str | None) -> bool:
    """Whether target ``name`` reads its points' FL runs: its table or figure names an FL
    metric, or a claim or regime entry on it reads one (``metric_kinds.reads_fl``); without
    targets (``name`` None), every point's run is read (PMM beside each attack)."""
    if name is None:
        return True
    spec = config["targets"][name]
    named = {text.partition(":")[0] for text in _texts([spec.get("table"), spec.get("figure")])}
    return bool(named & set(FL_METRICS)) or any(map(reads_fl, plan.claims_on(config, name)))


def _reads_own_run(config: dict, point: plan.Point, reads: dict) -> bool:
    return (not point.attacks or reads[point.target]
            or model_setting(config, point.setting) == plan.fl_setting(point.setting))


def fl_settings(config: dict) -> list[tuple[str, Setting]]:
    """Every (case, FL setting) the plan trains for its own points: each point's undefended
    reference run, its own run where something reads it, and with attribute jobs each
    attribute case's undefended run (the model zoo learns from its gradients) and the runs
    whose uploads the adversaries attack. The FL runs an artifact learns from (GIML's
    generator: the case's undefended run) are planned by the phases that read them
    (``pipeline.walk``)."""
    planned = {(case, s.reference) for case, s in plan.jobs(config)}
    points = plan.points(config)
    reads = {name: target_reads_fl(config, name) for name in {p.target for p in points}}
    planned |= {(p.case, plan.fl_setting(p.setting)) for p in points
                if _reads_own_run(config, p, reads)}
    if attributed := plan.attribute_jobs(config):
        planned |= set(attributed) | {(case, plan.NONE) for case in plan.attribute_cases(config)}
    return sorted(planned, key=lambda cs: (cs[0], cs[1].text))


def check_checkpoint_rounds(config: dict) -> None:
    """ConfigError unless every planned FL run reaches the last round some attack or
    attribute job loads (each run saves the model at every such round)."""
    last = max(plan.checkpoint_rounds(config))
    for case, setting in fl_settings(config):
        rounds = plan.resolve(config, setting)["fl"]["rounds"]
        if rounds < last:
            raise ConfigError(
                f"invalid config: the FL run of {setting.text!r} ({case}) has 'fl.rounds' "
                f"{rounds}, but every FL run saves the model at round {last}, which an attack "
                f"or attribute job loads (plan.checkpoint_rounds); expected 'fl.rounds' of at "
                f"least {last} for every planned FL run")
