"""The README's methods table is the registry's: adding a method shows up in the docs or fails here."""

from pathlib import Path

from stlsgd.algorithms.registry import REGISTRY, methods_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_lists_every_registered_method_with_its_fields() -> None:
    text = README.read_text()
    assert methods_table() in text, "README's Methods table differs from `stlsgd methods`: paste its output"
    assert len(REGISTRY) >= 10 and {"stl_sc", "stl_nc", "local_sgd", "lr_coupled", "qsr"} <= set(REGISTRY)


def test_ci_runs_the_readmes_test_command_as_written() -> None:
    """CI must run what a user runs: .ci/run is the README's second command, character for character, and
    nothing else (no directory change, no shell options that a user's shell lacks)."""
    fence = README.read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    test_command = fence.strip().splitlines()[1]
    ci_run = (README.parent / ".ci" / "run").read_text().strip().splitlines()
    assert ci_run[0] == "#!/usr/bin/env bash"
    commands = [line for line in ci_run[1:] if line.strip() and not line.lstrip().startswith("#")]
    assert commands == [test_command], commands
