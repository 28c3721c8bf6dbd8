"""How training rows are divided among clients (shared, random split, label-skewed)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stlsgd.errors import ConfigError

PARTITION_MODES: tuple[str, ...] = ("shared", "split", "noniid", "dirichlet")
#: Modes whose clients draw from one distribution: STL-SGD then doubles k a stage (Non-IID: x sqrt 2).
IID_MODES: tuple[str, ...] = ("shared", "split")
# The samples' mean stands for the clients' mean objective (Partition.row_weights) while every row's weight is within
# this of 1. The gap between their optima grows fast with the weights' spread; measured (f of the clients'
# mean's x*, less f*): a9a and MNIST 4/9 on 32 Non-IID clients (1,017-1,018 and 368-369 rows: 0.05% and 0.14%)
# 6.5e-9 and 3.2e-8, which keeps the stored sweeps' records; wine on 8 clients of 22-23 rows (3.3%) 2.8e-6, on 32 of
# 5-6 (11%) 2.4e-4, more than the 1e-4 target its runs were set; 16 make_blobs clients of Dirichlet(0.5) shares (26
# to 1,105 rows) 6.6e-4.
ROW_WEIGHT_TOLERANCE = 0.01


@dataclass(frozen=True)
class Partition:
    """Client c samples from ``rows[starts[c] : starts[c] + sizes[c]]``."""

    mode: str
    rows: np.ndarray
    starts: np.ndarray
    sizes: np.ndarray

    def client_rows(self, c: int) -> np.ndarray:
        """Row ids (into the dataset) that client ``c`` samples from."""
        s = int(self.starts[c])
        return self.rows[s : s + int(self.sizes[c])]

    @property
    def num_clients(self) -> int:
        return int(self.sizes.shape[0])

    def row_weights(self, n: int) -> np.ndarray | None:
        """Each of the ``n`` rows' weight in the clients' mean objective, f = 1/N sum_c f_c with f_c client c's mean
        loss (the paper's f, Sec. 3): row i weighs n / N sum_{c holds i} 1 / n_c. The executors average the clients'
        models with equal weights, so that mean, not the samples' mean, is what their runs converge to.

        None (the samples' mean, all weights 1) where every weight is within ROW_WEIGHT_TOLERANCE of 1: every client
        holds all rows (``shared``), or n / N of them, floor or ceiling, out of many (``split``, ``noniid``)."""
        weights = np.zeros(n)
        for c in range(self.num_clients):  # a client's rows are distinct; clients may share rows (``shared``)
            weights[self.client_rows(c)] += n / (self.num_clients * int(self.sizes[c]))
        return None if np.all(np.abs(weights - 1.0) <= ROW_WEIGHT_TOLERANCE) else weights


def _from_chunks(mode: str, chunks: list[np.ndarray]) -> Partition:
    sizes = np.array([c.size for c in chunks], dtype=np.int64)
    for c, size in enumerate(sizes):
        if size == 0:
            hint = " (increase alpha or use fewer clients)" if mode == "dirichlet" else ""
            raise ConfigError(f"partition: mode {mode!r} leaves client {c} with no rows{hint}")
    starts = np.zeros_like(sizes)
    np.cumsum(sizes[:-1], out=starts[1:])
    rows = np.concatenate(chunks).astype(np.int64, copy=False)
    return Partition(mode=mode, rows=rows, starts=starts, sizes=sizes)


def _split_sizes(n: int, parts: int) -> np.ndarray:
    """np.array_split's chunk sizes: the first n % parts chunks get one extra row."""
    base, extra = divmod(n, parts)
    return np.array([base + (c < extra) for c in range(parts)], dtype=np.int64)


def make_partition(
    y: np.ndarray, num_clients: int, mode: str, *, seed: int, s: float = 50.0, alpha: float = 0.5
) -> Partition:
    """Divide ``len(y)`` rows among ``num_clients`` clients.

    ``shared``: every client samples from all rows (the IID case). ``split``: a random equal partition.
    ``noniid``: ``s``% of rows dealt at random, the rest sorted by label and dealt in contiguous chunks
    (Karimireddy et al.; the paper's Sec. 5). ``dirichlet``: per-class Dirichlet(``alpha``) proportions.
    """
    y = np.asarray(y)
    n = int(y.shape[0])
    if mode not in PARTITION_MODES:
        raise ConfigError(f"partition.mode: unknown mode {mode!r}; known: {', '.join(PARTITION_MODES)}")
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise ConfigError(f"num_clients: must be a positive integer, got {num_clients!r}")
    num_clients = int(num_clients)
    if num_clients > n:
        raise ConfigError(f"num_clients: more clients ({num_clients}) than samples ({n})")
    if not 0.0 <= s <= 100.0:
        raise ConfigError(f"partition.s: must be in [0, 100], got {s}")
    if not alpha > 0.0:
        raise ConfigError(f"partition.alpha: must be > 0, got {alpha}")

    if mode == "shared":
        return Partition(
            mode=mode,
            rows=np.arange(n, dtype=np.int64),
            starts=np.zeros(num_clients, dtype=np.int64),
            sizes=np.full(num_clients, n, dtype=np.int64),
        )

    rng = np.random.default_rng(seed)
    perm = rng.permutation(n).astype(np.int64)
    if mode == "split":
        return _from_chunks(mode, np.array_split(perm, num_clients))

    if mode == "noniid":
        k = int(round(s * n / 100.0))
        iid, rest = perm[:k], perm[k:]
        rest = rest[np.argsort(y[rest], kind="stable")]  # ties keep the shuffled order
        # Sorted chunk sizes top each client up to the split-mode size, so every client gets
        # floor or ceil of n/N rows in total instead of up to two extra.
        iid_sizes = _split_sizes(k, num_clients)
        rest_sizes = _split_sizes(n, num_clients) - iid_sizes
        iid_chunks = np.split(iid, np.cumsum(iid_sizes)[:-1])
        rest_chunks = np.split(rest, np.cumsum(rest_sizes)[:-1])
        return _from_chunks(mode, [np.concatenate(pair) for pair in zip(iid_chunks, rest_chunks)])

    # dirichlet
    per_client: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for label in np.unique(y):
        members = perm[y[perm] == label]
        props = rng.dirichlet(np.full(num_clients, alpha))
        cuts = np.floor(np.cumsum(props)[:-1] * members.size).astype(np.int64)
        for c, part in enumerate(np.split(members, cuts)):
            per_client[c].append(part)
    # Shuffle within each client so a sequential reader does not see one class at a time.
    chunks = [rng.permutation(np.concatenate(parts)) for parts in per_client]
    return _from_chunks(mode, chunks)
