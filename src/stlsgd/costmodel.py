"""Predicted wall time of a run on a given network and hardware (an alpha-beta-c cost model).

    time = sum over rounds (alpha + bytes_sent_per_client_in_round / beta) + client_steps * c
         = rounds * alpha + bytes_per_client / beta + client_steps * c

alpha (``latency_s``): fixed cost of one communication round, one round trip; beta (``bandwidth_Bps``): bytes
per second one client can send; c (``step_s``): seconds per sample processed by one client (a local step of
per-client batch B is B client-steps). ``bytes_per_client`` is what one client sends over the whole run (the
model, plus e.g. a control variate); ``client_steps`` the samples one client processes.

Assumptions: rounds are synchronous (everyone waits for the round); computation and communication are not
overlapped; clients compute in parallel at the same speed, so the computation time is one client's; an
all-reduce is modelled as each client sending its bytes once over its own link (no 2(P-1)/P ring factor, no
server bottleneck, the download of the average not counted). See docs/cost_model.md for what is left out.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from stlsgd.errors import StlsgdError
from stlsgd.files import write_json_atomic

PROFILE_FORMAT = "stlsgd-network-profile"
PROFILE_VERSION = 1
_FIELDS = {"latency": "latency_s", "bandwidth": "bandwidth_Bps", "step": "step_s"}
#: The figures that make physical sense, (least, most) in the field's unit. Outside them a prediction means
#: nothing (a round trip of more than an hour, a link slower than one byte a second), and at the extremes
#: (bandwidth 1e-305 B/s, latency 1e308 s) the times overflow to inf and the crossovers come out wrong.
BOUNDS: dict[str, tuple[float, float]] = {
    "latency_s": (1e-9, 3600.0),  # 1 ns .. 1 hour per round
    "bandwidth_Bps": (1.0, 1e18),  # 1 B/s .. 1 EB/s per client
    "step_s": (1e-12, 3600.0),  # 1 ps .. 1 hour per client-step
}
_BOUND_TEXT = {
    "latency_s": "between 1ns and 1 hour (3600s)",
    "bandwidth_Bps": "between 1 B/s and 1e18 B/s",
    "step_s": "between 1e-12s and 1 hour (3600s)",
}


def _check_figure(where: str, key: str, value: Any) -> None:
    if value is None and key == "step_s":  # unknown step: allowed until a prediction needs it
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < float(value) < math.inf:
        raise StlsgdError(f"{where}: {key}: must be a number > 0 and finite, got {value!r}")
    least, most = BOUNDS[key]
    number = float(value)
    if not least <= number <= most:
        raise StlsgdError(f"{where}: {key}: {number:g} makes no physical sense; give a figure {_BOUND_TEXT[key]}")


@dataclass(frozen=True)
class Network:
    """alpha (s per round), beta (bytes/s per client) and c (s per client-step, or None when unknown).

    ``step_s`` is a property of the problem and the hardware, not of the network, so presets leave it None
    and ``predict`` asks for it (``--network datacenter,step=20us`` or a calibration profile) rather than
    guessing: a logistic-regression step and a ResNet18 step differ by orders of magnitude. ``problem`` is the
    identity of the problem a calibration profile was measured on (None otherwise).
    """

    latency_s: float
    bandwidth_Bps: float
    step_s: float | None = None
    name: str = "custom"
    source: str = ""
    problem: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for key in ("latency_s", "bandwidth_Bps", "step_s"):
            _check_figure("Network", key, getattr(self, key))
        if self.problem is not None:  # frozen: keep the identity read-only too
            object.__setattr__(self, "problem", MappingProxyType(dict(self.problem)))


# Latency is one round trip (a synchronous round needs at least one); bandwidth is one client's send rate.
# Full citations with links: docs/cost_model.md.
_EC2 = "AWS EC2 User Guide, 'Amazon EC2 instance network bandwidth'"
PRESETS: dict[str, Network] = {
    p.name: p
    for p in (
        Network(
            500e-6,
            10e9 / 8,
            None,
            "datacenter",
            "RTT 500 us: 'Round trip within same datacenter' (J. Dean, "
            "Latency numbers every programmer should know); "
            f"10 Gbit/s: single flow in a placement group ({_EC2})",
        ),
        Network(
            80e-3,
            5e9 / 8,
            None,
            "cross-region",
            "RTT 80 ms: AWS us-east-1 <-> eu-west-1 average 80.5 ms "
            f"('Latency Between AWS Global Regions'); 5 Gbit/s: single-flow and inter-Region limit ({_EC2})",
        ),
        Network(
            50e-3,
            8e6 / 8,
            None,
            "federated-mobile",
            "RTT 50 ms: Opensignal USA 2018 mobile latency 52-60 ms "
            "(Ookla 2022 global median 28 ms is to the nearest server); 8 Mbit/s uplink: Opensignal USA 2022 "
            "average upload 6.7-10.5 Mbit/s, Ookla USA H1 2018 mean 8.63 Mbit/s",
        ),
        Network(
            200e-6,
            1e9 / 8,
            None,
            "lan",
            "RTT 200 us: intra-rack round trip 100-200 us (Vetora Labs, "
            "'Latency Numbers Every Engineer Should Know'); 1 Gbit/s: gigabit Ethernet",
        ),
    )
}

_NUMBER = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*"  # a sign, so '-5ms' says "must be > 0"
_TIME = re.compile(_NUMBER + r"(s|ms|us|µs|μs|ns)")
# Divisors, not factors: 20 / 1e6 is exactly the double nearest 20e-6, 20 * 1e-6 is not.
_TIME_UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6, "μs": 1e6, "ns": 1e9}
# Bits are spelled out (Gbit) and bytes are B, so 'Mb' (bit or byte?) is never guessed; all decimal.
_RATE = re.compile(_NUMBER + r"(Gbit|Mbit|kbit|bit|Gbps|Mbps|kbps|bps|GB|MB|kB|KB|B)(?:/s)?")
_RATE_UNITS = {
    "Gbit": 1e9 / 8,
    "Mbit": 1e6 / 8,
    "kbit": 1e3 / 8,
    "bit": 1 / 8,
    "Gbps": 1e9 / 8,
    "Mbps": 1e6 / 8,
    "kbps": 1e3 / 8,
    "bps": 1 / 8,
    "GB": 1e9,
    "MB": 1e6,
    "kB": 1e3,
    "KB": 1e3,
    "B": 1.0,
}
_EXAMPLES = {"latency": "50ms, 500us, 0.1s", "step": "20us, 1.5ms, 800ns", "bandwidth": "1Gbit, 100Mbit, 125MB"}


def _quantity(arg: str, key: str, text: str) -> float:
    pattern, units = (_RATE, _RATE_UNITS) if key == "bandwidth" else (_TIME, _TIME_UNITS)
    match = pattern.fullmatch(text.strip())
    if match is None:
        raise StlsgdError(f"{arg}: {key}: cannot parse {text!r} (use e.g. {_EXAMPLES[key]})")
    number, unit = float(match.group(1)), match.group(2)
    value = number * units[unit] if key == "bandwidth" else number / units[unit]
    if value <= 0:
        raise StlsgdError(f"{arg}: {key}: must be > 0, got {text!r}")
    if not math.isfinite(value):
        raise StlsgdError(f"{arg}: {key}: must be finite, got {text!r}")
    field_name = _FIELDS[key]
    least, most = BOUNDS[field_name]
    if not least <= value <= most:
        raise StlsgdError(
            f"{arg}: {key}: {text.strip()} makes no physical sense; give a figure {_BOUND_TEXT[field_name]}"
        )
    return value


def parse_seconds(text: str, arg: str) -> float:
    """A duration such as ``20ms`` or ``1.5s`` (units s, ms, us, ns), 1 ns .. 1 hour; a one-line error naming
    ``arg``."""
    return _quantity(arg, "latency", text)


def _is_file(text: str) -> bool:
    try:
        return Path(text).is_file()
    except (OSError, ValueError):  # a name too long, or with a NUL, is no file
        return False


def parse_network(text: str, arg: str = "--network") -> Network:
    """A preset name, ``key=value`` items, a preset or profile plus items, or a profile file path.

    ``datacenter``, ``latency=50ms,bandwidth=1Gbit,step=20us``, ``cross-region,step=20us``,
    ``runs/profile.json``, ``runs/profile.json,latency=80ms``. Errors are one line naming ``arg``.
    """
    whole = text.strip()
    if not whole:
        raise StlsgdError(f"{arg}: empty; give a preset ({', '.join(PRESETS)}) or latency=...,bandwidth=...")
    # A path may itself hold commas: an existing file taken whole wins over splitting (a preset over both).
    if whole not in PRESETS and _is_file(whole):
        return read_profile(whole, arg)
    items = [t.strip() for t in whole.split(",") if t.strip()]
    base: Network | None = None
    if items and "=" not in items[0]:
        first = items.pop(0)
        if first in PRESETS:
            base = PRESETS[first]
        elif first.endswith(".json") or "/" in first or _is_file(first):
            base = read_profile(first, arg)
        elif not first.startswith(tuple(_FIELDS)):
            raise StlsgdError(f"{arg}: unknown preset {first!r}; known: {', '.join(PRESETS)}")
        else:
            items.insert(0, first)  # 'latency50ms': reported below as a malformed item
    values: dict[str, float] = {}
    for item in items:
        key, eq, value = (part.strip() for part in item.partition("="))
        if not eq:
            raise StlsgdError(f"{arg}: expected field=value, got {item!r} (e.g. latency=50ms)")
        if key not in _FIELDS:
            raise StlsgdError(f"{arg}: unknown field {key!r} ({', '.join(_FIELDS)})")
        if key in values:
            raise StlsgdError(f"{arg}: {key}: given twice")
        values[key] = _quantity(arg, key, value)
    if base is None:
        for key in ("latency", "bandwidth"):
            if key not in values:
                raise StlsgdError(
                    f"{arg}: {key}: missing (e.g. latency=50ms,bandwidth=1Gbit,step=20us, "
                    f"or a preset: {', '.join(PRESETS)})"
                )
        return Network(values["latency"], values["bandwidth"], values.get("step"), "custom", f"given by {arg}")
    if not values:
        return base
    # The source records which figures are no longer the preset's (or the profile's).
    overridden: dict[str, Any] = {_FIELDS[k]: v for k, v in values.items()}
    return replace(base, source=f"{base.source}; overridden: {','.join(items)}", **overridden)


def write_profile(
    path: str | Path, network: Network, problem_identity: Mapping[str, Any], measured: Mapping[str, Any]
) -> None:
    """Write a calibration profile: the figures, the problem they were measured on, the raw measurements.

    The file is replaced atomically (a temporary file renamed over it), so a reader never sees half a profile.
    """
    doc = {
        "format": PROFILE_FORMAT,
        "version": PROFILE_VERSION,
        "problem": dict(problem_identity),
        "latency_s": network.latency_s,
        "bandwidth_Bps": network.bandwidth_Bps,
        "step_s": network.step_s,
        "measured": dict(measured),
    }
    path = Path(path)
    try:
        write_json_atomic(path, doc)
    except OSError as err:
        raise StlsgdError(f"{path}: cannot write the profile ({err.strerror or err})") from None


def read_profile(path: str | Path, arg: str = "--network") -> Network:
    """The Network a profile describes, named after its path and carrying its problem identity."""
    where = f"{arg}: {path}"
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StlsgdError(f"{where}: not found") from None
    except OSError as err:
        raise StlsgdError(f"{where}: cannot read ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise StlsgdError(f"{where}: not a UTF-8 text file") from None
    except json.JSONDecodeError as err:
        raise StlsgdError(f"{where}: invalid JSON ({err})") from None
    if not isinstance(doc, dict) or doc.get("format") != PROFILE_FORMAT:
        raise StlsgdError(f'{where}: not a network profile (expected "format": "{PROFILE_FORMAT}")')
    if doc.get("version") != PROFILE_VERSION:
        raise StlsgdError(
            f"{where}: profile version {doc.get('version')!r} is not supported (expected {PROFILE_VERSION})"
        )
    if not isinstance(doc.get("problem"), dict):
        raise StlsgdError(f"{where}: problem: must be an object")
    for key in ("latency_s", "bandwidth_Bps", "step_s"):
        _check_figure(where, key, doc.get(key))
    return Network(
        float(doc["latency_s"]),
        float(doc["bandwidth_Bps"]),
        None if doc.get("step_s") is None else float(doc["step_s"]),
        str(path),
        "calibrated by stlsgd calibrate",
        doc["problem"],
    )


def _show(value: Any) -> str:
    return "(not recorded)" if value is None else repr(value) if isinstance(value, str) else json.dumps(value)


def check_profile_matches(network: Network, problem_identity: Mapping[str, Any], arg: str = "--network") -> None:
    """Refuse a profile measured on another problem: its step cost would not be this run's.

    Presets and key=value networks carry no identity and always pass. Every key of either side is compared;
    a key only one side records counts as a difference.
    """
    if network.problem is None:
        return
    for key in [*problem_identity, *(k for k in network.problem if k not in problem_identity)]:
        theirs, ours = network.problem.get(key), problem_identity.get(key)
        if theirs != ours:
            raise StlsgdError(
                f"{arg}: {network.name} was calibrated on {key} {_show(theirs)}, this run uses {_show(ours)}"
            )


class Usage(NamedTuple):
    """What a run did (cumulative): rounds, bytes one client sent, samples one client processed."""

    rounds: float
    bytes_per_client: float
    client_steps: float


@dataclass(frozen=True)
class Breakdown:
    """Predicted seconds: rounds * alpha, bytes / beta, client_steps * c, and their sum."""

    latency_s: float
    transfer_s: float
    compute_s: float
    total_s: float


def require_step(network: Network, arg: str, who: str) -> float:
    """The network's client-step time, which ``who`` (auto, suggest) needs to weigh a round against steps."""
    if network.step_s is None:
        raise StlsgdError(
            f"{arg}: {who} needs the time of a client-step too: add step=... (e.g. datacenter,step=446ns) "
            "or give a profile from stlsgd calibrate"
        )
    return network.step_s


