"""Atomic checkpoints of a :class:`~stlsgd.executors.simulator.RunState`, for exact resume.

A run is a pure function of its plan (regenerated from the round index, see :mod:`stlsgd.algorithms.plan`)
and of the :class:`RunState` at a round boundary: the clients' parameters, the proximal anchor x_s of
STL-SGD^nc (Algorithm 3), the sampler's PCG64 state and the counters. Saving that state after a round and
loading it back therefore continues Algorithms 1-3 bit for bit.

On disk a checkpoint is one ``torch.save`` file holding only a dict of tensors, one JSON string and the
SHA-256 of both, so :func:`load_checkpoint` reads it with ``torch.load(weights_only=True)``: loading a
checkpoint never runs code from the file, and a damaged one (a flipped bit in the tensor data, which the zip
container does not notice) is refused instead of resuming with wrong numbers. Array-valued fields
(``clients``, ``anchor``; NumPy arrays or torch tensors) go into the tensor dict and come back as the type they
were saved as; every other field, and the caller's ``meta``, goes into the JSON (Python's JSON keeps the
128-bit PCG64 integers and every float exactly).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stlsgd.algorithms.plan import Cursor
from stlsgd.errors import StlsgdError, brief
from stlsgd.executors.simulator import RunState
from stlsgd.files import atomic_write

if TYPE_CHECKING:  # imported by the functions that write or read a checkpoint: a run that never does starts faster
    import torch

FORMAT = "stlsgd-checkpoint"
VERSION = 2  # 2: the plan's cursor, the objective fed back to adaptive plans, a checksum
# Temporary files are named like this so a resume can clear the debris of a write cut short by a kill.
TMP_PREFIX = ".checkpoint-"
TMP_SUFFIX = ".tmp"


# What the JSON side of a RunState must hold; a damaged file must fail here, not rounds later in the run.
_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "clients": dict,
    "sampler_state": dict,
    "cursor": dict,
    "anchor": (dict, type(None)),
    "control": (dict, type(None)),
    "control_mean": (dict, type(None)),
    "outer_momentum": (dict, type(None)),
    "bytes": int,
    "wall_s": (int, float),
    "compute_s": (int, float),
    "comm_s": (int, float),
    "last_eval_iteration": int,
    "status": str,
    "rounds_to_target": (int, type(None)),
    "iterations_to_target": (int, type(None)),
    "objective": (int, float, type(None)),
    "last": dict,
}


class CheckpointError(StlsgdError):
    """A checkpoint that cannot be read or does not fit the run (the message names the file)."""


def _is_array_state(value: Any) -> bool:
    """A State: a non-empty dict of arrays/tensors (as opposed to ``last``, a dict of numbers)."""
    return (
        isinstance(value, dict)
        and bool(value)
        and all(isinstance(v, np.ndarray) or _is_tensor(v) for v in value.values())
    )


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")  # no tensor exists before torch is imported
    return torch is not None and isinstance(value, torch.Tensor)


def _to_tensor(value: np.ndarray | torch.Tensor) -> torch.Tensor:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True).contiguous()
    # torch.from_numpy shares memory and keeps the exact bits; the copy detaches it from the live state.
    return torch.from_numpy(np.array(value, copy=True, order="C"))


def save_checkpoint(path: Path, state: RunState, meta: dict[str, Any]) -> None:
    """Write ``state`` and the JSON-able ``meta`` to ``path`` atomically.

    The bytes go to a temporary file in the same directory, are fsynced, and replace ``path`` with
    ``os.replace``; the directory is fsynced last. A reader (or a run killed at any instant) therefore
    sees either the previous checkpoint or the new one, never a mix.
    """
    import torch

    path = Path(path)
    tensors: dict[str, torch.Tensor] = {}
    arrays: dict[str, dict[str, str]] = {}  # field -> key -> "numpy" | "torch"
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(state):
        value = getattr(state, f.name)
        if _is_array_state(value):
            arrays[f.name] = {}
            for key, arr in value.items():
                tensors[f"{f.name}/{key}"] = _to_tensor(arr)
                arrays[f.name][key] = "torch" if isinstance(arr, torch.Tensor) else "numpy"
        else:
            fields[f.name] = value.to_dict() if isinstance(value, Cursor) else value
    header = {"format": FORMAT, "version": VERSION, "arrays": arrays, "fields": fields, "meta": meta}
    try:
        text = json.dumps(header, allow_nan=True)
    except (TypeError, ValueError) as err:
        raise TypeError(f"checkpoint state/meta must be arrays or JSON values: {err}") from None
    payload = {"json": text, "tensors": tensors, "sha256": _digest(text, tensors)}
    atomic_write(path, lambda fh: torch.save(payload, fh), mode="wb", prefix=TMP_PREFIX, suffix=TMP_SUFFIX)


def load_checkpoint(path: Path) -> tuple[RunState, dict[str, Any]]:
    """Read a checkpoint written by :func:`save_checkpoint`: (the RunState, the meta dict).

    NumPy arrays come back as writable NumPy arrays and tensors as CPU tensors (move them to a device
    yourself). Any unreadable or foreign file raises :class:`CheckpointError` naming ``path``.
    """
    import torch

    path = Path(path)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no checkpoint") from None
    except Exception as err:  # noqa: BLE001 -- torch/pickle raise a zoo of types for a damaged file; all mean "unreadable"
        raise CheckpointError(
            f"{path}: unreadable checkpoint ({type(err).__name__}: {brief(err)}); delete it to start the run afresh"
        ) from None
    try:
        if not isinstance(payload, dict) or "sha256" not in payload:
            raise ValueError("not an stlsgd checkpoint (no checksum)")
        if payload["sha256"] != _digest(payload["json"], payload["tensors"]):
            raise CheckpointError(
                f"{path}: damaged checkpoint (its checksum does not match its content); "
                "delete it to start the run afresh, or restore a good copy"
            )
        header = json.loads(payload["json"])
        if header.get("format") != FORMAT:
            raise ValueError("not an stlsgd checkpoint")
        if header.get("version") != VERSION:
            raise ValueError(f"checkpoint version {header.get('version')}, this stlsgd reads {VERSION}")
        tensors: dict[str, torch.Tensor] = payload["tensors"]
        values: dict[str, Any] = dict(header["fields"])
        for name, kinds in header["arrays"].items():
            values[name] = {
                key: tensors[f"{name}/{key}"] if kind == "torch" else tensors[f"{name}/{key}"].numpy()
                for key, kind in kinds.items()
            }
        known = {f.name for f in dataclasses.fields(RunState)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)}")
        for name, kinds in _FIELD_TYPES.items():
            if name in values and not isinstance(values[name], kinds):
                raise TypeError(f"field {name} is {type(values[name]).__name__}")
        if not isinstance(header["meta"], dict):
            raise TypeError("meta is not a table")
        state = RunState(**values)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise CheckpointError(f"{path}: not a valid stlsgd checkpoint ({type(err).__name__}: {brief(err)})") from None
    return state, header["meta"]


def _digest(text: str, tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 of the JSON text and of every tensor's name, dtype, shape and bytes, in name order."""
    import torch

    h = hashlib.sha256(text.encode())
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"\0{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()
