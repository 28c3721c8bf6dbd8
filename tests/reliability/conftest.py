"""Fixtures of the reliability tests: a private f* cache and the CLI run in-process."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from stlsgd.cli import main


@pytest.fixture(autouse=True)
def _private_cache(private_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STLSGD_CACHE", str(private_cache))


CliResult = tuple[int, str, str]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """Run ``stlsgd ARGS`` in this process: (exit status, stdout, stderr)."""

    def invoke(*args: str | Path) -> CliResult:
        capsys.readouterr()
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return invoke
