"""Train/public/test splits and client partitions (IID, Dirichlet label skew per class or
per client (Refiner App. D), whole groups of an attribute such as RecUP-FL §6.4's
identities)."""

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


def attribute_partition(groups: np.ndarray, clients: int,
                        rng: np.random.Generator) -> list[np.ndarray]:
    """Whole groups per client (RecUP-FL §6.4: LFW's training images "distributed to 100
    clients with no overlap according to their identities"): no group spans two clients.

    The groups are taken largest first (ties in a random order) and each goes to the
    client holding the fewest samples so far (lowest index on ties), so the clients' sizes
    stay as even as whole groups allow and every client gets at least one group."""
    groups = np.asarray(groups)
    if groups.ndim != 1:
        raise ValueError(f"attribute partition needs one group value per sample, got shape "
                         f"{groups.shape}")
    names, inverse, sizes = np.unique(groups, return_inverse=True, return_counts=True)
    if clients < 1 or clients > len(names):
        raise ValueError(f"attribute partition: {clients} clients, but the samples form "
                         f"{len(names)} groups; expected 1 to {len(names)} clients (each "
                         f"client holds whole groups)")
    shuffled = rng.permutation(len(names))
    order = shuffled[np.argsort(-sizes[shuffled], kind="stable")]
    load = np.zeros(clients, dtype=np.int64)
    owner = np.empty(len(names), dtype=np.int64)
    for group in order:
        client = int(np.argmin(load))
        owner[group] = client
        load[client] += sizes[group]
    sample_owner = owner[inverse]
    return [np.flatnonzero(sample_owner == c) for c in range(clients)]


def client_dirichlet_partition(labels: np.ndarray, clients: int, alpha: float,
                               rng: np.random.Generator) -> list[np.ndarray]:
    """Refiner App. D's non-IID split: a label distribution per client. Each client k draws
    its own p_k ~ Dir(alpha 1_C) over the C classes, independently (the generator's first
    draw, a (clients, C) array); it then holds n p_kc samples of class c (largest-remainder
    rounding, so exactly n), drawn at random without replacement: no sample goes to two
    clients. Every client holds the same n ("a specified number of samples"): the largest
    that every class can supply to all clients at once, at most ``len(labels) // clients``
    (with Dir(1) over 10 classes about half the training set is used)."""
    if alpha <= 0:
        raise ValueError(f"client_dirichlet alpha must be > 0, got {alpha}")
    classes, counts = np.unique(labels, return_counts=True)
    if clients < 1 or clients > len(labels):
        raise ValueError(f"clients must be in [1, {len(labels)}], got {clients}")
    shares = rng.dirichlet(np.full(len(classes), alpha), size=clients)

    def wanted(n: int) -> np.ndarray:  # (clients, C) counts, each row summing to n
        exact = shares * n
        out = np.floor(exact).astype(np.int64)
        for row, rest in zip(out, exact - out, strict=True):
            row[np.argsort(-rest, kind="stable")[:n - row.sum()]] += 1
        return out

    demand = shares.sum(axis=0)
    n = min(len(labels) // clients, int(np.min(counts / np.maximum(demand, 1e-12))))
    while n > 0 and (wanted(n).sum(axis=0) > counts).any():
        n -= 1
    if n < 1:
        raise ValueError(f"client_dirichlet partition: the {len(labels)} samples cannot give "
                         f"each of {clients} clients one sample of its Dir({alpha}) label "
                         f"distribution; expected fewer clients or more data")
    take = wanted(n)
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
    used = np.zeros(len(classes), dtype=np.int64)
    shards = []
    for row in take:
        parts = [pool[start:start + k] for pool, start, k in zip(pools, used, row, strict=True)]
        used += row
        shards.append(np.sort(np.concatenate(parts)).astype(np.int64))
    return shards


def partition(labels: np.ndarray, kind: str, clients: int, rng: np.random.Generator,
              alpha: float | None = None, groups: np.ndarray | None = None
              ) -> list[np.ndarray]:
    """Client shards of sample indices: ``iid``, ``dirichlet`` (label skew, ``alpha``),
    ``client_dirichlet`` (a label distribution per client, ``alpha``) or ``attribute``
    (whole ``groups``, one value per sample)."""
    if kind == "iid":
        return iid_partition(len(labels), clients, rng)
    if kind == "dirichlet":
        if alpha is None:
            raise ValueError("dirichlet partition needs alpha")
        return dirichlet_partition(labels, clients, alpha, rng)
    if kind == "client_dirichlet":
        if alpha is None:
            raise ValueError("client_dirichlet partition needs alpha")
        return client_dirichlet_partition(labels, clients, alpha, rng)
    if kind == "attribute":
        if groups is None:
            raise ValueError("attribute partition needs groups (the attribute's value per "
                             "sample)")
        return attribute_partition(groups, clients, rng)
    raise ValueError(f"unknown partition {kind!r}; expected 'iid', 'dirichlet', "
                     "'client_dirichlet' or 'attribute'")
