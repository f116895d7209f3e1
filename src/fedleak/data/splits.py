"""Train/public/test splits and client partitions (IID, Dirichlet label skew)."""

from __future__ import annotations

import numpy as np


def stratified_splits(labels: np.ndarray, fractions: dict[str, float],
                      seed: int) -> dict[str, np.ndarray]:
    """Split indices per class into named parts; the first part takes the remainder."""
    if any(f < 0 for f in fractions.values()) or sum(fractions.values()) > 1 + 1e-9:
        raise ValueError(f"split fractions must be >= 0 and sum to <= 1, got {fractions}")
    rng = np.random.default_rng(seed)
    names = list(fractions)
    parts: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for cls in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        counts = [int(round(fractions[n] * len(idx))) for n in names[1:]]
        start = len(idx) - sum(counts)
        parts[names[0]].append(idx[:start])
        for name, count in zip(names[1:], counts):
            parts[name].append(idx[start:start + count])
            start += count
    return {n: np.sort(np.concatenate(p)) for n, p in parts.items()}


def iid_partition(num_samples: int, clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    if clients < 1 or clients > num_samples:
        raise ValueError(f"clients must be in [1, {num_samples}], got {clients}")
    return [np.sort(p) for p in np.array_split(rng.permutation(num_samples), clients)]


def dirichlet_partition(labels: np.ndarray, clients: int, alpha: float,
                        rng: np.random.Generator, min_size: int = 2,
                        max_tries: int = 100) -> list[np.ndarray]:
    """Label-skewed partition: each class is split over clients by Dir(alpha)."""
    if alpha <= 0:
        raise ValueError(f"dirichlet alpha must be > 0, got {alpha}")
    if clients < 1 or clients * min_size > len(labels):
        raise ValueError(f"cannot give {clients} clients {min_size} samples each "
                         f"from {len(labels)} samples")
    for _ in range(max_tries):
        shards: list[list[int]] = [[] for _ in range(clients)]
        for cls in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == cls))
            cuts = (np.cumsum(rng.dirichlet(np.full(clients, alpha))) * len(idx)).astype(int)
            for client, part in enumerate(np.split(idx, cuts[:-1])):
                shards[client].extend(part.tolist())
        if min(len(s) for s in shards) >= min_size:
            return [np.sort(np.asarray(s, dtype=np.int64)) for s in shards]
    raise RuntimeError(f"no Dirichlet(alpha={alpha}) partition gave every client "
                       f">= {min_size} samples in {max_tries} tries; raise alpha")


def partition(labels: np.ndarray, kind: str, clients: int, rng: np.random.Generator,
              alpha: float | None = None) -> list[np.ndarray]:
    if kind == "iid":
        return iid_partition(len(labels), clients, rng)
    if kind == "dirichlet":
        if alpha is None:
            raise ValueError("dirichlet partition needs alpha")
        return dirichlet_partition(labels, clients, alpha, rng)
    raise ValueError(f"unknown partition {kind!r}; expected 'iid' or 'dirichlet'")
