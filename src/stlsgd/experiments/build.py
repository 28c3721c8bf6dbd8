"""From a validated config to the pieces an executor runs: dataset, partition, problem and plan."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stlsgd.algorithms import CRPSGD, LBSGD, STLSGD, LocalSGD, Plan, SyncSGD, first_stage_length
from stlsgd.data import Dataset, Partition, load_dataset, make_partition, resolve_data_dir
from stlsgd.errors import ConfigError
from stlsgd.experiments.config import AlgorithmConfig, Experiment
from stlsgd.problems.logistic import LogisticRegression
from stlsgd.problems.neural import NeuralNetProblem


@dataclass
class Built:
    dataset: Dataset
    partition: Partition
    problem: LogisticRegression | NeuralNetProblem
    plan: Plan
    data_dir: Path


def build_plan(alg: AlgorithmConfig, *, num_samples: int, num_clients: int, lam: float, iid_default: bool) -> Plan:
    """The method's plan of rounds; T_1 from T1, T1_epochs or eta_1 T_1 = lr_T1/lambda (Section 5)."""
    m = alg.method
    if m == "sync_sgd":
        return SyncSGD(lr=alg.lr, lr_decay=alg.lr_decay, batch=alg.batch)
    if m == "lb_sgd":
        return LBSGD(lr=alg.lr, lr_decay=alg.lr_decay, batch=alg.batch)
    if m == "local_sgd":
        return LocalSGD(lr=alg.lr, k=int(alg.k), batch=alg.batch, lr_decay=alg.lr_decay)
    if m == "cr_psgd":
        return CRPSGD(lr=alg.lr, rho=alg.rho, batch=alg.batch, max_batch=alg.max_batch, lr_decay=alg.lr_decay,
                      grow=alg.grow, samples_per_epoch=num_samples, num_clients=num_clients)
    if alg.T1 is not None:
        T1 = alg.T1
    elif alg.T1_epochs is not None:
        T1 = max(int(math.ceil(alg.T1_epochs * num_samples / (num_clients * alg.batch))), 1)
    elif m == "stl_sc":
        T1 = first_stage_length(alg.lr, lam, alg.lr_T1)
    else:
        raise ConfigError("algorithm.T1: stl_nc needs the first stage length (T1 or T1_epochs)")
    return STLSGD(lr=alg.lr, T1=T1, k1=alg.k, iid=iid_default if alg.iid is None else alg.iid,
                  option=alg.option if m == "stl_nc" else 1, gamma=alg.gamma if m == "stl_nc" else None,
                  batch=alg.batch, name=m)


def net_problem(exp: Experiment, dataset: Dataset) -> NeuralNetProblem:
    """A network on an image dataset (Section 5), the images standardised per channel unless disabled."""
    from stlsgd.data import normalize_channels
    from stlsgd.problems.nets import make_model

    p = exp.problem
    if not (isinstance(dataset.X, np.ndarray) and dataset.X.ndim == 4):
        raise ConfigError(f"data.dataset: {dataset.name} is not an image dataset; problem.kind = 'net' needs "
                          "(n, C, H, W) images (mnist10, cifar10, cifar10-png200)")
    X = normalize_channels(dataset.X)[0] if p.normalise else dataset.X
    _, channels, height, _ = X.shape
    try:
        model = make_model(p.model, channels, dataset.num_classes, height)
        return NeuralNetProblem(model, X, dataset.y, device=p.device, eval_batch=p.eval_batch, momentum=p.momentum,
                                weight_decay=p.weight_decay, name=dataset.name)
    except ValueError as exc:
        raise ConfigError(f"problem: {exc}") from None


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
    if exp.problem.kind == "net":
        problem: LogisticRegression | NeuralNetProblem = net_problem(exp, dataset)
    else:
        problem = LogisticRegression(dataset.X, dataset.y, lam=exp.problem.lam, name=dataset.name)
    plan = build_plan(exp.algorithm, num_samples=dataset.n, num_clients=d.num_clients, lam=problem.lam,
                      iid_default=d.partition in ("shared", "split"))
    return Built(dataset, partition, problem, plan, directory)
