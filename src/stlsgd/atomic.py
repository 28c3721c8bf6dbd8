"""Atomic file writes: a temporary file in the same directory, fsync, rename, fsync of the directory.

Readers (a resumed run, a sweep reading results, a user) never see half a file, and a crash leaves either
the old file or the new one.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def atomic_write(path: Path, write: Callable[[Any], None], *, mode: str = "w", prefix: str | None = None,
                 suffix: str = ".tmp") -> None:
    """Call ``write(file)`` on a temporary file next to ``path``, then move it into place durably."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=prefix or f".{path.name}.", suffix=suffix, dir=path.parent)
    try:
        with os.fdopen(fd, mode) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    # The rename is only durable once the directory entry is on disk (POSIX); not all systems allow it.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
