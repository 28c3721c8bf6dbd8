"""The product's one error type: every user mistake becomes a one-line message and exit status 2."""

from __future__ import annotations


class StlsgdError(Exception):
    """A problem the user can fix (bad file, bad config, missing data).

    The CLI prints ``str(err)`` on one line and exits with status 2; the message must name the file and
    line, or the config field, that is wrong.
    """


class ConfigError(StlsgdError):
    """An invalid configuration; the message starts with the dotted field name."""


class DataError(StlsgdError):
    """An unreadable, corrupt or missing data file; the message names the file (and line where known)."""


def brief(exc: BaseException, limit: int = 240) -> str:
    """An exception's message for a one-line error: its first line, shortened at a sentence or word end."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0].strip()
    if len(text) <= limit:
        return text
    cut = text.rfind(". ", 0, limit)
    if cut > limit // 3:
        return text[: cut + 1]
    return text[: text.rfind(" ", 0, limit)].rstrip(",;:") + " ..."
