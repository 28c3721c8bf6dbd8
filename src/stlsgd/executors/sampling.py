"""Which rows each client's mini-batches use: uniform sampling from the client's own data (Algorithm 1, line 3).

The whole client axis is drawn from one generator, so any executor that holds any subset of the clients
(all of them in the simulator, a slice per rank in torch.distributed) sees the same rows for the same seed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stlsgd.data.partition import Partition


class Sampler:
    """Draws ``rows[t, c, j]``: the j-th sample of client c at local step t, uniform over the client's rows."""

    def __init__(self, partition: Partition, seed: int) -> None:
        self.partition = partition
        self.rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), 0x5751])))
        self._sizes = partition.sizes.astype(np.float64)[None, :, None]
        self._starts = partition.starts.astype(np.int64)[None, :, None]
        self._identity = partition.mode == "shared" and np.array_equal(partition.rows, np.arange(len(partition.rows)))

    def draw(self, steps: int, batch: int) -> np.ndarray:
        # row = rows[start_c + floor(u * size_c)], u uniform in [0, 1). In place, and ``take`` for the lookup: the
        # same numbers as (u * sizes).astype(int64) and fancy indexing, in about 60 % of the time (a draw is a
        # fifth of a client-step's cost on a9a).
        u = self.rng.random((steps, self.partition.num_clients, batch))
        u *= self._sizes
        local = u.astype(np.int64)
        if self._identity:
            return local
        local += self._starts
        return self.partition.rows.take(local)

    def get_state(self) -> dict[str, Any]:
        return dict(self.rng.bit_generator.state)

    def set_state(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state
