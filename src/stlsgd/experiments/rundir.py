"""A run's output directory and its whole lifecycle, for every backend and for each run of a sweep.

Files (every name below is owned by this module):

- ``config.yaml``: the validated experiment; a directory holds one run, so a different config is refused
  unless ``overwrite`` (the same config may be rerun in place);
- ``metrics.jsonl``: one JSON line per evaluation of the averaged model;
- ``summary.json``: status, rounds/iterations to target, computation and communication, the last finite
  metrics (``final``);
- ``final_params.npz``: the averaged model after the last round (one array per state key);
- ``checkpoint``: with ``checkpoint_every``, the :class:`RunState` after every R-th round plus the length
  (lines, bytes, sha256) of ``metrics.jsonl`` at that moment and the fingerprint of the data, written
  atomically;
- ``.stlsgd.lock``: held (``flock``) by the process writing the run; it names that process's pid.

A directory holding a symbolic link anywhere inside is refused (:func:`stlsgd.files.refuse_links`), and files
are opened without following links, so a run never changes or creates a file outside its directory.

The lifecycle, in order: :meth:`RunDirectory.check` refuses a directory that holds another run and
:meth:`RunDirectory.restore` reads the checkpoint -- both write nothing, so a bad input leaves the directory
as it was; :meth:`RunDirectory.open` takes the lock, clears the debris of writes cut short, and starts the
files afresh or reopens them at the checkpoint; :meth:`RunDirectory.checkpoint` and
:meth:`RunDirectory.finish` write the rest. A resumed run whose checkpoint says it has ended never takes
another step: ``open`` returns its summary, completing the files if a kill came between the final
checkpoint and the summary.

Resuming cuts ``metrics.jsonl`` back to the recorded length (lines written after the checkpoint would
otherwise appear twice) and runs the plan on from the saved cursor. Plans, the sampler and the local steps
are deterministic functions of that state, so the resumed run ends bit-identical to an uninterrupted one;
only the ``wall_s`` fields, which measure time, differ.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stlsgd.errors import ConfigError, StlsgdError
from stlsgd.executors.checkpoint import TMP_PREFIX, TMP_SUFFIX, CheckpointError, load_checkpoint, save_checkpoint
from stlsgd.executors.simulator import RunState
from stlsgd.experiments.config import Experiment, dump_config, read_raw, validate
from stlsgd.experiments.records import RunSummary
from stlsgd.files import LockedError, dumps, lock_directory, open_nofollow, refuse_links, write_json_atomic
from stlsgd.problems.base import State

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
FINAL_PARAMS_FILE = "final_params.npz"
CHECKPOINT_FILE = "checkpoint"
LOCK_FILE = ".stlsgd.lock"
# Results whose presence means "a run lives here"; config.yaml says which one.
RESULT_FILES = (METRICS_FILE, SUMMARY_FILE, FINAL_PARAMS_FILE, CHECKPOINT_FILE)


class MetricsLog:
    """``metrics.jsonl``, appended one line per evaluation, with its length and sha256 kept for checkpoints."""

    def __init__(self, path: Path, *, lines: int = 0, size: int = 0, digest: Any = None) -> None:
        self.path = path
        self.lines = lines
        self.size = size
        self._sha = digest if digest is not None else hashlib.sha256()
        self._fh = open_nofollow(path, "r+b" if size else "wb")  # never through a link (stlsgd.files)
        self._fh.seek(size)
        self._fh.truncate()  # lines written after the checkpoint (or torn by a full disk) would else remain

    @classmethod
    def resume(cls, path: Path, *, lines: int, size: int, sha256: str) -> MetricsLog:
        """Reopen at a checkpoint's recorded length after checking the kept prefix is the one it recorded."""
        digest = hashlib.sha256()
        try:
            with open_nofollow(path, "rb") as fh:
                prefix = fh.read(size)
        except FileNotFoundError:
            prefix = b""
        digest.update(prefix)
        if len(prefix) != size or digest.hexdigest() != sha256 or prefix.count(b"\n") != lines:
            raise CheckpointError(
                f"{path}: does not start with the {lines} lines the checkpoint recorded; "
                "cannot resume exactly (rerun without --resume)"
            )
        return cls(path, lines=lines, size=size, digest=digest)

    def write(self, metrics: dict[str, Any]) -> None:
        data = (dumps(metrics) + "\n").encode()
        with _cannot_write(self.path, metrics.get("round")):
            self._fh.write(data)
            self._fh.flush()  # one line at a time, so `tail -f` and plots see progress
        self._sha.update(data)
        self.lines += 1
        self.size += len(data)

    def sync(self) -> None:
        """Make the lines a checkpoint is about to count durable first."""
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def position(self) -> dict[str, Any]:
        return {"metrics_lines": self.lines, "metrics_bytes": self.size, "metrics_sha256": self._sha.hexdigest()}

    def close(self) -> None:
        self._fh.close()


