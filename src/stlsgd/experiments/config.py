"""Typed experiment configuration, loaded from TOML or YAML and validated field by field.

Every error names the file and the dotted field (``algorithm.lr: must be > 0``) and is raised as
:class:`~stlsgd.errors.ConfigError`, which the CLI turns into one line and exit status 2.
"""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias, Union

import numpy as np
import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from stlsgd.algorithms import REGISTRY
from stlsgd.algorithms.registry import MAX_STEPS, MethodConfig
from stlsgd.algorithms.stl_sgd import STLSCConfig
from stlsgd.errors import ConfigError
from stlsgd.schema import StrictModel


class DataConfig(StrictModel):
    """Which data and how it is spread over clients (Section 5)."""

    dataset: str = "digits49"
    data_dir: str | None = None
    num_clients: int = Field(32, ge=1, le=2**20)
    partition: Literal["shared", "split", "noniid", "dirichlet"] = "shared"
    s: float = Field(50.0, ge=0, le=100, description="Non-IID: percent of the data dealt IID")
    alpha: float = Field(0.5, gt=0, description="Dirichlet label-skew concentration")
    partition_seed: int = Field(0, ge=0, lt=2**63)
    max_samples: int | None = Field(None, ge=1, description="use only the first max_samples rows (CPU-scale runs)")


class ProblemConfig(StrictModel):
    """The objective: logistic regression (Eq. 8, convex) or a network on images (Section 5, non-convex)."""

    kind: Literal["logistic", "net"] = "logistic"
    lam: float | None = Field(None, gt=0, description="L2 weight lambda of Eq. 8; default 1/n")
    # kind = "net" only:
    model: Literal["cnn", "resnet18", "vgg16"] = Field("cnn", description="network (problems/nets.py)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA when available")
    eval_batch: int = Field(1024, ge=1, description="images per forward pass when evaluating")
    normalise: bool = Field(True, description="per-channel standardisation with the training set's mean/std")
    momentum: float = Field(0.0, ge=0, lt=1, description="SGD momentum (the paper: 0)")
    weight_decay: float = Field(0.0, ge=0, description="SGD weight decay (the paper: 0)")

    @model_validator(mode="after")
    def _kind_fields(self) -> ProblemConfig:
        if self.kind == "net" and self.lam is not None:
            raise ValueError("lam: only for kind = 'logistic' (a network's loss has no L2 term)")
        return self


# The [algorithm] section: one of the registered methods' models, chosen by its `method` field.
if TYPE_CHECKING:  # the union is built at import from the registry; a type checker sees the common base
    AlgorithmConfig: TypeAlias = MethodConfig
else:
    AlgorithmConfig = Annotated[Union[tuple(REGISTRY.values())], Field(discriminator="method")]  # noqa: UP007
DEFAULT_METHOD = "stl_sc"


class RunConfig(StrictModel):
    """Seed, stop rule and evaluation schedule."""

    seed: int = Field(0, ge=0, lt=2**63)
    target_gap: float | None = Field(1e-4, gt=0, description="stop when f(x) - f* <= target_gap")
    target_accuracy: float | None = Field(None, gt=0, le=1, description="stop when training accuracy >= this")
    max_iterations: int | None = Field(5_000_000, ge=1, le=MAX_STEPS)
    max_rounds: int | None = Field(None, ge=1, le=MAX_STEPS)
    eval_every: int = Field(1, ge=1, description="evaluate the averaged model every this many rounds")
    eval_every_iterations: int | None = Field(None, ge=1, description="and whenever this many iterations pass")

    @field_validator(
        "target_gap", "target_accuracy", "max_iterations", "max_rounds", "eval_every_iterations", mode="before"
    )
    @classmethod
    def _off(cls, value: Any) -> Any:
        # TOML has no null: "none" or "off" switches an optional stop rule off there.
        return None if isinstance(value, str) and value.strip().lower() in ("none", "null", "off") else value


