"""What a table's metric measures, by its name: one value per FL run (accuracy, PMM),
per attribute-inference row (RecUP-FL), or per attacked victim; and its statistic. Claims
are judged by kind (``report.claims``, ``report.verdicts``), planned by it
(``experiment.claims``), and the tables count FL metrics once per run."""

from __future__ import annotations

from collections.abc import Mapping

FL_METRICS = ("accuracy", "pmm", "test_loss", "fallback_rate")  # one value per FL run
ATTRIBUTE_METRICS = ("attribute_asr", "learning_loss", "chance")
KINDS = ("attack", "utility", "attribute", "study")


def kind_of(metric: str, study: bool = False) -> str:
    """attack, utility, attribute or study: what a claim on ``metric`` measures (``study``:
    its target is a study, whose rows are fixed settings)."""
    column = metric.partition(":")[0]
    if study:
        return "study"
    if column in ATTRIBUTE_METRICS:
        return "attribute"
    return "utility" if column in FL_METRICS else "attack"


def reads_fl(claim: Mapping, study: bool = False) -> bool:
    """Whether a claim (or regime entry) reads FL runs: its metric is one of an FL run's, or
    it picks its rows by one (``over``: Refiner's matched utility) or matches them on the
    FL run's learning loss (``matched``: RecUP-FL's)."""
    return kind_of(claim["metric"], study) == "utility" or bool(
        set(claim.get("over", {})) & set(FL_METRICS)) or "matched" in claim


def seeds_a_side(claim: Mapping, study: bool = False) -> bool:
    """Whether a claim needs FL seeds a side (``regime.seeds``): one reading FL runs but for
    an attribute claim, whose fixed settings a sign test compares (its learning losses
    matched, ``matched``, still need FL that learns)."""
    return reads_fl(claim, study) and kind_of(claim["metric"], study) != "attribute"


def statistic(metric: str) -> str:
    """mean, sum or asr (a claim's statistic over its units)."""
    return "asr" if metric == "asr" else metric.partition(":")[2] or "mean"


# What a guess without the upload scores on an entry's rows, and how far above it the
# undefended attack must be to be in regime: a uniform image in the data's mean colour on
# mean PSNR (decision 0111); the majority share of the adversary's test uploads on
# attribute ASR, by the entry's own ``above_chance``.
BARS = {"psnr": "psnr_flat", "attribute_asr": "chance"}
FLAT_MARGIN = 1.0  # dB above the uniform image (decision 0111)


def bar_margin(entry: Mapping) -> float | None:
    """How far above its bar a regime entry's measure must be; None: it has no bar."""
    if entry["metric"] == "psnr":
        return FLAT_MARGIN
    return entry.get("above_chance") if entry["metric"] == "attribute_asr" else None


def bar_twin(entry: Mapping) -> dict | None:
    """A regime entry measured instead on its bar, the same rows (id ``<entry>~bar``);
    None for an entry without one (``bar_margin``)."""
    if bar_margin(entry) is None:
        return None
    return {**entry, "id": f"{entry['id']}~bar", "metric": BARS[entry["metric"]]}
