"""Bad input through the CLI, end to end: one line naming the file (and line) or the config field, exit status 2,
no traceback unless --debug, and no output written or overwritten."""

from __future__ import annotations

import bz2
import gzip
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from stlsgd.cli import main
from stlsgd.errors import DataError

TINY = """\
name: tiny
data: {dataset: digits49, num_clients: 4}
algorithm: {method: sync_sgd, lr: 0.5}
run: {target_gap: null, max_rounds: 3}
"""


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


def assert_one_line_error(result: tuple[int, str, str], *needles: str | Path) -> str:
    code, _, err = result
    assert code == 2, err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("stlsgd: error: ") and "Traceback" not in err
    for needle in needles:
        assert str(needle) in err, (needle, err)
    return err


# --------------------------------------------------------------------------- the files behind each case


def _svm(tmp: Path, name: str, text: str | bytes) -> Path:
    path = tmp / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def _a9a_dir(tmp: Path, gz_bytes: bytes) -> Path:
    (tmp / "dd" / "a9a").mkdir(parents=True)
    (tmp / "dd" / "a9a" / "a9a.gz").write_bytes(gz_bytes)
    return tmp / "dd"


def _idx(magic: bytes, dims: tuple[int, ...], payload: bytes) -> bytes:
    return magic + b"".join(d.to_bytes(4, "big") for d in dims) + payload


def _mnist_dir(tmp: Path, images: bytes, labels: bytes) -> Path:
    (tmp / "dd" / "mnist").mkdir(parents=True)
    (tmp / "dd" / "mnist" / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(images))
    (tmp / "dd" / "mnist" / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(labels))
    return tmp / "dd"


IMAGES_OK = _idx(b"\x00\x00\x08\x03", (3, 28, 28), bytes(3 * 784))


def case_malformed_line(tmp: Path, shared: Path) -> tuple[list[str], list[str]]:
    p = _svm(tmp, "bad.svm", "+1 1:0.5 3:1\n-1 2:1\n+1 1:1 2:x\n-1 3:2\n")
    return ["--set", f"data.dataset={p}"], [f"{p}:3:", "malformed svmlight line", "2:x"]


def case_non_finite_value(tmp: Path, shared: Path) -> tuple[list[str], list[str]]:
    p = _svm(tmp, "nan.svm", "+1 1:0.5\n-1 2:1\n-1 2:nan\n")
    return ["--set", f"data.dataset={p}"], [f"{p}:3:", "non-finite"]


def case_three_labels(tmp: Path, shared: Path) -> tuple[list[str], list[str]]:
    p = _svm(tmp, "three.svm", "1 1:1\n2 2:1\n3 3:1\n1 2:1\n")
    return ["--set", f"data.dataset={p}"], [str(p), "expected 2 label values, found 3"]


def case_one_label(tmp: Path, shared: Path) -> tuple[list[str], list[str]]:
    p = _svm(tmp, "one.svm", "+1 1:1\n+1 2:1\n+1 3:1\n+1 1:2\n")
    return ["--set", f"data.dataset={p}"], [str(p), "expected 2 label values, found 1"]


def case_index_beyond_dimension(tmp: Path, shared: Path) -> tuple[list[str], list[str]]:
    dd = _a9a_dir(tmp, gzip.compress(b"+1 1:1 5:1\n-1 3:1 200:1\n"))  # a9a declares 123 features
    return ["--set", "data.dataset=a9a", "--data-dir", str(dd)], [
        "a9a.gz:2:",
        "feature index 200 exceeds n_features=123",
    ]


def case_truncated_gz(tmp: Path, shared: Path) -> tuple[list[str], list[str]]:
    dd = _a9a_dir(tmp, (shared / "a9a" / "a9a.gz").read_bytes()[:20_000])
    return ["--set", "data.dataset=a9a", "--data-dir", str(dd)], [dd / "a9a" / "a9a.gz", "corrupt or truncated gzip"]


