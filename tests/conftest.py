"""Shared fixtures, and the ``launch`` mark for the test modules of other owners that start ranks."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Under pytest-xdist each worker, and every process its tests launch (they inherit the environment), computes on
# its share of the cores: numba's and OpenMP's threads of one test competing with another worker's only burn CPU
# (the a9a acceptance run takes 13 s of CPU on one thread, 20 s on two while the other core is busy). Set before
# numba or torch is imported (by stlsgd below, or by a test module), which read these once.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _share = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ.setdefault(_var, _share)

from stlsgd.data import load_dataset  # noqa: E402
from stlsgd.problems.logistic import LogisticRegression  # noqa: E402

# Modules that launch torchrun ranks or a framework's own ranks; the modules of tests/distributed/,
# tests/reliability/test_sweep_kill.py and tests/benchmarks/ carry the mark themselves (pytestmark).
LAUNCHING = {"test_dropin.py", "test_lightning.py", "test_accelerate.py"}

# Fixtures made once per module (or session) that launch processes or run a sweep. Under pytest-xdist (`-n`,
# `--dist loadgroup`, pyproject.toml's addopts) the tests using one go to one worker, or every worker would make
# it again: the simulator-vs-distributed comparisons (one launch of ranks per world size) as one group, the
# others by module.
SHARED = {"dist_runs", "ddp_fits", "cluster", "local_best", "swept", "finished_sweep"}


def pytest_sessionstart(session: pytest.Session) -> None:
    """On the controller of a run on several workers, before they start: fill numba's cache (tests/warm_numba.py)
    in one process, so the workers and the processes they launch load the kernels instead of all compiling them."""
    if "PYTEST_XDIST_WORKER" not in os.environ and (getattr(session.config.option, "numprocesses", None) or 0) > 1:
        subprocess.run([sys.executable, str(Path(__file__).with_name("warm_numba.py"))], check=True)


# tryfirst: xdist's own hook (registered after this file is loaded, so called before it otherwise) turns the
# xdist_group marks into the node ids its scheduler groups by; a mark added after it would change nothing.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in LAUNCHING:
            item.add_marker(pytest.mark.launch)
        shared = SHARED.intersection(getattr(item, "fixturenames", ()))
        if shared:
            item.add_marker(pytest.mark.xdist_group("torchrun" if "dist_runs" in shared else item.path.stem))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The offline dataset copies in ../shared/data (see its README.md); required, never skipped."""
    path = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    assert path.is_dir(), f"{path}: shared data folder missing"
    return path


@pytest.fixture(scope="session")
def private_cache(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Path:
    """A cache dir of this test session, for the tests that must neither read nor write the user's (f*, parsed
    data), holding the parsed a9a and digits already: the processes they launch read them instead of each
    parsing."""
    cache = tmp_path_factory.getbasetemp() / "stlsgd-cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STLSGD_CACHE", str(cache))
        load_dataset("a9a", shared_data)
        load_dataset("digits49")
    return cache


@pytest.fixture(scope="module")
def digits():
    """The digits 4-vs-9 set bundled with scikit-learn and its logistic problem (Eq. 8), built once per module."""
    ds = load_dataset("digits49")
    return ds, LogisticRegression(ds.X, ds.y)
