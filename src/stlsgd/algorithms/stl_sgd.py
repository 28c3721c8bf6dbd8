"""STL-SGD: Local SGD with a stagewise communication period (Algorithms 2 and 3)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from stlsgd.algorithms.plan import Plan, Round, floor_period, stage_rounds


def first_stage_length(lr: float, lam: float, scale: float = 1.0) -> int:
    """T_1 from the paper's experimental rule eta_1 * T_1 = scale / lambda (Section 5; scale = 1)."""
    return max(int(math.ceil(scale / (lam * lr) - 1e-9)), 1)


@dataclass
class STLSGD(Plan):
    """STL-SGD^sc (Algorithm 2) and STL-SGD^nc (Algorithm 3, Options 1 and 2).

    Stage s (1-based) runs Local SGD for T_s iterations with lr eta_s and period max(floor(k_s), 1):

    - geometric (Algorithm 2 and Algorithm 3 Option 1): eta_s = eta_1/2^(s-1), T_s = 2^(s-1) T_1,
      k_s = 2^(s-1) k_1 (IID) or 2^((s-1)/2) k_1 (Non-IID);
    - linear (Algorithm 3 Option 2): eta_s = eta_1/s, T_s = s T_1, k_s = s k_1 (IID) or sqrt(s) k_1 (Non-IID).

    With ``gamma`` set (STL-SGD^nc) every stage minimises f(x) + 1/(2 gamma) ||x - x_s||^2, x_s the stage's
    starting point.
    """

    lr: float
    T1: int
    k1: float
    iid: bool = True
    option: int = 1
    gamma: float | None = None
    batch: int = 1
    name: str = "stl_sc"

    def stage(self, s: int) -> tuple[float, int, int]:
        """(eta_s, T_s, period_s) of stage ``s`` (1-based)."""
        if self.option == 1:
            growth = 2.0 ** (s - 1)
            lr, length = self.lr / growth, self.T1 * 2 ** (s - 1)
            k = self.k1 * (growth if self.iid else 2.0 ** ((s - 1) / 2))
        else:
            lr, length = self.lr / s, self.T1 * s
            k = self.k1 * (s if self.iid else math.sqrt(s))
        return lr, length, floor_period(k)

    def _all_rounds(self) -> Iterator[Round]:
        index, start, s = 0, 0, 1
        while True:
            lr, length, period = self.stage(s)
            for rnd in stage_rounds(
                first_index=index, stage=s, start_iteration=start, length=length, period=period,
                batch=self.batch, lr=lr, prox_gamma=self.gamma,
            ):
                yield rnd
            index = rnd.index + 1
            start += length
            s += 1
