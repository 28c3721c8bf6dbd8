"""Algorithms as plans of communication rounds; they never touch tensors or processes.

Importing this package registers every method (:mod:`stlsgd.algorithms.registry`).
"""

from stlsgd.algorithms.baselines import CRPSGD, LBSGD, LocalSGD, SyncSGD
from stlsgd.algorithms.plan import NO_FEEDBACK, Cosine, Cursor, Feedback, InverseTime, Plan, Round, StepDecay
from stlsgd.algorithms.registry import REGISTRY, MethodConfig, PlanContext
from stlsgd.algorithms.stl_sgd import STLSGD, STLSGDStationary, first_stage_length

# isort: split
# The paper's methods register first (the registry's order is the order `stlsgd methods` lists them in).
from stlsgd.algorithms.schedules import QSR, AdaComm, LRCoupled, PostLocalSGD

__all__ = [
    "CRPSGD",
    "LBSGD",
    "NO_FEEDBACK",
    "QSR",
    "REGISTRY",
    "STLSGD",
    "STLSGDStationary",
    "AdaComm",
    "Cosine",
    "Cursor",
    "Feedback",
    "InverseTime",
    "LRCoupled",
    "LocalSGD",
    "MethodConfig",
    "Plan",
    "PlanContext",
    "PostLocalSGD",
    "Round",
    "StepDecay",
    "SyncSGD",
    "first_stage_length",
]
