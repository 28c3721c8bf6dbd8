"""The paper's baselines (Section 5): SyncSGD, LB-SGD, CR-PSGD and Local SGD (Algorithm 1)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from stlsgd.algorithms.plan import Plan, Round


@dataclass
class LocalSGD(Plan):
    """Algorithm 1: average every ``k`` local steps; eta_t = lr/(1+alpha t) (alpha = 0: fixed, non-convex)."""

    lr: float
    k: int
    batch: int = 1
    lr_decay: float = 0.0
    name: str = "local_sgd"

    def _all_rounds(self) -> Iterator[Round]:
        index = 0
        while True:
            yield Round(index, 1, index * self.k, self.k, self.batch, self.lr, self.lr_decay, self.k)
            index += 1


@dataclass
class SyncSGD(LocalSGD):
    """Synchronous mini-batch SGD: Local SGD with k = 1, i.e. an average after every step."""

    k: int = 1
    name: str = "sync_sgd"


@dataclass
class LBSGD(LocalSGD):
    """Large-batch SGD: every client uses mini-batch ``batch`` (the paper's B) and averages every step."""

    k: int = 1
    name: str = "lb_sgd"


@dataclass
class CRPSGD(Plan):
    """CR-PSGD (Yu & Jin, 2019): communicate every step while the per-client batch grows by ``rho``.

    ``grow="step"`` (the paper's convex runs): batch_t = min(floor(batch * rho**t), max_batch).
    ``grow="epoch"`` (the paper's non-convex runs): the batch is multiplied by rho once an epoch -- one pass of
    ``samples_per_epoch`` samples by all ``num_clients`` clients -- is finished, until it exceeds max_batch.
    """

    lr: float
    rho: float
    batch: int = 1
    max_batch: int = 512
    lr_decay: float = 0.0
    grow: str = "step"
    samples_per_epoch: int = 0
    num_clients: int = 1
    name: str = "cr_psgd"

    def _all_rounds(self) -> Iterator[Round]:
        index, seen, size = 0, 0, float(self.batch)
        while True:
            if self.grow == "step":
                # Compare exponents first: rho**index overflows a float long after the cap is reached.
                capped = index * math.log(self.rho) >= math.log(self.max_batch / self.batch)
                b = self.max_batch if capped else min(int(math.floor(self.batch * self.rho**index + 1e-9)), self.max_batch)
            else:
                b = min(int(math.floor(size + 1e-9)), self.max_batch)
            b = max(b, 1)
            yield Round(index, 1, index, 1, b, self.lr, self.lr_decay, 1)
            if self.grow == "epoch":
                before = seen // self.samples_per_epoch
                seen += b * self.num_clients
                if seen // self.samples_per_epoch > before and size <= self.max_batch:
                    size *= self.rho
            index += 1
