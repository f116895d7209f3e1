"""A series' style is keyed by its name: registering a defense or attack, or drawing a new
name beside the others, changes no registered name's (colour, marker, line style)."""

import copy
import importlib

import pytest

from gradleak import config as cfg
from gradleak.report import style

DEFINITIONS = cfg.schema()["definitions"]
REGISTERED = sorted(n for n in [*DEFINITIONS["defenses"], *DEFINITIONS["attacks"]] if n != "none")


def _combo(name) -> int:
    st = style.series_style(name)
    return style.COMBOS.index((st["color"], st["marker"], st["linestyle"]))


def test_every_registered_defense_and_attack_has_a_fixed_style():
    missing = [n for n in REGISTERED if n not in style.FIXED]
    free = max(style.FIXED.values()) + 1
    assert not missing, (
        f"{missing} registered without a figure style: add each to FIXED in "
        f"src/gradleak/report/style.py with the next free index ({free}, then {free + 1}, ...)")
    assert "none" not in style.FIXED


def test_fixed_styles_are_distinct_and_none_is_a_black_star():
    assert len(set(style.FIXED.values())) == len(style.FIXED)
    assert all(0 <= i < len(style.COMBOS) for i in style.FIXED.values())
    styles = style.series_styles([*style.FIXED, "none"])
    assert styles["none"] == {"color": "black", "marker": "*", "linestyle": "-"}
    assert len({tuple(s.values()) for s in styles.values()}) == len(styles)


def test_todays_figures_keep_their_looks():
    assert [_combo(n) for n in ("censor", "soteria", "dlg", "rgap")] == [0, 9, 10, 19]
    assert _combo("censor_alg1") == 44  # a configured label hashes where it always did


def test_registering_a_new_defense_or_attack_changes_no_other_style(monkeypatch):
    before = {n: style.series_style(n) for n in REGISTERED}
    schema = copy.deepcopy(cfg.schema())
    schema["definitions"]["defenses"]["aaa_new_defense"] = {"type": "object"}
    schema["definitions"]["attacks"]["aaa_new_attack"] = {"type": "object"}
    try:
        with monkeypatch.context() as m:
            m.setattr(cfg, "schema", lambda: copy.deepcopy(schema))
            importlib.reload(style)
            after = {n: style.series_style(n) for n in REGISTERED}
            new = style.series_styles([*REGISTERED, "aaa_new_defense", "aaa_new_attack"])
    finally:
        importlib.reload(style)
    assert after == before
    assert {tuple(new[n].values()) for n in ("aaa_new_defense", "aaa_new_attack")}.isdisjoint(
        tuple(s.values()) for s in before.values())


@pytest.mark.parametrize("extra", [["aaa_new_defense"], ["aaa", "zzz", "censor_alg1", 1e-3]])
def test_a_new_name_in_a_figure_changes_no_registered_style(extra):
    alone = style.series_styles([*REGISTERED, "none"])
    beside = style.series_styles([*REGISTERED, "none", *extra])
    assert {n: beside[n] for n in alone} == alone
    assert len({tuple(s.values()) for s in beside.values()}) == len(beside)
