"""UCI Adult Income with sensitive attributes (RecUP-FL's tabular task), from a local
folder holding UCI's ``adult.data`` (32,561 rows) and ``adult.test`` (16,281 rows).

y = income > 50K. Attributes: ``race`` (5: 0 White, 1 Asian-Pac-Islander, 2
Amer-Indian-Eskimo, 3 Black, 4 Other; the paper's five) and ``sex`` (2: 0 Female, 1 Male).
Features: the six continuous columns min-max scaled to [0, 1] over the loaded rows, then
the categorical columns one-hot over adult.names' categories ('?' is a category of
workclass, occupation and native-country, so no row is dropped); the columns in ``drop``
(default race, as the paper's 103 inputs) are left out. Stored as x of shape
(N, 1, 1, F), F = 103 by default.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gradleak.data.image_data import ImageData

ADULT_COLUMNS = ("age", "workclass", "fnlwgt", "education", "education-num", "marital-status",
                 "occupation", "relationship", "race", "sex", "capital-gain", "capital-loss",
                 "hours-per-week", "native-country", "income")
ADULT_CONTINUOUS = ("age", "fnlwgt", "education-num", "capital-gain", "capital-loss",
                    "hours-per-week")
# adult.names' categories; '?' (a missing value in UCI's files) is a category of its own
ADULT_CATEGORIES = {
    "workclass": ("Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov",
                  "State-gov", "Without-pay", "Never-worked", "?"),
    "education": ("Bachelors", "Some-college", "11th", "HS-grad", "Prof-school", "Assoc-acdm",
                  "Assoc-voc", "9th", "7th-8th", "12th", "Masters", "1st-4th", "10th",
                  "Doctorate", "5th-6th", "Preschool"),
    "marital-status": ("Married-civ-spouse", "Divorced", "Never-married", "Separated",
                       "Widowed", "Married-spouse-absent", "Married-AF-spouse"),
    "occupation": ("Tech-support", "Craft-repair", "Other-service", "Sales", "Exec-managerial",
                   "Prof-specialty", "Handlers-cleaners", "Machine-op-inspct", "Adm-clerical",
                   "Farming-fishing", "Transport-moving", "Priv-house-serv", "Protective-serv",
                   "Armed-Forces", "?"),
    "relationship": ("Wife", "Own-child", "Husband", "Not-in-family", "Other-relative",
                     "Unmarried"),
    "race": ("White", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Black", "Other"),
    "sex": ("Female", "Male"),
    "native-country": (
        "United-States", "Cambodia", "England", "Puerto-Rico", "Canada", "Germany",
        "Outlying-US(Guam-USVI-etc)", "India", "Japan", "Greece", "South", "China", "Cuba",
        "Iran", "Honduras", "Philippines", "Italy", "Poland", "Jamaica", "Vietnam", "Mexico",
        "Portugal", "Ireland", "France", "Dominican-Republic", "Laos", "Ecuador", "Taiwan",
        "Haiti", "Columbia", "Hungary", "Guatemala", "Nicaragua", "Scotland", "Thailand",
        "Yugoslavia", "El-Salvador", "Trinadad&Tobago", "Peru", "Hong", "Holand-Netherlands",
        "?"),
}
ADULT_FILES = {"all": ("adult.data", "adult.test"), "train": ("adult.data",),
               "test": ("adult.test",)}


def adult_feature_names(drop: tuple[str, ...] | list[str] = ("race",)) -> list[str]:
    """The names of x's F columns: continuous ones, then ``column=category``."""
    _check_drop(drop)
    names = [c for c in ADULT_CONTINUOUS if c not in drop]
    for column, categories in ADULT_CATEGORIES.items():
        if column not in drop:
            names += [f"{column}={c}" for c in categories]
    return names


def _check_drop(drop) -> None:
    droppable = set(ADULT_CONTINUOUS) | set(ADULT_CATEGORIES)
    if unknown := sorted(set(drop) - droppable):
        raise ValueError(f"adult: cannot drop {unknown}; expected columns among "
                         f"{sorted(droppable)}")


def _read_adult(path: Path) -> list[list[str]]:
    rows = []
    with open(path) as fh:
        for number, line in enumerate(fh, 1):
            line = line.strip()
            if not line or line.startswith("|"):  # adult.test's first line: |1x3 Cross validator
                continue
            fields = [f.strip() for f in line.split(",")]
            if len(fields) != len(ADULT_COLUMNS):
                raise ValueError(f"{path}:{number}: expected {len(ADULT_COLUMNS)} comma-separated "
                                 f"fields (UCI adult format), got {len(fields)}")
            fields[-1] = fields[-1].rstrip(".")  # adult.test writes '>50K.'
            rows.append(fields)
    return rows


def adult_missing(options: dict) -> str | None:
    """Why Adult cannot be read from its local root (None: it can)."""
    root = Path(options.get("root", "data"))
    files = [root / f for f in ADULT_FILES.get(options.get("split", "all"), ("adult.data",))]
    if absent := [str(f) for f in files if not f.is_file()]:
        return (f"dataset 'adult' not found: {', '.join(absent)} missing; put UCI's Adult "
                f"files (adult.data, adult.test from archive.ics.uci.edu/dataset/2/adult, "
                f"unchanged) in {root} or set datasets.adult.root")
    return None


def load_adult(root: str | Path, split: str = "all",
               drop: tuple[str, ...] | list[str] = ("race",)) -> ImageData:
    """UCI Adult from ``root`` (adult.data, adult.test): see the module docstring."""
    if split not in ADULT_FILES:
        raise ValueError(f"adult split must be one of {sorted(ADULT_FILES)}, got {split!r}")
    _check_drop(drop)
    if reason := adult_missing({"root": root, "split": split}):
        raise FileNotFoundError(reason)
    rows = [r for name in ADULT_FILES[split] for r in _read_adult(Path(root) / name)]
    if not rows:
        raise ValueError(f"adult: no rows in {[str(Path(root) / n) for n in ADULT_FILES[split]]}")
    column = {c: [r[i] for r in rows] for i, c in enumerate(ADULT_COLUMNS)}

    def codes(name: str) -> np.ndarray:
        index = {c: i for i, c in enumerate(ADULT_CATEGORIES[name])}
        if bad := sorted(set(column[name]) - set(index)):
            raise ValueError(f"adult: unknown {name} value(s) {bad[:5]} under {root}; expected "
                             f"one of {list(index)}")
        return np.array([index[v] for v in column[name]], dtype=np.int64)

    parts = []
    for name in ADULT_CONTINUOUS:
        if name in drop:
            continue
        try:
            values = np.array(column[name], dtype=np.float64)
        except ValueError as exc:
            raise ValueError(f"adult: column {name} under {root} is not numeric ({exc})") from None
        low, span = values.min(), values.max() - values.min()
        parts.append(((values - low) / (span if span > 0 else 1.0))[:, None])
    for name, categories in ADULT_CATEGORIES.items():
        if name not in drop:
            parts.append(np.eye(len(categories))[codes(name)])
    x = torch.from_numpy(np.concatenate(parts, axis=1).astype(np.float32))
    labels = column["income"]
    if bad := sorted(set(labels) - {">50K", "<=50K"}):
        raise ValueError(f"adult: unknown income value(s) {bad[:5]}; expected '>50K' or '<=50K'")
    y = torch.tensor([label == ">50K" for label in labels], dtype=torch.int64)
    attributes = {"race": torch.from_numpy(codes("race")), "sex": torch.from_numpy(codes("sex"))}
    return ImageData(x.view(len(rows), 1, 1, -1).contiguous(), y, 2, attributes)
