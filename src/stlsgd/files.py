"""Files every part of stlsgd writes: atomic replacement, strict JSON, append-only JSON lines.

- :func:`atomic_write`: a temporary file in the same directory, fsync, rename, fsync of the directory.
  Readers (a resumed run, a sweep reading results, a user) never see half a file, and a crash leaves either
  the old file or the new one.
- Strict JSON: no ``NaN``/``Infinity`` (which strict readers reject); a non-finite float is written as null.
- JSON lines (``metrics.jsonl``, ``results.jsonl``): appended and fsynced one record at a time. A last line
  torn by a crash or a full disk is detected on the next read or append, warned about and cut off, never
  glued onto the next record.
- Symbolic links: nothing is written through one. An output directory holding a link anywhere inside is
  refused when it is locked (:func:`lock_directory`, :func:`refuse_links`), and every file written in place
  is opened with ``O_NOFOLLOW`` (:func:`open_nofollow`), so a link that appears later makes the write fail
  (``ELOOP``) instead of changing a file elsewhere. Atomic writes create a fresh temporary file
  (``O_EXCL``) and ``os.replace`` it, which replaces a link itself, never its target.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from stlsgd.errors import StlsgdError

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Where stlsgd keeps what it computed or parsed once (the exact optimum f* per dataset and lambda, parsed
    datasets): $STLSGD_CACHE, else the per-user cache dir."""
    env = os.environ.get("STLSGD_CACHE")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("stlsgd"))


def atomic_write(
    path: Path, write: Callable[[Any], None], *, mode: str = "w", prefix: str | None = None, suffix: str = ".tmp"
) -> None:
    """Call ``write(file)`` on a temporary file next to ``path``, then move it into place durably."""
    path = Path(path)
    with naming(path):
        fd, tmp = tempfile.mkstemp(prefix=prefix or f".{path.name}.", suffix=suffix, dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600 files; results are shared like any other file
        with os.fdopen(fd, mode) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(err.errno, err.strerror, str(path)) from None  # the file the user knows, not the temporary
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


@contextlib.contextmanager
def naming(path: Path) -> Iterator[None]:
    """An OSError without a file name (a full disk met inside a library) gets ``path``'s."""
    try:
        yield
    except OSError as err:
        if err.filename is None:
            raise OSError(err.errno, err.strerror, str(path)) from None
        raise


def current_umask() -> int:
    """The process umask (read without changing it for good)."""
    return _umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


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


def finite(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by None (strict JSON has no NaN or Infinity)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """Strict JSON text of ``obj`` (non-finite floats as null)."""
    return json.dumps(finite(obj), allow_nan=False, **kwargs)


def write_json_atomic(path: Path, obj: Any) -> None:
    atomic_write(path, lambda fh: fh.write(dumps(obj, indent=2) + "\n"))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (none if it is missing); a torn last line is skipped with a warning."""
    return [record for _, record in read_jsonl_numbered(path)]


def read_jsonl_numbered(path: Path) -> list[tuple[int, Any]]:
    """(line number, record) of a JSON-lines file, as :func:`read_jsonl` reads it (for errors naming the line)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    records = []
    lines = data.split(b"\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append((number, json.loads(line)))
        except (json.JSONDecodeError, UnicodeDecodeError):
            last = number == len(lines) or (number == len(lines) - 1 and not lines[-1])
            what = "a last line cut short (a crash or a full disk?)" if last else "a malformed line"
            log.warning("%s:%d: skipping %s", path, number, what)
    return records


class LinkError(StlsgdError):
    """An output directory holds a symbolic link (stlsgd never writes through one)."""

    def __init__(self, link: Path, directory: Path) -> None:
        super().__init__(
            f"{link}: is a symbolic link inside the output directory {directory}; stlsgd never writes through "
            "links (it would change a file elsewhere): remove the link or choose another --out"
        )
        self.link = link


def find_link(directory: Path) -> Path | None:
    """The first symbolic link found inside ``directory`` (walked without following links), or None.

    ``directory`` itself may be a link (an ``--out`` pointing at scratch space is the user's choice); a
    missing directory holds none.
    """
    stack = [Path(directory)]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.is_symlink():
                return Path(entry.path)
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
    return None


def refuse_links(directory: Path) -> None:
    """Raise :class:`LinkError` (one line naming the link) when ``directory`` holds a symbolic link."""
    link = find_link(directory)
    if link is not None:
        raise LinkError(link, Path(directory))


def open_nofollow(path: Path, mode: str) -> Any:
    """``open(path, mode)`` for binary modes ``wb``, ``ab+``, ``r+b`` and ``rb``, refusing a symbolic link at
    ``path`` (``OSError`` ``ELOOP``) instead of writing or reading through it."""
    flags = {
        "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
        "ab+": os.O_RDWR | os.O_CREAT | os.O_APPEND,
        "r+b": os.O_RDWR,
        "rb": os.O_RDONLY,
    }[mode]
    return os.fdopen(_open_nofollow_fd(path, flags), mode)


def _open_nofollow_fd(path: Path, flags: int) -> int:
    """``os.open`` that refuses a symbolic link at ``path`` (ELOOP): every file stlsgd writes in place."""
    return os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o666)


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one record durably; a torn last line left by an earlier crash is cut off first."""
    path = Path(path)
    data = (dumps(record) + "\n").encode()
    with naming(path), open_nofollow(path, "ab+") as fh:
        repair_tail(fh, path)
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def repair_tail(fh: Any, path: Path) -> None:
    """Cut a binary file opened for append (``ab+``) back to its last complete line."""
    end = fh.seek(0, os.SEEK_END)
    if end == 0:
        return
    fh.seek(end - 1)
    if fh.read(1) == b"\n":
        return
    # Find the start of the torn line: read backwards in blocks until a newline.
    pos = end
    while pos > 0:
        step = min(65536, pos)
        fh.seek(pos - step)
        block = fh.read(step)
        cut = block.rfind(b"\n")
        if cut >= 0:
            pos = pos - step + cut + 1
            break
        pos -= step
    fh.truncate(pos)
    log.warning("%s: removed a last line cut short by an earlier crash or full disk", path)


class LockedError(OSError):
    """Another process holds the lock; ``holder`` is the pid it wrote, or "?"."""

    def __init__(self, path: Path, holder: str) -> None:
        super().__init__(errno.EWOULDBLOCK, "locked", str(path))
        self.holder = holder


def lock_directory(directory: Path, name: str = ".stlsgd.lock") -> int:
    """Take an exclusive ``flock`` on ``directory/name`` without waiting and write this process's pid in it.

    Returns the descriptor: closing it (or the process ending, however it ends) releases the lock. The file
    stays, so that two processes never lock two different files of the same name. Raises
    :class:`LockedError` while another process holds it, and :class:`LinkError` when the directory holds a
    symbolic link (the lock file included): whoever locks a directory writes into it, and never through a link.
    """
    refuse_links(directory)
    path = Path(directory) / name
    fd = _open_nofollow_fd(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise LockedError(path, holder) from None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
