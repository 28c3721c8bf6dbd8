"""Helpers of the adapter tests: launched ranks on loopback (tests/launch.py), their JSON results."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from launch import PYTHON, REPO, TORCHRUN, free_port, launch_env  # noqa: F401  (re-exported to the tests)

HERE = Path(__file__).resolve().parent


def run(cmd: list[str | Path], timeout: float = 240, **env: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(c) for c in cmd], cwd=REPO, env=launch_env(**env), capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-4000:])
    return result


def torchrun(script: Path, *args: str | Path, nproc: int = 2) -> subprocess.CompletedProcess[str]:
    return run(
        [
            TORCHRUN,
            f"--nproc_per_node={nproc}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}",
            script,
            *args,
        ]
    )


def ranks(out: Path, world: int = 2) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