def case_corrupt_gz(tmp: Path, shared: Path) -> tuple[list[str], list[str]]:
    data = bytearray((shared / "a9a" / "a9a.gz").read_bytes())
    data[-6] ^= 0xFF  # inside the CRC/size trailer: every byte decompresses, the check fails
    dd = _a9a_dir(tmp, bytes(data))
    return ["--set", "data.dataset=a9a", "--data-dir", str(dd)], [dd / "a9a" / "a9a.gz", "corrupt or truncated gzip"]


def case_corrupt_bz2(tmp: Path, shared: Path) -> tuple[list[str], list[str]]:
    data = bytearray(bz2.compress(b"+1 1:1\n-1 2:1\n" * 50))
    data[20] ^= 0xFF
    p = _svm(tmp, "data.svm.bz2", bytes(data))
    return ["--set", f"data.dataset={p}"], [str(p), "corrupt or truncated bz2"]


def case_idx_wrong_magic(tmp: Path, shared: Path) -> tuple[list[str], list[str]]:
    labels = _idx(b"\x00\x00\x08\x01", (3,), bytes([4, 9, 4]))
    dd = _mnist_dir(tmp, b"\x12\x34" + IMAGES_OK[2:], labels)
    return (
        ["--set", "data.dataset=mnist49", "--data-dir", str(dd)],
        [dd / "mnist" / "train-images-idx3-ubyte.gz", "not an idx file (bad magic 12340803)"],
    )


def case_idx_wrong_size(tmp: Path, shared: Path) -> tuple[list[str], list[str]]:
    labels = _idx(b"\x00\x00\x08\x01", (3,), bytes([4, 9]))  # 3 declared, 2 present
    dd = _mnist_dir(tmp, IMAGES_OK, labels)
    return (
        ["--set", "data.dataset=mnist49", "--data-dir", str(dd)],
        [dd / "mnist" / "train-labels-idx1-ubyte.gz", "idx payload is 2 bytes, expected 3"],
    )


def case_missing_registered_file(tmp: Path, shared: Path) -> tuple[list[str], list[str]]:
    (tmp / "empty").mkdir()
    return (
        ["--set", "data.dataset=a9a", "--data-dir", str(tmp / "empty")],
        [tmp / "empty" / "a9a" / "a9a.gz", f"not found; run: stlsgd data fetch a9a --data-dir {tmp / 'empty'}"],
    )


def case_missing_user_file(tmp: Path, shared: Path) -> tuple[list[str], list[str]]:
    return ["--set", f"data.dataset={tmp / 'nope.svm'}"], [tmp / "nope.svm", "not found"]


def case_unknown_dataset(tmp: Path, shared: Path) -> tuple[list[str], list[str]]:
    return ["--set", "data.dataset=a9b"], ["unknown dataset 'a9b'", "a9a"]


def case_more_clients_than_samples(tmp: Path, shared: Path) -> tuple[list[str], list[str]]:
    return ["--set", "data.num_clients=400"], ["data.num_clients", "more clients (400) than samples (361)"]


def case_partition_leaves_client_empty(tmp: Path, shared: Path) -> tuple[list[str], list[str]]:
    return (
        ["--set", "data.partition=dirichlet", "--set", "data.alpha=0.01", "--set", "data.num_clients=100"],
        ["data.partition", "leaves client", "with no rows"],
    )


def case_unknown_key_in_file(tmp: Path, shared: Path) -> tuple[list[str], list[str]]:
    p = tmp / "typo.yaml"
    p.write_text(TINY.replace("lr: 0.5", "lr: 0.5, learning_rate: 0.5"))
    return ["--config-path", str(p)], [p, "algorithm.learning_rate: unknown field"]


def case_unknown_section(tmp: Path, shared: Path) -> tuple[list[str], list[str]]:
    return ["--set", "optimiser.lr=1"], ["optimiser: unknown field"]


def case_wrong_type(tmp: Path, shared: Path) -> tuple[list[str], list[str]]:
    return ["--set", "algorithm.lr=fast"], ["algorithm.lr:", "valid number"]