class Experiment(StrictModel):
    name: str = "run"
    data: DataConfig = DataConfig()
    problem: ProblemConfig = ProblemConfig()
    algorithm: AlgorithmConfig = Field(default_factory=lambda: REGISTRY[DEFAULT_METHOD].model_validate({}))
    run: RunConfig = RunConfig()

    @model_validator(mode="before")
    @classmethod
    def _default_method(cls, raw: Any) -> Any:
        # An [algorithm] section without `method` means the default method, as a missing section does.
        if isinstance(raw, dict) and isinstance(raw.get("algorithm"), dict) and "method" not in raw["algorithm"]:
            raw = {**raw, "algorithm": {"method": DEFAULT_METHOD, **raw["algorithm"]}}
        return raw

    @field_validator("name")
    @classmethod
    def _relative_name(cls, name: str) -> str:
        # The name is the default output directory under runs/: it must stay there.
        parts = PurePosixPath(name.replace("\\", "/")).parts
        if not name.strip() or "\0" in name or name.startswith(("/", "\\")) or ".." in parts:
            raise ValueError(f"must be a relative name without '..' (it becomes runs/NAME), got {name!r}")
        if not name.isprintable():  # a newline would print a second line in every message naming the run
            raise ValueError(f"must hold no control characters (newline, tab, ...), got {name!r}")
        return name

    @model_validator(mode="after")
    def _cross_section(self) -> Experiment:
        budget = self.run.max_iterations
        k = getattr(self.algorithm, "k", None)
        if budget is not None and k is not None and k > budget:
            raise ValueError(
                f"algorithm.k: the period {k:g} exceeds run.max_iterations ({budget}): "
                "not one round would fit the budget"
            )
        # A network has no known optimum f*: its runs stop on training accuracy (Table 3), so target_gap,
        # unless given, is unset rather than the logistic default.
        if self.problem.kind == "net":
            if "target_gap" not in self.run.model_fields_set:
                self.run.target_gap = None
            elif self.run.target_gap is not None:
                raise ValueError("run.target_gap: a network has no known optimum; use run.target_accuracy")
            alg = self.algorithm
            if isinstance(alg, STLSCConfig) and alg.T1 is None and alg.T1_epochs is None:
                raise ValueError("algorithm.T1: give T1 or T1_epochs (eta_1 T_1 = 1/lambda needs a logistic lambda)")
        else:
            self._check_first_stage()
        run = self.run
        if all(v is None for v in (run.target_gap, run.target_accuracy, run.max_iterations, run.max_rounds)):
            raise ValueError(
                "run: no stop rule (target_gap, target_accuracy, max_iterations and max_rounds are all none): "
                "the run would never end; set max_iterations or max_rounds"
            )
        return self

    def _check_first_stage(self) -> None:
        """STL-SGD^sc without T1 takes T_1 = lr_T1 / (eta_1 lambda) (Section 5's eta_1 T_1 = 1/lambda): refuse
        a lr or lambda so small that T_1 overflows or exceeds any run (lambda defaults to 1/n <= 1, so
        lr_T1 / lr is then a lower bound of T_1)."""
        alg = self.algorithm
        if not isinstance(alg, STLSCConfig) or alg.T1 is not None or alg.T1_epochs is not None or alg.auto:
            return
        lam = self.problem.lam
        with np.errstate(all="ignore"):
            first = float(np.float64(alg.lr_T1) / (np.float64(alg.lr) * np.float64(lam if lam is not None else 1.0)))
        if not first <= MAX_STEPS:
            given = f"lr {alg.lr:g}" + (f", problem.lam {lam:g}" if lam is not None else ", lambda = 1/n <= 1")
            raise ValueError(
                f"algorithm.lr: T_1 = lr_T1 / (lr * lambda) would be {first:g} iterations ({given}), more than any "
                f"run can take (2^40); raise lr (or problem.lam), or give algorithm.T1"
            )

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def identity(self) -> dict[str, Any]:
        """The fields that differ from their defaults, without the display name: what makes two runs the same.

        The method is kept unless it is the default one, so that identities (and the sweep keys hashed from
        them) stay what they were before each method had its own config model.
        """
        body = self.model_dump(mode="json", exclude_defaults=True)
        body.pop("name", None)
        if self.algorithm.method != DEFAULT_METHOD:
            body.setdefault("algorithm", {})["method"] = self.algorithm.method
        return body


