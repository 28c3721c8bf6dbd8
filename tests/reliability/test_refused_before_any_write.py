"""Bad input is refused with one line before anything is written: a bad rerun over a finished run leaves it as
it was, a failed start creates nothing, and configs (values, datasets, sweep seeds, names, YAML keys) are
checked up front."""

from __future__ import annotations

from pathlib import Path

import pytest
from base_run import base_config, run_files
from test_bad_input import assert_one_line_error

from stlsgd.experiments.config import load_config


@pytest.mark.parametrize(
    "override",
    [
        "run.seed=-1",
        "data.partition_seed=-3",
        "algorithm.k=1e999",
        "algorithm.k=99999999999999999999999",
        "algorithm.lr=inf",
        "run.max_rounds=true",
        "data.dataset=nonexistent.svm",
        "problem.kind=net",
    ],
)
def test_a_bad_rerun_with_overwrite_leaves_the_finished_run_as_it_was(tmp_path: Path, cli, override: str) -> None:
    config = base_config(tmp_path)
    out = tmp_path / "run"
    assert cli("run", config, "--out", out, "--quiet")[0] == 0
    before = run_files(out)
    assert_one_line_error(cli("run", config, "--out", out, "--quiet", "--overwrite", "--set", override))
    assert run_files(out) == before


def test_a_failed_start_creates_nothing_and_the_corrected_rerun_is_not_refused(tmp_path: Path, cli) -> None:
    config = base_config(tmp_path)
    out = tmp_path / "new" / "run"
    assert_one_line_error(cli("run", config, "--out", out, "--set", "data.dataset=missing.svm"), "missing.svm")
    assert not (tmp_path / "new").exists()
    assert cli("run", config, "--out", out, "--quiet")[0] == 0


def test_logistic_regression_on_an_image_dataset_is_one_line(tmp_path: Path, cli, shared_data: Path) -> None:
    config = base_config(tmp_path, dataset="cifar10-png200")
    assert_one_line_error(
        cli("run", config, "--out", tmp_path / "o", "--data-dir", shared_data),
        "problem.kind: logistic regression needs a two-class svmlight dataset",
    )
    assert not (tmp_path / "o").exists()


def test_a_sweep_with_a_negative_or_repeated_seed_is_refused_before_it_starts(tmp_path: Path, cli) -> None:
    for seeds, why in (
        ("[0, -1]", "seeds.1: Input should be greater than or equal to 0"),
        ("[0, 1, 1]", "seeds: seed 1 is listed twice"),
    ):
        sweep = tmp_path / "s.toml"
        sweep.write_text(
            f'name = "s"\nseeds = {seeds}\n[base.data]\ndataset = "digits49"\nnum_clients = 4\n'
            '[[methods]]\nmethod = "sync_sgd"\ngrid = { lr = [0.5] }\n'
        )
        assert_one_line_error(cli("sweep", sweep, "--out", tmp_path / "o", "--jobs", "1"), why)
        assert not (tmp_path / "o").exists()


def test_duplicate_yaml_keys_and_a_byte_order_mark(tmp_path: Path, cli) -> None:
    dup = tmp_path / "c.yaml"
    dup.write_text("algorithm:\n  method: sync_sgd\n  lr: 1\n  lr: 2\n")
    assert_one_line_error(cli("run", dup, "--out", tmp_path / "o"), f"{dup}:4: invalid YAML (duplicate key 'lr')")
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbf" + base_config(tmp_path).read_bytes())
    assert load_config(bom).algorithm.lr == 0.5


def test_a_name_cannot_leave_runs(tmp_path: Path, cli) -> None:
    config = base_config(tmp_path)
    for name in ("../../x", "/etc/x", "a/../../b", ""):
        assert_one_line_error(cli("run", config, "--set", f'name="{name}"'), "name: must be a relative name")
