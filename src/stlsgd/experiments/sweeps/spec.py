"""Sweep files: a base experiment plus one grid per method row, expanded into validated runs.

A sweep file holds a base experiment (the ``stlsgd run`` schema: data/problem/algorithm/run) and, per method,
a grid and optional fixed fields::

    name = "table2_a9a_iid"
    title = "a9a (IID)"       # the figures' panel title (default: dataset and partition)
    seeds = [0, 1, 2]
    [base.data]
    dataset = "a9a"
    [[methods]]
    method = "local_sgd"
    label = "Local SGD"
    grid = { lr = [3.2, 32, 0.32], lr_decay = [1e-3, 1e-2, 1e-4], k = [400, 200, 800, 100, 1600] }
    fixed = { "run.eval_every" = 1 }

Bare keys name ``algorithm`` fields, dotted keys any field (``run.eval_every``). Values are tried in the
order listed, so list the likely-good ones first: an early good run lets pruning cut the rest short.

``search = "descent"`` runs a walk through each row's grid instead of all of it (:mod:`.search`): from the
lists' first values to a setting as good as each of its neighbours (every list one step up, down or kept).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator

from stlsgd.algorithms import REGISTRY
from stlsgd.errors import ConfigError
from stlsgd.experiments.config import Experiment, apply_overrides, load_config, read_raw, validate
from stlsgd.schema import StrictModel


class MethodGrid(StrictModel):
    """One row of the table: a method, its label and the grid of settings tried for it."""

    method: str
    label: str | None = None
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    fixed: dict[str, Any] = Field(default_factory=dict)

    @field_validator("method")
    @classmethod
    def _known(cls, method: str) -> str:
        if method not in REGISTRY:
            raise ValueError(f"unknown method {method!r}; known: {', '.join(REGISTRY)}")
        return method

    @field_validator("label")
    @classmethod
    def _printable(cls, label: str | None) -> str | None:
        return None if label is None else _printable_text(label)


def _printable_text(text: str) -> str:
    """Labels and names are printed in messages and tables: no control characters (NUL, newline, ...)."""
    if not text.strip() or not text.isprintable():
        raise ValueError(f"must be non-empty text without control characters (NUL, newline, tab, ...), got {text!r}")
    return text


class SweepSpec(StrictModel):
    """A sweep file: base experiment, per-method grids and the seeds used to rerun each best setting."""

    name: str
    # The figures' panel title, as the paper names its columns ("a9a (IID)"); default: dataset and partition.
    title: str | None = Field(default=None, min_length=1, max_length=80, pattern=r"^[^\n]*$")
    seeds: list[Annotated[int, Field(ge=0, lt=2**63)]] = Field(default_factory=lambda: [0])
    prune: bool = True
    # "grid": every setting of each row's grid; "descent": a walk to a setting as good as its neighbours.
    search: Literal["grid", "descent"] = "grid"
    base: dict[str, Any] = Field(default_factory=dict)
    methods: list[MethodGrid] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _printable_name(cls, name: str) -> str:
        return _printable_text(name)

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, seeds: list[int]) -> list[int]:
        # A seed listed twice would run twice at once into one run directory.
        repeated = sorted({s for s in seeds if seeds.count(s) > 1})
        if repeated:
            raise ValueError(f"seed {repeated[0]} is listed twice")
        if not seeds:
            raise ValueError("give at least one seed")
        return seeds


@dataclass
class RunSpec:
    """One resolved run of the sweep."""

    key: str
    label: str
    method: str
    phase: Literal["grid", "seed"]
    order: int
    seed: int
    settings: dict[str, Any]
    config: dict[str, Any]


@dataclass
class Sweep:
    name: str
    source: Path
    seeds: list[int]
    prune: bool
    labels: list[str]
    grid: list[RunSpec]
    base: dict[str, Any] = field(default_factory=dict)
    title: str | None = None
    #: label -> the lists its grid takes each setting from (where a chosen setting sits: :func:`grid_edges`)
    grids: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    #: "grid" runs every setting; "descent" walks each row's grid (:mod:`.search`)
    search: Literal["grid", "descent"] = "grid"


def settings_key(settings: dict[str, Any]) -> str:
    """A setting's identity within its row (its values, whatever their order)."""
    return json.dumps(settings, sort_keys=True)


def is_number(v: Any) -> bool:
    """A grid value with an order (a bool is not one)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def grid_edges(settings: dict[str, Any], grid: dict[str, list[Any]]) -> list[str]:
    """The settings of ``settings`` at the smallest or largest value of a numeric list of two or more in ``grid``:
    a comparison is as fair as its grids reach, and a choice at an edge says the list should go further."""
    edges = []
    for key, value in settings.items():
        values = grid.get(key, [])
        numbers = [v for v in values if is_number(v)]
        if len(set(numbers)) >= 2 and len(numbers) == len(values) and value in (min(numbers), max(numbers)):
            edges.append(key)
    return edges


def _set_path(raw: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".") if "." in key else ["algorithm", key]
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: {part} is not a section")
        node = child
    node[parts[-1]] = copy.deepcopy(value)


def config_key(config: dict[str, Any]) -> str:
    """Stable identity of a resolved run: the hash of :meth:`Experiment.identity` (its non-default fields).

    Leaving defaults out keeps keys (and so the skipping of finished runs) stable when the config schema
    gains new fields with defaults.
    """
    body = Experiment.model_validate(config).identity()
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def with_seed(spec: RunSpec, seed: int, order: int) -> RunSpec:
    """The seed rerun of a grid setting."""
    config = copy.deepcopy(spec.config)
    config["run"]["seed"] = seed
    return RunSpec(config_key(config), spec.label, spec.method, "seed", order, seed, spec.settings, config)


def _interleave(per_label: list[list[RunSpec]]) -> Iterator[RunSpec]:
    """Round-robin over labels: every label's likeliest setting runs early, so its bound exists early."""
    for batch in itertools.zip_longest(*per_label):
        yield from (s for s in batch if s is not None)