def case_fractional_clients(tmp: Path, shared: Path) -> tuple[list[str], list[str]]:
    return ["--set", "data.num_clients=2.5"], ["data.num_clients:", "valid integer"]


def _field(key: str, value: str, field: str, *extra: str) -> Callable[[Path, Path], tuple[list[str], list[str]]]:
    def case(tmp: Path, shared: Path) -> tuple[list[str], list[str]]:
        return ["--set", f"{key}={value}", *extra], [f"{field}:"]

    return case


def case_bad_set_syntax(tmp: Path, shared: Path) -> tuple[list[str], list[str]]:
    return ["--set", "algorithm.lr"], ["--set: expected key=value"]


def case_missing_config(tmp: Path, shared: Path) -> tuple[list[str], list[str]]:
    return ["--config-path", str(tmp / "none.toml")], [tmp / "none.toml", "config file not found"]


def case_checkpoint_every_zero(tmp: Path, shared: Path) -> tuple[list[str], list[str]]:
    return ["--checkpoint-every", "0"], ["--checkpoint-every: must be >= 1"]


def case_out_is_a_file(tmp: Path, shared: Path) -> tuple[list[str], list[str]]:
    (tmp / "file").write_text("x")
    return ["--out-path", str(tmp / "file")], [tmp / "file", "not a directory"]


CASES: dict[str, Callable[[Path, Path], tuple[list[str], list[str]]]] = {
    "malformed-line": case_malformed_line,
    "non-finite-value": case_non_finite_value,
    "three-labels": case_three_labels,
    "one-label": case_one_label,
    "index-beyond-dimension": case_index_beyond_dimension,
    "truncated-gz": case_truncated_gz,
    "corrupt-gz": case_corrupt_gz,
    "corrupt-bz2": case_corrupt_bz2,
    "idx-wrong-magic": case_idx_wrong_magic,
    "idx-wrong-size": case_idx_wrong_size,
    "missing-registered-file": case_missing_registered_file,
    "missing-user-file": case_missing_user_file,
    "unknown-dataset": case_unknown_dataset,
    "more-clients-than-samples": case_more_clients_than_samples,
    "partition-leaves-client-empty": case_partition_leaves_client_empty,
    "unknown-key-in-file": case_unknown_key_in_file,
    "unknown-section": case_unknown_section,
    "wrong-type": case_wrong_type,
    "fractional-clients": case_fractional_clients,
    "k-below-1": _field("algorithm.k", "0.5", "algorithm.k"),
    "lr-zero": _field("algorithm.lr", "0", "algorithm.lr"),
    "lr-negative": _field("algorithm.lr", "-1", "algorithm.lr"),
    "s-above-100": _field("data.s", "150", "data.s"),
    "s-negative": _field("data.s", "-1", "data.s"),
    "gamma-zero": _field("algorithm.gamma", "0", "algorithm.gamma", "--set", "algorithm.method=stl_nc"),
    "gamma-negative": _field("algorithm.gamma", "-2", "algorithm.gamma", "--set", "algorithm.method=stl_nc"),
    "gamma-missing-for-stl-nc": _field("algorithm.method", "stl_nc", "algorithm.gamma"),
    "zero-clients": _field("data.num_clients", "0", "data.num_clients"),
    "bad-set-syntax": case_bad_set_syntax,
    "missing-config": case_missing_config,
    "checkpoint-every-zero": case_checkpoint_every_zero,
    "out-is-a-file": case_out_is_a_file,
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    name: str, tmp_path: Path, shared_data: Path, tiny: Path, cli
) -> None:
    extra, needles = CASES[name](tmp_path, shared_data)
    config, out = tiny, tmp_path / "out"
    # Two pseudo-options let a case replace the positional config or the output directory.
    if "--config-path" in extra:
        i = extra.index("--config-path")
        config = Path(extra[i + 1])
        del extra[i : i + 2]
    if "--out-path" in extra:
        i = extra.index("--out-path")
        out = Path(extra[i + 1])
        del extra[i : i + 2]
    before = sorted(p.name for p in tmp_path.iterdir())
    assert_one_line_error(cli("run", config, "--out", out, "--quiet", *extra), *needles)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no output directory, no file


