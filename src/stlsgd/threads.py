"""Compute threads when several processes share one machine (sweep workers, torchrun ranks)."""

from __future__ import annotations

import os
import sys

import numba

_torch_threads: int | None = None  # the share for torch, applied when torch is (or gets) imported


def share_cores(processes: int) -> int:
    """Give each of ``processes`` processes an equal share of the cores for numba and torch; returns it.

    torch is not imported for this (a NumPy run never needs it): the share is applied now if torch is already
    loaded, else by :func:`torch_threads` where torch work begins."""
    global _torch_threads
    threads = max(1, (os.cpu_count() or 1) // max(1, processes))
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
    _torch_threads = threads
    if "torch" in sys.modules:
        torch_threads()
    return threads


def torch_threads() -> None:
    """Apply this process's share of the cores to torch, if :func:`share_cores` set one."""
    if _torch_threads is not None:
        import torch

        torch.set_num_threads(_torch_threads)
