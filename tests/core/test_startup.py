"""A NumPy run starts without torch: the logistic problem on the simulator (``stlsgd run``, a sweep's workers)
never imports it, which saves seconds of every run's start-up; torch comes in with a network problem, a
process group or a checkpoint."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from launch import launch_env


def _modules_after(code: str) -> list[str]:
    probe = code + "\nprint(sorted(m for m in ('torch', 'torch.distributed') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], env=launch_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return eval(out.stdout.strip().splitlines()[-1])


def test_a_logistic_run_on_the_simulator_never_imports_torch(tmp_path: Path, shared_data: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        '[data]\ndataset = "digits49"\nnum_clients = 4\n[algorithm]\nmethod = "stl_sc"\nlr = 0.5\nk = 5\n'
        "drift = true\n[run]\nmax_rounds = 12\neval_every = 3\n"
    )
    run = f"from stlsgd.cli import main\nimport sys\nassert main(['run', {str(config)!r}, '--out', {str(tmp_path / 'r')!r}, '--quiet', '--data-dir', {str(shared_data)!r}]) == 0"
    assert _modules_after(run) == []
    assert (tmp_path / "r" / "summary.json").is_file()


def test_a_checkpointing_run_brings_torch_in_where_it_saves(tmp_path: Path, shared_data: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        '[data]\ndataset = "digits49"\nnum_clients = 4\n[algorithm]\nmethod = "local_sgd"\nlr = 0.5\nk = 5\n'
        "[run]\nmax_rounds = 6\n"
    )
    out = tmp_path / "r"
    run = f"from stlsgd.cli import main\nimport sys\nassert main(['run', {str(config)!r}, '--out', {str(out)!r}, '--quiet', '--checkpoint-every', '2', '--data-dir', {str(shared_data)!r}]) == 0"
    assert "torch" in _modules_after(run)
    assert (out / "checkpoint").exists()
