"""TensorBoard scalars for stlsgd runs (``pip install 'stlsgd[tensorboard]'``; torch's ``SummaryWriter``).

- :class:`RoundWriter` -- the drop-in's (and the adapters') ``on_round`` callback: one point per round at
  step = round, under ``stlsgd/``: ``stage``, ``period``, ``lr``, ``steps``, ``averages``, ``bytes_sent``,
  ``ddp_bytes`` (what a per-step DDP would have sent), ``saved`` (the fraction of that not sent), and ``loss`` /
  ``gap`` when known (:meth:`RoundWriter.report`, or the stats' ``objective`` where the averager records it)::

      writer = RoundWriter("runs/tb")
      averager = PlanAverager(model, optimizer, plan, on_round=writer)
      ...
      writer.close()

  In a process group only rank 0 writes (the other ranks' writers do nothing).
- :func:`write_metrics` -- one line of the simulator's ``metrics.jsonl`` (round, iteration, stage, lr, period,
  objective, gap, accuracy, bytes, client_steps, ...) as scalars at step = round: what
  ``stlsgd run --tensorboard DIR`` writes through :func:`open_writer`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch.distributed as dist

from stlsgd.dropin import RoundStats
from stlsgd.integrations import missing

ROUND_FIELDS = ("stage", "period", "lr", "steps", "averages", "bytes_sent", "ddp_bytes", "saved")


def open_writer(log_dir: str | Path) -> Any:
    """A ``torch.utils.tensorboard.SummaryWriter`` on ``log_dir`` (one-line error when tensorboard is missing)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise missing("tensorboard", "tensorboard", exc) from exc
    return SummaryWriter(log_dir=str(log_dir))


def _number(value: Any) -> float | None:
    """A finite-or-not real number, else None (strings, None, lists are not scalars)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def write_metrics(writer: Any, metrics: Mapping[str, Any], prefix: str = "stlsgd/") -> None:
    """Write one metrics dict as scalars ``prefix + key`` at step ``metrics["round"]`` (every numeric field but
    ``round``; None, strings and non-finite values are left out)."""
    step = int(metrics["round"])
    for key, value in metrics.items():
        number = _number(value)
        if key == "round" or number is None or not math.isfinite(number):
            continue
        writer.add_scalar(prefix + key, number, global_step=step)


class RoundWriter:
    """An ``on_round`` callback writing each round's :class:`~stlsgd.dropin.RoundStats` (see the module
    docstring). ``log_dir`` or an open ``writer``; ``all_ranks=True`` writes on every rank (give each its own
    ``log_dir``)."""

    def __init__(
        self, log_dir: str | Path | None = None, *, writer: Any = None, prefix: str = "stlsgd/", all_ranks: bool = False
    ) -> None:
        if (log_dir is None) == (writer is None):
            raise ValueError("RoundWriter: give log_dir or writer")
        self.prefix = prefix
        active = all_ranks or not dist.is_initialized() or dist.get_rank() == 0
        if not active:
            self.writer = None
        elif writer is not None:
            self.writer = writer
        else:
            assert log_dir is not None  # one of the two, checked above
            self.writer = open_writer(log_dir)
        self._loss: float | None = None
        self._gap: float | None = None

    def report(self, loss: float | None = None, gap: float | None = None) -> None:
        """The latest training loss and/or objective gap, written once, with the round that ends next."""
        if loss is not None:
            self._loss = float(loss)
        if gap is not None:
            self._gap = float(gap)

    def __call__(self, stats: RoundStats) -> None:
        if self.writer is None:
            return
        values = {name: getattr(stats, name) for name in ROUND_FIELDS}
        values["loss"] = self._loss if self._loss is not None else getattr(stats, "objective", None)
        values["gap"] = self._gap
        self._loss = self._gap = None
        write_metrics(self.writer, {"round": stats.round, **values}, self.prefix)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


__all__ = ["ROUND_FIELDS", "RoundWriter", "open_writer", "write_metrics"]
