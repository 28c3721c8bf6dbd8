"""The alpha-beta-c cost model against numbers worked out by hand, and its one-line errors."""

import json
import subprocess
import sys

import pytest

from stlsgd.costmodel import (
    PRESETS,
    Breakdown,
    Network,
    Usage,
    check_profile_matches,
    crossover_latency,
    parse_network,
    predict,
    read_profile,
    write_profile,
)
from stlsgd.errors import StlsgdError

KNOWN = "datacenter, cross-region, federated-mobile, lan"


def error(call, *args) -> str:
    with pytest.raises(StlsgdError) as err:
        call(*args)
    message = str(err.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------- predict


def test_predict_by_hand():
    # 3 rounds, 1,000 bytes sent per client, 10 client-steps on latency 1 ms, bandwidth 8 kbit/s = 1,000 B/s,
    # step 2 ms: latency 3 x 1e-3 = 0.003 s, transfer 1,000 / 1,000 = 1 s, compute 10 x 2e-3 = 0.02 s;
    # total 1.023 s.
    net = parse_network("latency=1ms,bandwidth=8kbit,step=2ms")
    assert (net.latency_s, net.bandwidth_Bps, net.step_s) == (1e-3, 1000.0, 2e-3)
    got = predict(3, 1000, 10, net)
    assert isinstance(got, Breakdown)
    assert (got.latency_s, got.transfer_s, got.compute_s) == (0.003, 1.0, 0.02)
    assert got.total_s == pytest.approx(1.023, rel=1e-15)


def test_predict_on_a_preset_with_a_step():
    # cross-region: alpha 80 ms, beta 5 Gbit/s = 625e6 B/s. 100 rounds of a 1.25 MB model (125e6 bytes in all)
    # and 1e6 client-steps of 20 us: 8 s + 0.2 s + 20 s = 28.2 s.
    got = predict(100, 125e6, 1e6, parse_network("cross-region,step=20us"))
    assert (got.latency_s, got.transfer_s, got.compute_s) == pytest.approx((8.0, 0.2, 20.0), rel=1e-12)
    assert got.total_s == pytest.approx(28.2, rel=1e-12)


def test_step_is_needed_only_when_there_is_computation():
    assert predict(2, 0, 0, PRESETS["datacenter"]).total_s == pytest.approx(2 * 500e-6)
    assert error(predict, 2, 0, 10, PRESETS["datacenter"]) == (
        "--network: step: not given for 'datacenter'; add it (e.g. datacenter,step=20us) "
        "or use a profile written by 'stlsgd calibrate CONFIG'"
    )
    assert error(predict, 2, 0, 10, parse_network("latency=1ms,bandwidth=1Gbit")) == (
        "--network: step: not given for 'custom'; add it (e.g. latency=50ms,bandwidth=1Gbit,step=20us) "
        "or use a profile written by 'stlsgd calibrate CONFIG'"
    )


def test_predict_rejects_impossible_counts():
    with pytest.raises(ValueError, match="rounds"):
        predict(-1, 0, 0, PRESETS["lan"])
    with pytest.raises(ValueError, match="bytes_per_client"):
        predict(1, float("nan"), 0, PRESETS["lan"])


# ---------------------------------------------------------------- crossover


def test_crossover_by_hand_on_bytes():
    # beta = 1 MB/s, equal steps. a: 100 rounds, 1e6 bytes; b: 10 rounds, 2e6 bytes.
    # T_a = 100 alpha + 1 s, T_b = 10 alpha + 2 s: equal at 90 alpha = 1 s, alpha* = 1/90 s (11.1 ms).
    net = parse_network("latency=1ms,bandwidth=1MB")  # no step: equal steps never need it
    a, b = (100, 1e6, 1000), Usage(10, 2e6, 1000)
    alpha = crossover_latency(a, b, net)
    assert alpha == pytest.approx(1 / 90, rel=1e-15)
    # Below alpha* the run with more rounds (a) is faster, above it the one with fewer rounds (b).
    at = lambda lat, run: predict(*run, Network(lat, net.bandwidth_Bps, 1e-6)).total_s  # noqa: E731
    assert at(alpha / 2, a) < at(alpha / 2, b) and at(alpha * 2, a) > at(alpha * 2, b)
    assert at(alpha, a) == pytest.approx(at(alpha, b), rel=1e-12)
    assert crossover_latency(b, a, net) == pytest.approx(1 / 90, rel=1e-15)  # symmetric


def test_crossover_by_hand_on_steps():
    # beta 1 GB/s, no bytes, step 1 ms. a: 10 rounds, 1,000 steps (1 s); b: 5 rounds, 2,000 steps (2 s).
    # 10 alpha + 1 = 5 alpha + 2 -> alpha* = 1/5 = 0.2 s.
    net = parse_network("latency=1ms,bandwidth=1GB,step=1ms")
    assert crossover_latency((10, 0, 1000), (5, 0, 2000), net) == pytest.approx(0.2, rel=1e-15)
    # The step cost matters here, so it is required.
    assert error(crossover_latency, (10, 0, 1000), (5, 0, 2000), PRESETS["lan"]).startswith(
        "--network: step: not given for 'lan'"
    )


def test_crossover_none_when_they_never_cross():
    net = parse_network("latency=1ms,bandwidth=1MB,step=1us")
    # a has more rounds AND more bytes: b is faster at every alpha > 0 (alpha* = -1/90 < 0).
    assert crossover_latency((100, 2e6, 0), (10, 1e6, 0), net) is None
    # Equal rounds: the difference does not depend on alpha.
    assert crossover_latency((10, 2e6, 0), (10, 1e6, 0), net) is None
    assert crossover_latency((10, 1e6, 5), (10, 1e6, 5), net) is None


# ---------------------------------------------------------------- units


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("0.5s", 0.5),
        ("50ms", 0.05),
        ("20us", 2e-5),
        ("20µs", 2e-5),
        ("20μs", 2e-5),
        ("800ns", 8e-7),
        ("1.5e3us", 1.5e-3),
        (".5ms", 5e-4),
        ("2 ms", 2e-3),
    ],
)
def test_time_units(text, seconds):
    net = parse_network(f"latency={text},bandwidth=1B,step={text}")
    assert net.latency_s == seconds and net.step_s == seconds


