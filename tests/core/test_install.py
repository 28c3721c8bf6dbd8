"""``pip install -e .`` into an environment that already has another supported torch keeps that torch: the
package states a range (pyproject.toml); the exact versions CI and the README install are in constraints.txt.

A throwaway venv gets a torch 2.14.1 that is metadata only (a dist-info folder, as pip records an installed
distribution); pip then resolves the package against it (``--dry-run --report``: nothing is installed, nothing
is built but the package's own metadata). The rest of the dependencies come from the package index of pip's
configuration, so the test reads the index; a machine-wide constraints file is switched off, since it is
exactly what a user's environment does not have.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.network


def _fake_installed(site_packages: Path, name: str, version: str) -> None:
    info = site_packages / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text(f"{info.name}/METADATA,,\n{info.name}/INSTALLER,,\n{info.name}/RECORD,,\n")


def test_an_editable_install_keeps_the_torch_already_there(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    # No pip of its own (ensurepip takes most of a venv's creation): this interpreter's pip installs into it.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    _fake_installed(Path(purelib), "torch", "2.14.1")
    report = tmp_path / "report.json"
    env = {**os.environ, "PIP_CONSTRAINT": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--dry-run", "--report", report, "-e", REPO],
        capture_output=True,
        text=True,
        env=env,
        timeout=420,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    install = {
        item["metadata"]["name"].lower(): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert "stlsgd" in install and "numpy" in install  # the resolution did run against this bare venv
    assert "torch" not in install, install
    assert sysconfig.get_paths()["purelib"] != purelib  # the throwaway venv, not this one
