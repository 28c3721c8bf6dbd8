"""Compute threads when several processes share one machine (sweep workers, torchrun ranks)."""

from __future__ import annotations

import os

import numba
import torch


def share_cores(processes: int) -> int:
    """Give each of ``processes`` processes an equal share of the cores for numba and torch; returns it."""
    threads = max(1, (os.cpu_count() or 1) // max(1, processes))
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
    torch.set_num_threads(threads)
    return threads
