"""Algorithms as plans of communication rounds; they never touch tensors or processes."""

from stlsgd.algorithms.baselines import CRPSGD, LBSGD, LocalSGD, SyncSGD
from stlsgd.algorithms.plan import Plan, Round
from stlsgd.algorithms.stl_sgd import STLSGD, first_stage_length

__all__ = ["CRPSGD", "LBSGD", "LocalSGD", "Plan", "Round", "STLSGD", "SyncSGD", "first_stage_length"]
