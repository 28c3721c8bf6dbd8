"""``pip install -e .`` into an environment that already has another supported torch keeps that torch: the
package states a range (pyproject.toml); the exact versions CI and the README install are in constraints.txt.

The user's environment is a throwaway venv that sees this environment's packages (a ``.pth`` line) but has a
torch 2.14.1 of its own, metadata only (a dist-info folder, as pip records an installed distribution), ahead of
ours on its path. pip resolves the package against it (``--dry-run --report``: nothing is installed, nothing is
built but the package's own metadata) with no index: every other requirement is already there, as in the
environment a model trains in. An exact torch pin would have pip install a torch here (the test was checked so);
a machine-wide constraints file is switched off, since it is exactly what a user's environment does not have.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


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
    # Loaded after the venv's own site-packages, so its torch 2.14.1 is the one pip and Python find.
    (Path(purelib) / "zz_the_rest.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    report = tmp_path / "report.json"
    env = {**os.environ, "PIP_CONSTRAINT": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--dry-run", "--no-index", "--no-build-isolation"]
        + ["--report", report, "-e", REPO],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    seen = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('torch'))"], capture_output=True, text=True
    )
    assert seen.stdout.strip() == "2.14.1"  # the environment pip resolved against has the other torch
    install = {
        item["metadata"]["name"].lower(): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert install == {"stlsgd": version}, install  # the package, and no torch (nor anything else) replaced
    assert "numpy" in result.stdout  # the resolution did walk the package's requirements
    assert sysconfig.get_paths()["purelib"] != purelib  # the throwaway venv, not this one
