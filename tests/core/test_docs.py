"""The README's methods table is the registry's: adding a method shows up in the docs or fails here; CI runs the
README's test command; no tracked file names a path of the machine it was written on."""

import re
import subprocess
from pathlib import Path

from stlsgd.algorithms.registry import REGISTRY, methods_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_lists_every_registered_method_with_its_fields() -> None:
    text = README.read_text()
    assert methods_table() in text, "README's Methods table differs from `stlsgd methods`: paste its output"
    assert len(REGISTRY) >= 10 and {"stl_sc", "stl_nc", "local_sgd", "lr_coupled", "qsr"} <= set(REGISTRY)


def test_ci_runs_the_readmes_test_command_as_written() -> None:
    """CI must run what a user runs: .ci/run is the README's second command, character for character, and
    nothing else (no directory change, no shell options that a user's shell lacks, not even a comment)."""
    fence = README.read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    test_command = fence.strip().splitlines()[1]
    ci_run = (README.parent / ".ci" / "run").read_text()
    assert ci_run == f"#!/usr/bin/env bash\n{test_command}\n", ci_run  # the shebang and that line: nothing else
    # and the line itself runs the tools, not a script of ours that a reader would have to open to know what runs
    assert ".ci/" not in test_command and "pytest" in test_command and "mypy" in test_command, test_command


def test_no_tracked_file_names_a_path_of_the_machine_it_was_made_on() -> None:
    """A user's checkout lives elsewhere: records, docs and configs name ../shared/data, $STLSGD_DATA,
    configs/... or a placeholder, never this machine's /tmp, /work, /root or /home."""
    root = README.parent
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    machine = re.compile(r"(?<![\w.$~-])/(tmp|work|root|home)/")
    found = []
    for name in tracked.decode().split("\0"):
        path = root / name
        if not name or not path.is_file() or path.suffix in {".png", ".npz", ".whl"}:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if machine.search(line):
                found.append(f"{name}:{number}: {line.strip()[:100]}")
    assert not found, "\n".join(found)
