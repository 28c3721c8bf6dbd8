"""One writer per directory: a second run or sweep into a directory another process holds is refused, naming
the holder's pid, and leaves it as it was."""

from __future__ import annotations

import os
from pathlib import Path

from base_run import SWEEP, base_config, run_files
from test_bad_input import assert_one_line_error

from stlsgd.experiments.rundir import LOCK_FILE
from stlsgd.files import lock_directory


def test_a_second_writer_is_refused_with_the_holders_pid(tmp_path: Path, cli) -> None:
    config = base_config(tmp_path)
    out = tmp_path / "run"
    assert cli("run", config, "--out", out, "--quiet")[0] == 0
    before = run_files(out)
    fd = lock_directory(out)  # as a run that is going would hold it
    try:
        assert_one_line_error(
            cli("run", config, "--out", out, "--quiet", "--overwrite"),
            f"another stlsgd process (pid {os.getpid()}) is writing a run here",
        )
    finally:
        os.close(fd)
    assert run_files(out) == before
    assert cli("run", config, "--out", out, "--quiet", "--overwrite")[0] == 0  # free again once released


def test_a_second_sweep_into_the_same_directory_is_refused(tmp_path: Path, cli) -> None:
    sweep = tmp_path / "s.toml"
    sweep.write_text(SWEEP)
    out = tmp_path / "o"
    out.mkdir()
    fd = lock_directory(out)
    try:
        assert_one_line_error(cli("sweep", sweep, "--out", out, "--jobs", "1"), "another stlsgd sweep (pid")
    finally:
        os.close(fd)
    assert list(out.iterdir()) == [out / LOCK_FILE]
