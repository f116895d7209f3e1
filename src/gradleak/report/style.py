"""What every figure shares: one (colour, marker, line style) per series name, one legend
per figure outside the panels, strength labels that do not overlap, log axes where values
span decades and titles naming the case.

A registered defense or attack has the style ``FIXED`` names for it, so ``censor`` looks
the same in every figure and registering another changes no other's; ``none`` is a black
star. Any other name (a configured label such as ``censor_alg1``, a dataset, a swept value,
a class not yet in ``FIXED``) takes the style its name hashes to among those ``FIXED`` does
not hold, or the next free one where two series of one figure would coincide.
"""

from __future__ import annotations

import itertools
import textwrap
import zlib
from collections.abc import Iterable

import matplotlib.pyplot as plt
import seaborn as sns
from matplotlib import ticker
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

# seaborn's "colorblind" palette, markers and line styles; 10 x 8 x 4 combinations
COLORS = tuple(sns.color_palette("colorblind", 10).as_hex())
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<")
LINESTYLES = ("-", "--", "-.", ":")
# the first 40 change colour, marker and line style together (any two differ in colour
# or marker), then the rest of the product
_CYCLE = [(COLORS[i % 10], MARKERS[i % 8], LINESTYLES[i % 4]) for i in range(40)]
COMBOS = _CYCLE + [c for c in itertools.product(COLORS, MARKERS, LINESTYLES) if c not in _CYCLE]
UNDEFENDED_STYLE = {"color": "black", "marker": "*", "linestyle": "-"}
# each registered defense's and attack's index in COMBOS, never changed: a newly registered
# one is added with the next free index (tests/test_style.py fails until it is)
FIXED = {
    "censor": 0, "clipping": 1, "dp_gaussian": 2, "dp_laplace": 3, "layer_noise": 4,
    "pruning": 5, "quantization": 6, "recupfl": 7, "refiner": 8, "soteria": 9,
    "dlg": 10, "eot": 11, "gga": 12, "gias": 13, "gifd": 14, "giml": 15, "gradinversion": 16,
    "idlg": 17, "inverting_gradients": 18, "rgap": 19, "rog": 20, "lti": 21, "fan2025": 22,
}
_HELD = frozenset(FIXED.values())
# any other name hashes into COMBOS[HASHED:] less _HELD; HASHED stays 20, so that adding a
# name to FIXED moves only the names that hashed to its index
HASHED = 20
LABEL = "strength-label"  # gid of a point label, which finish() may move or drop
PLACES = ((4, 4), (-4, 4), (4, -4), (-4, -4))  # a label's offsets from its point (points)


def series_styles(names: Iterable) -> dict:
    """Each name's style (``color``, ``marker``, ``linestyle``), no two alike."""
    styles, used = {}, set()
    span = len(COMBOS) - HASHED
    for name in sorted(set(names), key=lambda n: (str(n) not in FIXED, str(n))):
        if str(name) == "none":
            styles[name] = dict(UNDEFENDED_STYLE)
            continue
        if str(name) in FIXED:
            i = FIXED[str(name)]
        else:
            i = HASHED + zlib.crc32(str(name).encode()) % span
            while i in used or i in _HELD:
                i = HASHED + (i + 1 - HASHED) % span
        used.add(i)
        styles[name] = dict(zip(("color", "marker", "linestyle"), COMBOS[i], strict=True))
    return styles


def series_style(name) -> dict:
    """The style of ``name`` in a figure of its own (the same in every figure unless an
    unregistered name's hash meets another's there)."""
    return series_styles([name])[name]


def case_text(cases: Iterable) -> str:
    """'on case c' / 'on cases a, b' for a title."""
    cases = sorted({str(c) for c in cases})
    if not cases:
        return ""
    return f"on case{'s' if len(cases) > 1 else ''} {', '.join(cases)}"


def log_if_spread(ax: plt.Axes, axis: str, values: Iterable, decades: float = 2.0) -> None:
    """A log ``axis`` ("x" or "y") where the positive ``values`` span ``decades`` or more."""
    values = [float(v) for v in values]
    if values and min(values) > 0 and max(values) >= min(values) * 10 ** decades:
        log_axis(ax, axis)


def log_axis(ax: plt.Axes, axis: str) -> None:
    """A log ``axis`` labelled in plain numbers at the powers of ten (and 2, 3 and 5 times
    them where its data span less than a decade)."""
    low, high = getattr(ax.dataLim, f"interval{axis}")
    getattr(ax, f"set_{axis}scale")("log")
    target = getattr(ax, f"{axis}axis")
    target.set_major_locator(ticker.LogLocator(subs=(1, 2, 3, 5) if high < 10 * low else (1,)))
    target.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    target.set_minor_formatter(ticker.NullFormatter())


def label_points(ax: plt.Axes, curves: list[tuple[list, list, list[str], str]]) -> None:
    """Candidate labels for the points of ``curves`` ((xs, ys, texts, colour) each): every
    curve's first and last point before its inner ones, so that finish() keeps them first."""
    order = []
    for xs, ys, texts, color in curves:
        n = len(xs)
        ranks = [0 if i in (0, n - 1) else 1 for i in range(n)]
        order += [(rank, x, y, text, color)
                  for rank, x, y, text in zip(ranks, xs, ys, texts, strict=True)]
    for _, x, y, text, color in sorted(order, key=lambda o: o[0]):
        ax.annotate(text, (x, y), xytext=(4, 4), textcoords="offset points",
                    fontsize="x-small", color=color, gid=LABEL, in_layout=False)


def finish(fig: Figure, title: str, legend_title: str | None = None,
           extra: Iterable[Line2D] = ()) -> Figure:
    """Title the figure, give it one legend right of the panels (every labelled series
    once, then ``extra`` handles) and put each point label above right, above left, below
    right or below left of its point, the first place inside its panel that overlaps no
    label kept before it; none: the label is dropped."""
    fig.suptitle(textwrap.fill(title, int(10 * fig.get_figwidth()), break_on_hyphens=False),
                 fontsize="medium")
    handles = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    handles.update({h.get_label(): h for h in extra})
    if handles:
        fig.legend(handles.values(), handles.keys(), title=legend_title, fontsize="small",
                   loc="outside right center")
    fig.draw_without_rendering()  # lays the figure out: labels are measured where they will be
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        kept = []
        for text in [t for t in ax.texts if t.get_gid() == LABEL]:
            for dx, dy in PLACES:
                text.set_position((dx, dy))
                text.set(ha="left" if dx > 0 else "right", va="bottom" if dy > 0 else "top")
                box = text.get_window_extent(renderer).expanded(1.1, 1.2)
                inside = ax.bbox.contains(box.x0, box.y0) and ax.bbox.contains(box.x1, box.y1)
                if inside and not any(box.overlaps(other) for other in kept):
                    kept.append(box)
                    break
            else:
                text.remove()
    return fig