@dataclass
class Start:
    """What the lifecycle decided before the rounds: the state to run from (None: the run had ended, and
    ``summary`` is its summary) and the checkpoint period."""

    state: RunState | None
    checkpoint_every: int | None
    summary: dict[str, Any] | None = None


class RunDirectory:
    """One run's output directory (see the module docstring for the files and the order of the calls)."""

    def __init__(self, out: Path, exp: Experiment, *, keep_params: bool = True) -> None:
        self.out = Path(out)
        self.exp = exp
        self.keep_params = keep_params
        self.metrics: MetricsLog | None = None
        self.checkpoint_every: int | None = None
        self._lock: int | None = None
        self._fingerprint: str | None = None

    def path(self, name: str) -> Path:
        return self.out / name

    # ------------------------------------------------------------------ before anything is written

    def check(self, overwrite: bool) -> None:
        """Refuse to mix two runs in one directory, or a directory this process cannot write; writes nothing."""
        out = self.out
        if out.exists() and not out.is_dir():
            raise StlsgdError(f"{out}: exists and is not a directory; choose another --out")
        _check_writable(out)
        if out.is_dir():
            refuse_links(out)  # before anything is written: a link in a run directory is never written through
        if overwrite or not out.is_dir():
            return
        config_path = out / CONFIG_FILE
        if config_path.is_file():
            try:
                # Validated, so a config written by an older stlsgd (missing defaulted fields) still matches.
                same = validate(read_raw(config_path), str(config_path)).to_dict() == self.exp.to_dict()
            except StlsgdError:
                same = False
            if not same:
                raise StlsgdError(
                    f"{out}: already holds a different run ({config_path} differs); "
                    "choose another --out or pass --overwrite"
                )
        elif any((out / name).exists() for name in RESULT_FILES):
            raise StlsgdError(
                f"{out}: holds results without {CONFIG_FILE} (another run?); choose another --out or pass --overwrite"
            )

    def restore(self) -> tuple[RunState, dict[str, Any]] | None:
        """The checkpoint, checked to belong to this config; None means start afresh. Writes nothing."""
        path = self.out / CHECKPOINT_FILE
        if not path.is_file():
            return None
        state, meta = load_checkpoint(path)
        if meta.get("config") != self.exp.to_dict():
            raise CheckpointError(
                f"{path}: was written by a different config; choose another --out or pass --overwrite"
            )
        return state, meta

    @staticmethod
    def check_data(restored: tuple[RunState, dict[str, Any]] | None, fingerprint: str, path: Path) -> None:
        """A checkpoint resumes only on the data it was made on (same rows, labels and partition)."""
        if restored is not None and restored[1].get("data_fingerprint") != fingerprint:
            raise CheckpointError(
                f"{path}: was made on other data (the dataset file or its partition changed "
                "since); restore that data, or rerun without --resume"
            )

    # ------------------------------------------------------------------ writing

    def open(
        self,
        restored: tuple[RunState, dict[str, Any]] | None,
        fingerprint: str,
        fresh: Callable[[], RunState],
        checkpoint_every: int | None,
    ) -> Start:
        """Lock the directory and start its files: afresh, at the checkpoint, or not at all (ended before)."""
        out = self.out
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise StlsgdError(f"{out}: cannot create the output directory ({err.strerror or err})") from None
        self._take_lock()
        self._fingerprint = fingerprint
        self._clear_debris()
        if restored is None:
            for name in RESULT_FILES:  # the outputs of the run this one replaces (same config, or --overwrite)
                if name != METRICS_FILE:
                    (out / name).unlink(missing_ok=True)
            dump_config(self.exp, out / CONFIG_FILE)
            self.metrics = MetricsLog(out / METRICS_FILE)
            self.checkpoint_every = checkpoint_every
            return Start(fresh(), checkpoint_every)
        state, meta = restored
        self.checkpoint_every = checkpoint_every if checkpoint_every is not None else meta.get("checkpoint_every")
        if (
            state.status != "running"
            and (out / SUMMARY_FILE).is_file()
            and (not self.keep_params or (out / FINAL_PARAMS_FILE).is_file())
        ):
            return Start(None, self.checkpoint_every, summary=RunSummary.read(out / SUMMARY_FILE).to_json())
        self.metrics = MetricsLog.resume(
            out / METRICS_FILE, lines=meta["metrics_lines"], size=meta["metrics_bytes"], sha256=meta["metrics_sha256"]
        )
        return Start(state, self.checkpoint_every)

    def checkpoint(self, state: RunState) -> None:
        assert self.metrics is not None
        with _cannot_write(self.out / CHECKPOINT_FILE, state.round):
            self.metrics.sync()
            meta = {
                "config": self.exp.to_dict(),
                "checkpoint_every": self.checkpoint_every,
                "data_fingerprint": self._fingerprint,
                **self.metrics.position(),
            }
            save_checkpoint(self.out / CHECKPOINT_FILE, state, meta)

    def finish(self, state: RunState, summary: RunSummary) -> None:
        """The final checkpoint (so that --resume only completes the files, never reruns), the final
        parameters and the summary."""
        assert self.metrics is not None
        if self.checkpoint_every:
            self.checkpoint(state)
        else:
            with _cannot_write(self.metrics.path, state.round):
                self.metrics.sync()
        with _cannot_write(self.metrics.path, state.round):
            self.metrics.close()
        self.metrics = None
        with _cannot_write(self.out, state.round):
            if self.keep_params:
                write_final_params(self.out / FINAL_PARAMS_FILE, state.clients)
            write_json_atomic(self.out / SUMMARY_FILE, summary.to_json())

    def close(self) -> None:
        """Release the files and the lock (also after a failure, whose error is the one to report: a full disk
        that also refuses the last flush here says nothing new)."""
        if self.metrics is not None:
            with contextlib.suppress(OSError):
                self.metrics.close()
            self.metrics = None
        if self._lock is not None:
            os.close(self._lock)  # closing the descriptor releases the flock
            self._lock = None

    def __enter__(self) -> RunDirectory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _take_lock(self) -> None:
        try:
            self._lock = lock_directory(self.out, LOCK_FILE)
        except LockedError as err:
            raise StlsgdError(
                f"{self.out}: another stlsgd process (pid {err.holder}) is writing a run here; "
                "wait for it to end or choose another --out"
            ) from None

    def _clear_debris(self) -> None:
        """Temporary files left by a process killed in the middle of an atomic write."""
        for tmp in self.out.glob(f"{TMP_PREFIX}*{TMP_SUFFIX}"):
            tmp.unlink(missing_ok=True)
        for name in (SUMMARY_FILE, FINAL_PARAMS_FILE, CONFIG_FILE):
            for tmp in self.out.glob(f".{name}.*.tmp"):
                tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def _cannot_write(path: Path, round_: int | None) -> Iterator[None]:
    """A full or read-only disk while a run writes: one line naming the file, the round and how to go on."""
    try:
        yield
    except OSError as err:
        where = "" if round_ is None else f" after round {round_}"
        raise StlsgdError(
            f"{path}: cannot write ({err.strerror or err}); the run stopped{where}; free space (or "
            "choose a writable --out) and rerun with --resume to go on from its last checkpoint"
        ) from None


def _check_writable(out: Path) -> None:
    """The directory (or the nearest existing parent it would be made in) must be writable by this process."""
    probe = out
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.is_dir() and not os.access(probe, os.W_OK | os.X_OK):
        where = "" if probe == out else f" (cannot create it in {probe})"
        raise StlsgdError(f"{out}: not writable{where}; choose another --out")
    if probe.exists() and not probe.is_dir():
        raise StlsgdError(f"{out}: {probe} is not a directory; choose another --out")


def write_final_params(path: Path, clients: State) -> None:
    """The averaged model (client 0's row right after the last average) as one array per state key."""
    from stlsgd.files import atomic_write

    arrays = {
        key: (value[0] if isinstance(value, np.ndarray) else value[0].detach().cpu().numpy())
        for key, value in clients.items()
    }
    atomic_write(path, lambda fh: np.savez(fh, **arrays), mode="wb")


def check_checkpoint_every(every: int | None) -> None:
    if every is not None and every < 1:
        raise ConfigError(f"--checkpoint-every: must be >= 1 round, got {every}")
