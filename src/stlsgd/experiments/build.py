"""From a validated config to the pieces an executor runs: dataset, partition, problem and plan."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from stlsgd.algorithms import CRPSGD, LBSGD, STLSGD, LocalSGD, Plan, SyncSGD, first_stage_length
from stlsgd.data import Dataset, Partition, load_dataset, make_partition, resolve_data_dir
from stlsgd.errors import ConfigError
from stlsgd.experiments.config import AlgorithmConfig, Experiment
from stlsgd.problems.logistic import LogisticRegression


@dataclass
class Built:
    dataset: Dataset
    partition: Partition
    problem: LogisticRegression
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


def build(exp: Experiment, data_dir: str | None = None) -> Built:
    directory = resolve_data_dir(data_dir or exp.data.data_dir)
    dataset = load_dataset(exp.data.dataset, directory)
    d = exp.data
    partition = make_partition(dataset.y, d.num_clients, d.partition, seed=d.partition_seed, s=d.s, alpha=d.alpha)
    problem = LogisticRegression(dataset.X, dataset.y, lam=exp.problem.lam, name=dataset.name)
    plan = build_plan(exp.algorithm, num_samples=dataset.n, num_clients=d.num_clients, lam=problem.lam,
                      iid_default=d.partition in ("shared", "split"))
    return Built(dataset, partition, problem, plan, directory)
