"""Shared fixtures."""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The offline dataset copies in ../shared/data (see its README.md); required, never skipped."""
    path = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    assert path.is_dir(), f"{path}: shared data folder missing"
    return path