def _format(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    parts = list(first["loc"])
    if len(parts) >= 2 and parts[0] == "algorithm" and parts[1] in REGISTRY:
        del parts[1]  # the union's tag (the method): the user wrote algorithm.FIELD
    loc = ".".join(str(p) for p in parts)
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
        if parts[0] == "algorithm" and len(parts) == 2:
            method = (first.get("input") and None) or _method_of(err)
            if method:
                msg = f"unknown field for method {method!r} (stlsgd methods lists each method's fields)"
    elif first["type"] == "union_tag_invalid":
        loc = f"{loc}.method"
        msg = f"unknown method {first['ctx']['tag']!r}; known: {', '.join(REGISTRY)}"
    if ": " in msg and not loc.endswith(msg.split(": ", 1)[0]) and first["type"] == "value_error":
        field, msg = msg.split(": ", 1)
        loc = f"{loc}.{field}" if loc else field
    return f"{source}: {loc}: {msg}"


def _method_of(err: ValidationError) -> str | None:
    loc = err.errors()[0]["loc"]
    return str(loc[1]) if len(loc) >= 2 and loc[1] in REGISTRY else None


def parse_value(text: str) -> Any:
    """A ``--set`` value: a TOML literal (1e-4, true, "x", [1, 2]) or else the bare string; null/none -> None."""
    if text.lower() in ("null", "none"):
        return None
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(raw: dict[str, Any], overrides: list[str], source: str = "--set") -> dict[str, Any]:
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"{source}: expected key=value, got {item!r}")
        key, value = item.split("=", 1)
        node = raw
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{source}: {key}: {part} is not a section")
            node = child
        node[parts[-1]] = parse_value(value.strip())
    return raw


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (plain YAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_raw(path: Path) -> dict[str, Any]:
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise ConfigError(f"{path}: config file not found") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the name
        raise ConfigError(f"{path}: cannot read config ({getattr(exc, 'strerror', None) or exc})") from None
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):  # a FIFO or a device would block, or never end
        raise ConfigError(f"{path}: is a special file (FIFO, device or socket), not a config file")
    try:
        # utf-8-sig: a byte-order mark (which some editors write) is not part of the text.
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a config file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {exc.start})") from None
    try:
        if path.suffix == ".toml":
            raw = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml", ".json"):
            raw = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
        else:
            raise ConfigError(f"{path}: unknown config format (use .toml, .yaml or .yml)")
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML ({exc})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())  # some YAML errors span lines
        raise ConfigError(f"{path}{where}: invalid YAML ({problem})") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the config must be a table of sections, got {type(raw).__name__}")
    return raw


def validate(raw: dict[str, Any], source: str) -> Experiment:
    try:
        return Experiment.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_format(exc, source)) from None


def load_config(path: str | Path, overrides: list[str] | None = None, *, sweep_base: bool = False) -> Experiment:
    """Read, override (dotted ``key=value``) and validate an experiment config.

    ``sweep_base``: a sweep file is read as its ``base`` experiment (the data and problem its columns share).
    """
    path = Path(path)
    raw = read_raw(path)
    if "methods" in raw:  # only a sweep file has methods; its own fields would be reported one by one as unknown
        if not sweep_base:
            raise ConfigError(
                f"{path}: a sweep file (it lists methods), not an experiment config: `stlsgd sweep {path}`"
            )
        raw = raw.get("base") or {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: base: must be a table")
    return validate(apply_overrides(raw, overrides or []), str(path))


def dump_config(exp: Experiment, path: Path) -> None:
    """Save the resolved config, atomically: a half-written config.yaml would look like another run's."""
    from stlsgd.files import atomic_write

    atomic_write(path, lambda fh: fh.write(yaml.safe_dump(exp.to_dict(), sort_keys=False)))