def load_sweep(path: str | Path, *, only: list[str] | None = None, limit: int | None = None) -> Sweep:
    """Read a sweep file and validate every expanded run up front (errors name the file and the field).

    ``only`` keeps the named labels; ``limit`` keeps each label's first ``limit`` settings (a quick probe).
    """
    path = Path(path)
    raw = read_raw(path)
    if "methods" not in raw and raw.keys() & {"algorithm", "data", "problem", "run"}:
        raise ConfigError(f"{path}: an experiment config (no methods), not a sweep file: `stlsgd run {path}`")
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        msg = "unknown field" if first["type"] == "extra_forbidden" else first["msg"].removeprefix("Value error, ")
        raise ConfigError(f"{path}: {loc}: {msg}") from None
    base = copy.deepcopy(spec.base)
    if "run" in base and "seed" in base["run"] and base["run"]["seed"] not in spec.seeds:
        raise ConfigError(f"{path}: seeds: must include base.run.seed ({base['run']['seed']})")
    labels: list[str] = []
    grids: dict[str, dict[str, list[Any]]] = {}
    per_label: list[list[RunSpec]] = []
    for i, mg in enumerate(spec.methods):
        label = mg.label or mg.method
        if label in labels:
            raise ConfigError(f"{path}: methods[{i}].label: duplicate label {label!r}")
        labels.append(label)
        grids[label] = dict(mg.grid)
        for key, values in mg.grid.items():
            if not values:
                raise ConfigError(f"{path}: methods[{i}].grid.{key}: empty list")
    if only:
        unknown = [label for label in only if label not in labels]
        if unknown:
            raise ConfigError(f"{path}: --only: unknown label {unknown[0]!r}; labels: {', '.join(labels)}")
    for i, (mg, label) in enumerate(zip(spec.methods, labels)):
        if only and label not in only:
            continue  # not run: not expanded either (a large grid costs its validation time)
        keys = list(mg.grid)
        combos = itertools.product(*(mg.grid[k] for k in keys))
        # The product is walked lazily: --limit N expands (and validates) only the first N settings.
        runs: list[RunSpec] = []
        for combo in itertools.islice(combos, limit) if limit else combos:
            settings = dict(zip(keys, combo))
            config = copy.deepcopy(base)
            config["name"] = f"{spec.name}/{label}"
            try:
                _set_path(config, "algorithm.method", mg.method)
                for key, value in {**mg.fixed, **settings}.items():
                    _set_path(config, key, value)
            except ConfigError as exc:
                raise ConfigError(f"{path}: methods[{i}]: {exc}") from None
            where = ", ".join(f"{k}={v}" for k, v in settings.items())
            exp = validate(config, f"{path}: methods[{i}] ({label}{': ' + where if where else ''})")
            resolved = exp.to_dict()
            runs.append(RunSpec(config_key(resolved), label, mg.method, "grid", 0, exp.run.seed, settings, resolved))
        per_label.append(runs)
    if only:
        labels = [label for label in labels if label in only]
    grid = list(_interleave(per_label))
    for order, run_spec in enumerate(grid):
        run_spec.order = order
    return Sweep(spec.name, path, spec.seeds, spec.prune, labels, grid, base, spec.title, grids, spec.search)


def proposal_experiment(path: str | Path, overrides: list[str] | None = None) -> tuple[Experiment, str | None]:
    """The experiment ``stlsgd suggest`` proposes for, and the sweep row it is (None: the file's own experiment or a
    sweep's base): a sweep file's first row that runs ``algorithm.auto`` as that row runs it (its base with the row's
    fixed fields, its grid's first setting), else its base. ``auto``'s proposal depends on the run's budget, batch
    and evaluations, which a row may set: Table 2+'s rows evaluate every five rounds, their base every round, and on
    a9a Non-IID the two give different plans (k 262,144 for 20 rounds against 524,288 for 16)."""
    path = Path(path)
    if "methods" in read_raw(path):  # a sweep file
        # each row's first setting, resolved as the sweep runs it (the row's fixed fields in either key form)
        row = next((r for r in load_sweep(path, limit=1).grid if r.config["algorithm"].get("auto") is True), None)
        if row is not None:
            return validate(apply_overrides(row.config, overrides or []), f"{path}: {row.label}"), row.label
    return load_config(path, overrides, sweep_base=True), None