def _step(network: Network, client_steps: float, arg: str) -> float:
    if client_steps == 0:  # no computation: the step cost cannot matter
        return 0.0
    if network.step_s is None:
        example = "latency=50ms,bandwidth=1Gbit" if network.name == "custom" else network.name
        raise StlsgdError(
            f"{arg}: step: not given for {network.name!r}; add it (e.g. {example},step=20us) "
            f"or use a profile written by 'stlsgd calibrate CONFIG'"
        )
    return network.step_s


def _usage(run: Usage | tuple[float, float, float]) -> Usage:
    usage = Usage(*run)
    for key, value in zip(Usage._fields, usage):
        if not (math.isfinite(value) and value >= 0):  # run outputs, not user input: a caller's bug
            raise ValueError(f"{key} must be finite and >= 0, got {value!r}")
    return usage


def predict(
    rounds: float, bytes_per_client: float, client_steps: float, network: Network, arg: str = "--network"
) -> Breakdown:
    """time = rounds * alpha + bytes_per_client / beta + client_steps * c (see the module docstring)."""
    usage = _usage((rounds, bytes_per_client, client_steps))
    latency = usage.rounds * network.latency_s
    transfer = usage.bytes_per_client / network.bandwidth_Bps
    compute = usage.client_steps * _step(network, usage.client_steps, arg)
    total = latency + transfer + compute
    if not math.isfinite(total):  # within BOUNDS only for absurd usages; never print "inf s"
        raise StlsgdError(
            f"{arg}: the predicted time overflows (rounds {usage.rounds:g}, bytes {usage.bytes_per_client:g})"
        )
    return Breakdown(latency, transfer, compute, total)


