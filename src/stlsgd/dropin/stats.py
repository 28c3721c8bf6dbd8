"""What the averager reports: :class:`RoundStats` (counters), its one-line form and a CSV log."""

from __future__ import annotations

import csv as csv_module
import dataclasses
from dataclasses import dataclass
from pathlib import Path


@dataclass
class RoundStats:
    """What the averager has done so far (all counts per process), updated at every average: the end of each
    round of the plan, and an average called by hand (a final ``average()``).

    ``round``: rounds of the plan completed; ``steps``: optimizer steps counted; ``averages``: averages over
    the group (a group of one never averages)."""

    round: int = 0
    stage: int = 1
    period: int = 1
    steps: int = 0
    lr: float | None = None
    averages: int = 0
    #: The last loss fed to :meth:`PlanAverager.report_loss` (None: none yet).
    objective: float | None = None
    bytes_sent: int = 0
    ddp_bytes: int = 0
    compute_s: float = 0.0
    comm_s: float = 0.0

    @property
    def saved(self) -> float:
        """Fraction of a per-step DDP's gradient traffic not sent (0 before any step)."""
        return 1.0 - self.bytes_sent / self.ddp_bytes if self.ddp_bytes else 0.0

    def line(self) -> str:
        lr = "-" if self.lr is None else f"{self.lr:.4g}"
        return (
            f"stlsgd round {self.round}: stage {self.stage}, period {self.period}, lr {lr}, {self.steps} steps, "
            f"{self.averages} averages, {self.bytes_sent / 2**20:.1f} MiB sent vs {self.ddp_bytes / 2**20:.1f} "
            f"MiB for per-step DDP ({100 * self.saved:.1f}% saved), compute {self.compute_s:.1f} s, "
            f"communication {self.comm_s:.1f} s"
        )


FIELDS = [f.name for f in dataclasses.fields(RoundStats)] + ["saved"]


class CsvLog:
    """One row per round: the fields of :class:`RoundStats`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._new = True

    def write(self, stats: RoundStats) -> None:
        with open(self.path, "w" if self._new else "a", newline="") as fh:
            writer = csv_module.DictWriter(fh, fieldnames=FIELDS)
            if self._new:
                writer.writeheader()
                self._new = False
            writer.writerow({**dataclasses.asdict(stats), "saved": stats.saved})