def test_debug_shows_the_traceback(tmp_path: Path, tiny: Path) -> None:
    with pytest.raises(DataError, match="nope.svm: not found"):
        main(
            [
                "--debug",
                "run",
                str(tiny),
                "--out",
                str(tmp_path / "out"),
                "--set",
                f"data.dataset={tmp_path / 'nope.svm'}",
            ]
        )


def test_a_real_process_prints_one_line_and_exits_2(tmp_path: Path, tiny: Path) -> None:
    bad = _svm(tmp_path, "bad.svm", "+1 1:1\n-1 2:1\n-1 x\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stlsgd",
            "run",
            str(tiny),
            "--out",
            str(tmp_path / "out"),
            "--set",
            f"data.dataset={bad}",
        ],
        capture_output=True,
        text=True,
    )
    assert_one_line_error((proc.returncode, proc.stdout, proc.stderr), f"{bad}:3:")


# --------------------------------------------------------------------------- earlier output is never overwritten


def _snapshot(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def test_a_different_run_is_refused_unless_overwrite(tmp_path: Path, tiny: Path, cli) -> None:
    out = tmp_path / "out"
    assert cli("run", tiny, "--out", out, "--quiet")[0] == 0
    first = _snapshot(out)
    assert {"config.yaml", "metrics.jsonl", "summary.json", "final_params.npz"} <= first.keys()
    assert_one_line_error(
        cli("run", tiny, "--out", out, "--quiet", "--set", "algorithm.lr=0.25"),
        out,
        "already holds a different run",
        "--overwrite",
    )
    assert _snapshot(out) == first
    # --resume does not get around it either.
    assert_one_line_error(
        cli("run", tiny, "--out", out, "--quiet", "--resume", "--set", "algorithm.lr=0.25"),
        "already holds a different run",
    )
    assert _snapshot(out) == first
    assert cli("run", tiny, "--out", out, "--quiet", "--overwrite", "--set", "algorithm.lr=0.25")[0] == 0
    assert json.loads((out / "summary.json").read_text())["final"]["lr"] == 0.25


def test_an_error_before_the_run_leaves_the_same_configs_results_alone(tmp_path: Path, tiny: Path, cli) -> None:
    """Rerunning a config in place is allowed, but a data error found on the way must not truncate its metrics."""
    data = _svm(tmp_path, "mine.svm", "".join(f"{'+1' if i % 2 else '-1'} {i % 5 + 1}:1\n" for i in range(40)))
    out = tmp_path / "out"
    args = ("run", tiny, "--out", out, "--quiet", "--set", f"data.dataset={data}")
    assert cli(*args)[0] == 0
    first = _snapshot(out)
    assert first["metrics.jsonl"].count(b"\n") == 3
    data.write_text("+1 1:1\n-1 2:1\n+1 1:oops\n")
    assert_one_line_error(cli(*args), f"{data}:3:")
    assert _snapshot(out) == first


def test_results_without_a_config_are_not_overwritten(tmp_path: Path, tiny: Path, cli) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"round": 1}\n')
    assert_one_line_error(cli("run", tiny, "--out", out, "--quiet"), out, "--overwrite")
    assert (out / "metrics.jsonl").read_text() == '{"round": 1}\n'


def test_a_damaged_checkpoint_stops_resume_with_one_line(tmp_path: Path, tiny: Path, cli) -> None:
    out = tmp_path / "out"
    assert cli("run", tiny, "--out", out, "--quiet", "--checkpoint-every", "1")[0] == 0
    (out / "checkpoint").write_bytes(b"\x00" * 100)
    first = _snapshot(out)
    assert_one_line_error(cli("run", tiny, "--out", out, "--quiet", "--resume"), out / "checkpoint", "unreadable")
    assert _snapshot(out) == first
