"""From a validated config to the pieces an executor runs: dataset, partition, problem, plan and stop rule.

Everything here reads inputs and checks them; nothing writes. A bad input fails here, before a run touches
its output directory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp

from stlsgd.algorithms import MethodConfig, Plan, PlanContext
from stlsgd.data import Dataset, Partition, load_dataset, make_partition, resolve_data_dir
from stlsgd.data.partition import IID_MODES
from stlsgd.errors import ConfigError
from stlsgd.executors.averaging import OuterNesterov
from stlsgd.executors.simulator import PLAIN, RoundRule, StopRule
from stlsgd.experiments.config import Experiment
from stlsgd.problems.logistic import LogisticRegression

if TYPE_CHECKING:  # torch is loaded only for a network problem (net_problem)
    from stlsgd.problems.neural import NeuralNetProblem

# Newton's method for the exact optimum f* solves with a dense d x d Hessian.
MAX_NEWTON_FEATURES = 20_000


@dataclass
class Built:
    dataset: Dataset
    partition: Partition
    problem: LogisticRegression | NeuralNetProblem
    plan: Plan
    data_dir: Path
    #: Hash of the loaded data and its partition: a checkpoint resumes only on the data it was made on.
    fingerprint: str
    rule: RoundRule = PLAIN
    #: The method's settings as run (``algorithm.auto`` resolved).
    algorithm: MethodConfig | None = None
    #: Where ``algorithm.auto`` runs the clients' models' choice, the rounds they gave it (else None): summary.json
    #: keeps it beside the rounds the run took, and a run that ends at its budget says the model was wrong there.
    auto_model_rounds: int | None = None


def stop_rule(exp: Experiment, has_optimum: bool) -> StopRule:
    r = exp.run
    return StopRule(
        target_gap=r.target_gap if has_optimum else None,
        target_accuracy=r.target_accuracy,
        max_iterations=r.max_iterations,
        max_rounds=r.max_rounds,
        eval_every=r.eval_every,
        eval_every_iterations=r.eval_every_iterations,
    )


def round_rule(alg: MethodConfig) -> RoundRule:
    """Drift correction and the outer step of the config's method (local methods only)."""
    outer_lr = getattr(alg, "outer_lr", None)
    outer_momentum = getattr(alg, "outer_momentum", 0.0)  # local methods only, with outer_lr
    return RoundRule(
        drift=bool(getattr(alg, "drift", False)),  # stl_sc's unset drift (None) is off
        drift_window=getattr(alg, "drift_window", None),
        drift_share=getattr(alg, "drift_share", None),
        outer=None if outer_lr is None else OuterNesterov(lr=outer_lr, momentum=outer_momentum),
    )


def plan_context(exp: Experiment, num_samples: int, lam: float | None) -> PlanContext:
    return PlanContext(
        num_samples=num_samples,
        num_clients=exp.data.num_clients,
        lam=lam,
        iid=exp.data.partition in IID_MODES,
        max_iterations=exp.run.max_iterations,
    )


def net_problem(exp: Experiment, dataset: Dataset) -> NeuralNetProblem:
    """A network on an image dataset (Section 5), the images standardised per channel unless disabled."""
    from stlsgd.data import normalize_channels
    from stlsgd.problems.nets import make_model
    from stlsgd.problems.neural import NeuralNetProblem
    from stlsgd.threads import torch_threads

    torch_threads()  # this process's share of the cores (a sweep worker's, a rank's), now that torch is in

    p = exp.problem
    if not (isinstance(dataset.X, np.ndarray) and dataset.X.ndim == 4):
        raise ConfigError(
            f"data.dataset: {dataset.name} is not an image dataset; problem.kind = 'net' needs "
            "(n, C, H, W) images (mnist10, cifar10, cifar10-png200)"
        )
    X = normalize_channels(dataset.X)[0] if p.normalise else dataset.X
    _, channels, height, _ = X.shape
    try:
        model = make_model(p.model, channels, dataset.num_classes, height)
        return NeuralNetProblem(
            model,
            X,
            dataset.y,
            device=p.device,
            eval_batch=p.eval_batch,
            momentum=p.momentum,
            weight_decay=p.weight_decay,
            name=dataset.name,
        )
    except ValueError as exc:
        raise ConfigError(f"problem: {exc}") from None


