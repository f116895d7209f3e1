"""AudioMNIST with sensitive speaker attributes (RecUP-FL), from
``<root>/data/<speaker>/<digit>_<speaker>_<index>.wav`` and
``<root>/data/audioMNIST_meta.txt``.

Each recording is resampled to 8 kHz, centered in 1 s (zero-padded or cut), and turned
into a ``size`` x ``size`` (64) log-magnitude spectrogram (``torch.stft``, Hann window,
n_fft 2*size-2, hop 8000 // size; dB relative to the clip's peak, floor -80 dB, mapped to
[0, 1]; low frequencies at the bottom). y = digit. Attributes: ``gender`` (2: 0 female, 1
male), ``native`` (2: 1 where "native speaker" is "yes"), ``identity`` (4, the paper's: 0
male native, 1 female native, 2 male non-native, 3 female non-native), ``accent`` (2: 0
German, 1 other), ``age`` (3: < 25, 25-29, >= 30; an age outside 10-100, speaker 45's
'1234', counts as the speakers' median).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import torch

from gradleak.data.attribute_counts import AUDIOMNIST_CLASSES
from gradleak.data.image_data import ImageData

AUDIO_RATE = 8000
WAV_NAME = re.compile(r"(\d)_(\d+)_(\d+)\.wav")


def one_second(wave: np.ndarray, rate: int) -> np.ndarray:
    """A mono recording resampled to 8 kHz and centered in 1 s (zero-padded or cut)."""
    from scipy.signal import resample_poly

    wave = np.asarray(wave, dtype=np.float64)
    if wave.ndim != 1 or len(wave) == 0:
        raise ValueError(f"expected a non-empty mono recording, got shape {wave.shape}")
    if rate != AUDIO_RATE:
        g = math.gcd(AUDIO_RATE, rate)
        wave = resample_poly(wave, AUDIO_RATE // g, rate // g)
    start = (len(wave) - AUDIO_RATE) // 2
    if start >= 0:
        return wave[start:start + AUDIO_RATE]
    return np.pad(wave, (-start, AUDIO_RATE - len(wave) + start))


def spectrograms(waves: torch.Tensor, size: int = 64) -> torch.Tensor:
    """(B, size, size) log-magnitude spectrograms in [0, 1] of 1 s clips at 8 kHz (B, 8000):
    n_fft 2*size-2, hop 8000 // size, dB relative to each clip's peak, floor -80 dB."""
    n_fft, hop = 2 * size - 2, AUDIO_RATE // size
    stft = torch.stft(waves.double(), n_fft, hop_length=hop, return_complex=True,
                      window=torch.hann_window(n_fft, dtype=torch.float64))
    magnitude = stft.abs()[:, :, :size]
    peak = magnitude.amax((1, 2), keepdim=True).clamp_min(1e-12)
    db = 20 * torch.log10(magnitude / peak + 1e-12)
    return ((db.clamp(min=-80.0) + 80.0) / 80.0).flip(1).float()


def spectrogram(wave: np.ndarray, rate: int, size: int = 64) -> torch.Tensor:
    """(size, size) spectrogram in [0, 1] of one mono recording (module docstring)."""
    return spectrograms(torch.from_numpy(one_second(wave, rate))[None], size)[0]


def read_audiomnist_meta(path: str | Path) -> dict[str, dict]:
    """audioMNIST_meta.txt (a JSON object: speaker '01'..'60' -> accent, age, gender, ...)."""
    import ast

    text = Path(path).read_text()
    try:
        meta = json.loads(text)
    except json.JSONDecodeError:
        meta = ast.literal_eval(text)
    if not isinstance(meta, dict) or not meta:
        raise ValueError(f"{path}: expected a speaker -> metadata mapping")
    return meta


def _speaker_attributes(meta: dict[str, dict]) -> dict[str, dict[str, int]]:
    """Speaker -> attribute classes (module docstring)."""
    def plausible(age) -> float | None:
        try:
            value = float(age)
        except (TypeError, ValueError):
            return None
        return value if 10 <= value <= 100 else None

    ages = {s: plausible(m.get("age")) for s, m in meta.items()}
    median = float(np.median([a for a in ages.values() if a is not None] or [30.0]))
    out = {}
    for speaker, info in meta.items():
        gender, native = str(info["gender"]).strip().lower(), str(info["native speaker"])
        if gender not in ("female", "male"):
            raise ValueError(f"audiomnist: speaker {speaker} has gender {gender!r}; expected "
                             f"'female' or 'male'")
        male, is_native = int(gender == "male"), int(native.strip().lower() == "yes")
        age = ages[speaker] if ages[speaker] is not None else median
        out[speaker] = {"gender": male, "native": is_native,
                        "identity": (1 - is_native) * 2 + (1 - male),
                        "accent": int(str(info.get("accent", "")).strip().lower() != "german"),
                        "age": 0 if age < 25 else (1 if age < 30 else 2)}
    return out


def audiomnist_missing(options: dict) -> str | None:
    """Why AudioMNIST cannot be read from its local root (None: it can)."""
    root = Path(options.get("root", "data"))
    data_dir = root / "data"
    meta = data_dir / "audioMNIST_meta.txt"
    if meta.is_file() and any(data_dir.glob("*/*.wav")):
        return None
    return (f"dataset 'audiomnist' not found: expected {meta} and "
            f"{data_dir}/<speaker>/<digit>_<speaker>_<index>.wav; clone "
            f"github.com/soerenab/AudioMNIST (its data/ folder) into {root} or set "
            f"datasets.audiomnist.root")


def load_audiomnist(root: str | Path, size: int = 64) -> ImageData:
    """AudioMNIST spectrograms (1, size, size), y = digit, speaker attributes (module doc)."""
    from scipy.io import wavfile

    if size < 8:
        raise ValueError(f"audiomnist size must be >= 8, got {size}")
    if reason := audiomnist_missing({"root": root}):
        raise FileNotFoundError(reason)
    data_dir = Path(root) / "data"
    speakers = _speaker_attributes(read_audiomnist_meta(data_dir / "audioMNIST_meta.txt"))
    images, waves, digits, rows = [], [], [], []
    for folder in sorted(p for p in data_dir.iterdir() if p.is_dir()):
        for path in sorted(folder.glob("*.wav")):
            match = WAV_NAME.fullmatch(path.name)
            if not match:
                raise ValueError(f"audiomnist: {path} is not named <digit>_<speaker>_<index>.wav")
            speaker = match.group(2)
            if speaker not in speakers:
                raise ValueError(f"audiomnist: speaker {speaker!r} of {path} is not in "
                                 f"{data_dir / 'audioMNIST_meta.txt'}")
            rate, wave = wavfile.read(path)
            if wave.ndim == 2:
                wave = wave.mean(1)
            waves.append(torch.from_numpy(one_second(wave, rate)))
            digits.append(int(match.group(1)))
            rows.append(speakers[speaker])
            if len(waves) == 1024:  # a batched STFT, 1024 clips in memory at a time
                images.append(spectrograms(torch.stack(waves), size))
                waves = []
    if waves:
        images.append(spectrograms(torch.stack(waves), size))
    if not images:
        raise FileNotFoundError(f"audiomnist: no <speaker>/*.wav under {data_dir}")
    attributes = {name: torch.tensor([r[name] for r in rows], dtype=torch.int64)
                  for name in AUDIOMNIST_CLASSES}
    return ImageData(torch.cat(images).unsqueeze(1).contiguous(),
                     torch.tensor(digits, dtype=torch.int64), 10, attributes)
