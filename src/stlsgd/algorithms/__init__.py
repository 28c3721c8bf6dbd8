"""Algorithms as plans of communication rounds; they never touch tensors or processes.

Importing this package registers every method (:mod:`stlsgd.algorithms.registry`).
"""

from stlsgd.algorithms.baselines import CRPSGD, LBSGD, LocalSGD, SyncSGD
from stlsgd.algorithms.plan import NO_FEEDBACK, Cursor, Feedback, InverseTime, Plan, Round
from stlsgd.algorithms.registry import REGISTRY, MethodConfig, PlanContext
from stlsgd.algorithms.stl_sgd import STLSGD, first_stage_length

__all__ = ["CRPSGD", "LBSGD", "NO_FEEDBACK", "REGISTRY", "STLSGD", "Cursor", "Feedback", "InverseTime", "LocalSGD",
           "MethodConfig", "Plan", "PlanContext", "Round", "SyncSGD", "first_stage_length"]