def logistic_problem(exp: Experiment, dataset: Dataset, partition: Partition) -> LogisticRegression:
    """Eq. 8 on a binary svmlight dataset, after checking that its model and f* fit this machine; its objective the
    clients' mean (:meth:`~stlsgd.data.Partition.row_weights`)."""
    if not sp.issparse(dataset.X) or dataset.num_classes != 2:
        raise ConfigError(
            f"problem.kind: logistic regression needs a two-class svmlight dataset; {dataset.name} "
            f"is {'an image' if not sp.issparse(dataset.X) else 'a multi-class'} dataset "
            "(use problem.kind = 'net')"
        )
    d, clients = dataset.d, exp.data.num_clients
    need = 8 * d * clients * 2  # the stacked client models and one working copy
    if exp.run.target_gap is not None:
        if d > MAX_NEWTON_FEATURES:
            raise ConfigError(
                f"run.target_gap: the exact optimum f* needs Newton's method with a dense {d} x {d} "
                f"Hessian ({8 * d * d / 2**30:.1f} GiB), more than stlsgd computes "
                f'(d <= {MAX_NEWTON_FEATURES}); set run.target_gap = "none"'
            )
        need += 8 * d * d
    available = _memory_bytes()
    if available and need > available:
        raise ConfigError(
            f"data.dataset: {dataset.name} has d = {d} features: {clients} client models need "
            f"{need / 2**30:.1f} GiB, more than this machine's {available / 2**30:.1f} GiB"
        )
    weights = partition.row_weights(dataset.n)
    return LogisticRegression(dataset.X, dataset.y, lam=exp.problem.lam, name=dataset.name, weights=weights)


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def model_bytes_for(exp: Experiment) -> int | None:
    """Bytes of one client's model (what it sends a round, drift correction's control variate aside), known
    without loading the data for the named datasets; None for a dataset stlsgd does not know (a file)."""
    from stlsgd.data import DATASETS

    spec = DATASETS.get(exp.data.dataset)
    if spec is None:
        return None
    if exp.problem.kind == "logistic":
        return None if spec.features is None else 8 * spec.features
    if spec.image is None:
        return None
    from stlsgd.problems.nets import make_model

    channels, side, classes = spec.image
    model = make_model(exp.problem.model, channels, classes, side)
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()] if t.is_floating_point())


def fingerprint(dataset: Dataset, partition: Partition) -> str:
    """BLAKE2 hash of the loaded rows, labels and partition (a second or less on the paper's datasets)."""
    h = hashlib.blake2b(digest_size=16)
    X = dataset.X
    arrays = (X.indptr, X.indices, X.data) if isinstance(X, sp.spmatrix | sp.sparray) else (X,)
    for a in (*arrays, dataset.y, partition.rows, partition.starts, partition.sizes):
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(a.data)
    return h.hexdigest()


def build(exp: Experiment, data_dir: str | None = None) -> Built:
    directory = resolve_data_dir(data_dir or exp.data.data_dir)
    dataset = load_dataset(exp.data.dataset, directory)
    d = exp.data
    if d.max_samples is not None and d.max_samples < dataset.n:
        dataset = Dataset(dataset.name, dataset.X[: d.max_samples], dataset.y[: d.max_samples], dataset.num_classes)
    try:
        partition = make_partition(dataset.y, d.num_clients, d.partition, seed=d.partition_seed, s=d.s, alpha=d.alpha)
    except ConfigError as err:  # make_partition names its own arguments; the user wrote them under [data]
        raise ConfigError(f"data.{err}") from None
    problem: LogisticRegression | NeuralNetProblem
    problem = net_problem(exp, dataset) if exp.problem.kind == "net" else logistic_problem(exp, dataset, partition)
    unplanned = Built(dataset, partition, problem, None, directory, fingerprint(dataset, partition))  # type: ignore[arg-type]
    return with_plan(exp, unplanned)  # the plan needs the built data (its size sets T_1 in epochs)


def with_plan(exp: Experiment, built: Built) -> Built:
    """``built`` with the plan and round rule of ``exp``'s method; ``algorithm.auto`` settles its settings from
    the data first (:mod:`stlsgd.experiments.suggest`), and ``built.algorithm`` records what ran."""
    alg: MethodConfig = exp.algorithm  # the registry's union: every member is a MethodConfig
    model_rounds = None
    if getattr(alg, "auto", False):
        from stlsgd.costmodel import parse_network
        from stlsgd.experiments.suggest import method_config, proposal_for

        network = getattr(alg, "network", None)
        proposal = proposal_for(exp, built, parse_network(network) if network else None)[1]
        alg, model_rounds = method_config(alg, proposal), proposal.get("model_rounds")
    plan = alg.plan(plan_context(exp, built.dataset.n, built.problem.lam))
    return dataclasses.replace(built, plan=plan, rule=round_rule(alg), algorithm=alg, auto_model_rounds=model_rounds)