@pytest.mark.parametrize(
    ("text", "bytes_per_s"),
    [
        ("1Gbit", 125e6),
        ("100Mbit", 12.5e6),
        ("8kbit", 1000.0),
        ("8bit", 1.0),
        ("1Gbit/s", 125e6),
        ("1Gbps", 125e6),
        ("100Mbps", 12.5e6),
        ("8kbps", 1000.0),
        ("16bps", 2.0),
        ("1.25GB", 1.25e9),
        ("125MB", 125e6),
        ("1kB", 1000.0),
        ("1KB", 1000.0),
        ("10B", 10.0),
        ("125MB/s", 125e6),
    ],
)
def test_bandwidth_units(text, bytes_per_s):
    assert parse_network(f"latency=1ms,bandwidth={text}").bandwidth_Bps == bytes_per_s


# ---------------------------------------------------------------- presets and overrides


def test_presets_have_figures_and_sources_but_no_step():
    assert list(PRESETS) == ["datacenter", "cross-region", "federated-mobile", "lan"]
    assert (PRESETS["datacenter"].latency_s, PRESETS["datacenter"].bandwidth_Bps) == (500e-6, 1.25e9)
    assert (PRESETS["cross-region"].latency_s, PRESETS["cross-region"].bandwidth_Bps) == (80e-3, 625e6)
    assert (PRESETS["federated-mobile"].latency_s, PRESETS["federated-mobile"].bandwidth_Bps) == (50e-3, 1e6)
    assert (PRESETS["lan"].latency_s, PRESETS["lan"].bandwidth_Bps) == (200e-6, 125e6)
    for name, net in PRESETS.items():
        assert net.name == name and net.source and net.step_s is None
        assert parse_network(name) is net


