"""Fixtures of the reliability tests: a private f* cache and the CLI run in-process."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from stlsgd.cli import main


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # f* is cached on disk; tests must neither read nor write the user's cache.
    monkeypatch.setenv("STLSGD_CACHE", str(tmp_path_factory.getbasetemp() / "stlsgd-cache"))


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