def crossover_latency(
    a: Usage | tuple[float, float, float],
    b: Usage | tuple[float, float, float],
    network: Network,
    arg: str = "--network",
) -> float | None:
    """The latency alpha > 0 at which runs a and b take the same time, bandwidth and step fixed; else None.

    T_a - T_b = alpha (R_a - R_b) - [(B_b - B_a) / beta + (S_b - S_a) c], linear in alpha, so
    alpha* = [(B_b - B_a) / beta + (S_b - S_a) c] / (R_a - R_b). Below alpha* the run with MORE rounds is
    faster (it saves bytes or steps), above it the run with FEWER rounds. None when alpha* <= 0 (the run with
    fewer rounds is at least as fast at every alpha > 0) or when the rounds are equal (the difference does
    not depend on alpha: the one cheaper in bytes and steps always wins). The step cost is needed only when
    the client-steps differ, so two runs of equal steps can be compared on a preset without one.
    """
    ua, ub = _usage(a), _usage(b)
    step = _step(network, ua.client_steps - ub.client_steps, arg)
    if ua.rounds == ub.rounds:
        return None
    gap = (ub.bytes_per_client - ua.bytes_per_client) / network.bandwidth_Bps + (
        ub.client_steps - ua.client_steps
    ) * step
    alpha = gap / (ua.rounds - ub.rounds)
    return alpha if alpha > 0 and math.isfinite(alpha) else None