def test_preset_overrides():
    net = parse_network(" cross-region , step=20us ")
    assert (net.latency_s, net.bandwidth_Bps, net.step_s, net.name) == (80e-3, 625e6, 2e-5, "cross-region")
    assert net.source.endswith("; overridden: step=20us")
    net = parse_network("federated-mobile,latency=100ms,bandwidth=2Mbit,step=1ms")
    assert (net.latency_s, net.bandwidth_Bps, net.step_s) == (0.1, 250e3, 1e-3)
    assert PRESETS["federated-mobile"].latency_s == 50e-3  # the preset itself is untouched
    assert parse_network("datacenter,") is PRESETS["datacenter"]  # a trailing comma is harmless


def test_custom_network():
    net = parse_network("bandwidth=1Gbit,latency=50ms,step=20us")
    assert (net.latency_s, net.bandwidth_Bps, net.step_s, net.name) == (0.05, 125e6, 2e-5, "custom")
    assert parse_network("latency=50ms,bandwidth=1Gbit").step_s is None


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("latency=0ms,bandwidth=1Gbit", "--network: latency: must be > 0, got '0ms'"),
        ("datacenter,step=0us", "--network: step: must be > 0, got '0us'"),
        ("latency=1e400ms,bandwidth=1Gbit", "--network: latency: must be finite, got '1e400ms'"),
        ("wan", f"--network: unknown preset 'wan'; known: {KNOWN}"),
        (
            "latency=1ms,bandwidth=1 gigabit",
            "--network: bandwidth: cannot parse '1 gigabit' (use e.g. 1Gbit, 100Mbit, 125MB)",
        ),
        ("latency=1ms,bandwidth=1Mb", "--network: bandwidth: cannot parse '1Mb' (use e.g. 1Gbit, 100Mbit, 125MB)"),
        ("latency=50,bandwidth=1Gbit", "--network: latency: cannot parse '50' (use e.g. 50ms, 500us, 0.1s)"),
        ("latency=-5ms,bandwidth=1Gbit", "--network: latency: must be > 0, got '-5ms'"),
        ("datacenter,step=fast", "--network: step: cannot parse 'fast' (use e.g. 20us, 1.5ms, 800ns)"),
        ("latncy=50ms,bandwidth=1Gbit", "--network: unknown field 'latncy' (latency, bandwidth, step)"),
        ("latency50ms", "--network: expected field=value, got 'latency50ms' (e.g. latency=50ms)"),
        ("datacenter,latency50ms", "--network: expected field=value, got 'latency50ms' (e.g. latency=50ms)"),
        ("latency=1ms,latency=2ms", "--network: latency: given twice"),
        (
            "latency=1ms",
            f"--network: bandwidth: missing (e.g. latency=50ms,bandwidth=1Gbit,step=20us, or a preset: {KNOWN})",
        ),
        ("  ", f"--network: empty; give a preset ({KNOWN}) or latency=...,bandwidth=..."),
    ],
)
def test_parse_errors_are_one_line(text, message):
    assert error(parse_network, text) == message


def test_errors_name_the_argument_given():
    assert error(parse_network, "wan", "cost.network") == f"cost.network: unknown preset 'wan'; known: {KNOWN}"


def test_network_checks_its_figures():
    assert error(Network, 0, 1.0) == "Network: latency_s: must be a number > 0 and finite, got 0"
    assert error(Network, 1e-3, float("inf")) == "Network: bandwidth_Bps: must be a number > 0 and finite, got inf"
    assert error(Network, 1e-3, 1.0, -1.0) == "Network: step_s: must be a number > 0 and finite, got -1.0"
    assert error(Network, "1ms", 1.0) == "Network: latency_s: must be a number > 0 and finite, got '1ms'"


# ---------------------------------------------------------------- profiles

IDENTITY = {"dataset": "a9a", "kind": "logistic", "model": None, "batch": 1, "num_clients": 32}


