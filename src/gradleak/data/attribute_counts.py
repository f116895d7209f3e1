"""The sensitive attributes of each attribute dataset and their class counts (a leaf,
torch-free: the plan reads them without loading a dataset). Each loader's module states
what its classes are (``gradleak.data.adult``, ``lfw``, ...)."""

from __future__ import annotations

DIGIT_ATTRIBUTES = {"ink": 3, "slant": 3, "stroke": 3, "group": 2}
ADULT_CLASSES = {"race": 5, "sex": 2}
LFW_CLASSES = {"race": 3, "gender": 2, "age": 5, "glasses": 3, "hair": 4}
CELEBA_CLASSES = {"age": 2, "smiling": 2, "eyeglasses": 2}
AUDIOMNIST_CLASSES = {"gender": 2, "native": 2, "identity": 4, "accent": 2, "age": 3}

CLASSES: dict[str, dict[str, int]] = {  # dataset -> attribute -> class count
    "digits": {a: DIGIT_ATTRIBUTES[a] for a in ("ink", "slant", "stroke")},  # y: the digit
    "digits_attributes": DIGIT_ATTRIBUTES,
    "mnist_attributes": DIGIT_ATTRIBUTES,
    "adult": ADULT_CLASSES,
    "lfw": LFW_CLASSES,
    "celeba": CELEBA_CLASSES,
    "audiomnist": AUDIOMNIST_CLASSES,
}
# dataset -> attributes that group samples rather than being inferred (not in CLASSES; the
# attribute track leaves them alone): a client partition of kind `attribute` reads them
GROUPS: dict[str, tuple[str, ...]] = {"lfw": ("identity",)}
