"""Shared fixtures, and the ``launch`` mark for the test modules of other owners that start ranks."""

from pathlib import Path

import pytest

from stlsgd.data import load_dataset
from stlsgd.problems.logistic import LogisticRegression

# Modules that launch torchrun ranks or a framework's own ranks; the modules of tests/distributed/,
# tests/reliability/test_sweep_kill.py and tests/benchmarks/ carry the mark themselves (pytestmark).
LAUNCHING = {"test_dropin.py", "test_lightning.py", "test_accelerate.py"}


# tryfirst: xdist's own hook (registered after this file is loaded, so called before it otherwise) turns the
# xdist_group marks into the node ids its scheduler groups by; a mark added after it would change nothing.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in LAUNCHING:
            item.add_marker(pytest.mark.launch)
        # The simulator-vs-torchrun comparisons share one torchrun launch per world size (a session fixture):
        # under pytest-xdist (`-n`, `--dist loadgroup`, as .ci/checks runs) they all go to one worker, which
        # launches each world size once.
        if "dist_runs" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("torchrun"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The offline dataset copies in ../shared/data (see its README.md); required, never skipped."""
    path = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    assert path.is_dir(), f"{path}: shared data folder missing"
    return path


@pytest.fixture(scope="module")
def digits():
    """The digits 4-vs-9 set bundled with scikit-learn and its logistic problem (Eq. 8), built once per module."""
    ds = load_dataset("digits49")
    return ds, LogisticRegression(ds.X, ds.y)