def test_profile_round_trip(tmp_path):
    path = tmp_path / "profile.json"
    write_profile(path, Network(2e-3, 5e8, 3e-6), IDENTITY, {"step_samples": [3.1e-6, 2.9e-6]})
    doc = json.loads(path.read_text())
    assert doc == {
        "format": "stlsgd-network-profile",
        "version": 1,
        "problem": IDENTITY,
        "latency_s": 2e-3,
        "bandwidth_Bps": 5e8,
        "step_s": 3e-6,
        "measured": {"step_samples": [3.1e-6, 2.9e-6]},
    }
    net = parse_network(str(path))
    assert (net.latency_s, net.bandwidth_Bps, net.step_s, net.name) == (2e-3, 5e8, 3e-6, str(path))
    assert dict(net.problem) == IDENTITY
    assert read_profile(path) == net
    check_profile_matches(net, dict(IDENTITY))  # same problem: no error
    over = parse_network(f"{path},latency=80ms")  # a profile plus overrides keeps its identity
    assert (over.latency_s, over.step_s, dict(over.problem)) == (0.08, 3e-6, IDENTITY)
    assert predict(1, 0, 1000, net).compute_s == pytest.approx(3e-3)


def test_profile_path_with_a_comma(tmp_path):
    path = tmp_path / "a,b.json"
    write_profile(path, Network(2e-3, 5e8, None), IDENTITY, {})
    net = parse_network(str(path))
    assert net.step_s is None and net.name == str(path)
    assert error(predict, 1, 0, 5, net) == (
        f"--network: step: not given for '{path}'; add it (e.g. {path},step=20us) "
        "or use a profile written by 'stlsgd calibrate CONFIG'"
    )


def test_profile_mismatch_names_the_field(tmp_path):
    path = tmp_path / "profile.json"
    write_profile(path, Network(2e-3, 5e8, 3e-6), IDENTITY, {})
    net = parse_network(str(path))
    assert error(check_profile_matches, net, {**IDENTITY, "dataset": "mnist49"}) == (
        f"--network: {path} was calibrated on dataset 'a9a', this run uses 'mnist49'"
    )
    assert error(check_profile_matches, net, {**IDENTITY, "num_clients": 8}) == (
        f"--network: {path} was calibrated on num_clients 32, this run uses 8"
    )
    assert error(check_profile_matches, net, {k: v for k, v in IDENTITY.items() if k != "batch"}) == (
        f"--network: {path} was calibrated on batch 1, this run uses (not recorded)"
    )
    check_profile_matches(PRESETS["datacenter"], IDENTITY)  # presets carry no identity


@pytest.mark.parametrize(
    ("content", "tail"),
    [
        ("{not json", "invalid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
        ('{"format": "other", "version": 1}', 'not a network profile (expected "format": "stlsgd-network-profile")'),
        ("[1, 2]", 'not a network profile (expected "format": "stlsgd-network-profile")'),
        ('{"format": "stlsgd-network-profile", "version": 2}', "profile version 2 is not supported (expected 1)"),
        ('{"format": "stlsgd-network-profile", "version": 1, "problem": []}', "problem: must be an object"),
        (
            '{"format": "stlsgd-network-profile", "version": 1, "problem": {}, "latency_s": 0, "bandwidth_Bps": 1}',
            "latency_s: must be a number > 0 and finite, got 0",
        ),
        (
            '{"format": "stlsgd-network-profile", "version": 1, "problem": {}, "latency_s": 1, "bandwidth_Bps": "x"}',
            "bandwidth_Bps: must be a number > 0 and finite, got 'x'",
        ),
    ],
)
def test_bad_profiles_name_the_file(tmp_path, content, tail):
    path = tmp_path / "profile.json"
    path.write_text(content)
    assert error(parse_network, str(path)) == f"--network: {path}: {tail}"


def test_missing_or_unreadable_profile(tmp_path):
    assert error(parse_network, str(tmp_path / "nope.json")) == f"--network: {tmp_path / 'nope.json'}: not found"
    assert error(parse_network, f"{tmp_path}/") == f"--network: {tmp_path}/: cannot read (Is a directory)"
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00")
    assert error(parse_network, str(binary)) == f"--network: {binary}: not a UTF-8 text file"


def test_no_torch_at_import():
    code = "import sys, stlsgd.costmodel; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_unwritable_profile_names_the_file(tmp_path):
    path = tmp_path / "missing-dir" / "profile.json"
    assert error(write_profile, path, PRESETS["lan"], IDENTITY, {}) == (
        f"{path}: cannot write the profile (No such file or directory)"
    )
    write_profile(tmp_path / "p.json", PRESETS["lan"], IDENTITY, {})
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]  # no temporary file left behind
