"""The averager's checkpoint: its format, and the checks that refuse (in one line) a state that cannot resume
exactly -- another plan, a missing key, a negative step, another rank's state mid-round, per-rank state
(momentum kept per rank, drift's control variates) from another rank, tensors of the wrong shape, a load after
training began."""

from __future__ import annotations

from typing import Any

import torch

from stlsgd.errors import StlsgdError

STATE_FORMAT = "stlsgd-dropin"
STATE_VERSION = 3  # 3: drift correction's control variates and the round's learning-rate sums
WHO = "PlanAverager.load_state_dict"
# Keys a version-2 state lacks, and what they meant then.
_V2_DEFAULTS: dict[str, Any] = {"drift": False, "control": None, "control_mean": None, "lr_sums": None}
REQUIRED = (
    "plan",
    "cursor",
    "step",
    "feedback",
    "objective",
    "anchor",
    "start",
    "outer_momentum",
    "stats",
    "rank",
    "world_size",
    "optimizer_state",
    *_V2_DEFAULTS,
)


def refuse(text: str) -> StlsgdError:
    return StlsgdError(f"{WHO}: {text}")


def upgrade(state: Any) -> dict[str, Any]:
    """``state`` as this version reads it, or a one-line refusal (not a PlanAverager state, a missing key)."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise refuse("not a PlanAverager state (or one of an older stlsgd)")
    if state.get("version") == 2:
        # Version 2 kept the last round's feedback at a boundary too; only a mid-round state's settled the round.
        state = {**_V2_DEFAULTS, **state, "feedback": state.get("feedback") if state.get("step") else None}
    elif state.get("version") != STATE_VERSION:
        raise refuse(f"state version {state.get('version')!r}, this stlsgd reads {STATE_VERSION} (and 2)")
    missing = [k for k in REQUIRED if k not in state]
    if missing:
        raise refuse(f"the state has no {', '.join(missing)}: save it with PlanAverager.state_dict()")
    return state


def check_owner(state: dict[str, Any], *, rank: int, world: int, keeps_moments: bool, drift: bool) -> None:
    """Refuse another rank's state where this rank's own is needed."""
    if bool(state["drift"]) != drift:
        raise refuse(f"the state was saved with drift={bool(state['drift'])}, this averager has drift={drift}")
    foreign = state["rank"] != rank or state["world_size"] != world
    if not foreign:
        return
    if state["step"] != 0:
        raise refuse(
            f"saved by rank {state['rank']} of {state['world_size']} at step {state['step']} of a round; the other "
            "ranks' local models are not in it, so this restore cannot be exact: save per-rank checkpoints, or "
            "save when averager.at_boundary (docs/distributed.md)"
        )
    if keeps_moments:
        raise refuse(
            f"saved by rank {state['rank']}, and with optimizer_state='keep' each rank's momentum differs: save "
            "per-rank checkpoints, or use optimizer_state='average'"
        )
    if drift:
        raise refuse(
            f"saved by rank {state['rank']}, and with drift=True each rank's control variate differs: save "
            "per-rank checkpoints"
        )


def tensors_like(tensors: Any, params: list[torch.Tensor], what: str) -> list[torch.Tensor] | None:
    """Copies of the saved ``tensors`` on the parameters' devices and dtypes; refused unless one per parameter,
    each of its parameter's shape."""
    if tensors is None:
        return None
    if not isinstance(tensors, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise refuse(f"{what} must be a list of tensors")
    if len(tensors) != len(params):
        raise refuse(f"{what} holds {len(tensors)} tensors, the model has {len(params)} parameters")
    for i, (t, p) in enumerate(zip(tensors, params)):
        if t.shape != p.shape:
            raise refuse(f"{what}[{i}] has shape {tuple(t.shape)}, its parameter {tuple(p.shape)}")
    return [t.detach().to(p.device, p.dtype).clone() for t, p in zip(tensors, params)]


def copies(tensors: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
    return None if tensors is None else [t.detach().clone() for t in tensors]
