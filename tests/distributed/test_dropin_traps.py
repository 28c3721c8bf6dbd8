"""The drop-in's traps, each refused in one line or made right: a live DDP around the averaged module,
Accelerate's NO inside a torchrun world, stale stats after a final average, a parameter added after
construction, a bad or late ``load_state_dict``, a hand-called ``after_step`` with the hook on, per-group
learning rates under ``plan_lr``. (The live-DDP trap needs a registered group: tests/distributed/test_dropin.py's
DDP worker checks it.)"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from dist_helpers import on_thread_ranks
from torch import nn

from stlsgd.algorithms import STLSGD, LocalSGD
from stlsgd.dropin import PlanAverager
from stlsgd.errors import StlsgdError


def _step(model: nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)
    opt.step()


def test_accelerates_no_inside_a_torchrun_world_names_cpu_true(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("accelerate")
    from accelerate import DistributedType

    from stlsgd.integrations.accelerate import check_distributed_type

    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(StlsgdError, match=r"torchrun started 2 processes.*Accelerator\(cpu=True\)"):
        check_distributed_type(DistributedType.NO)
    check_distributed_type(DistributedType.MULTI_CPU)
    monkeypatch.setenv("WORLD_SIZE", "1")
    check_distributed_type(DistributedType.NO)  # one process: NO is the plain single-client loop


def test_stats_count_a_final_average_by_hand() -> None:
    def rank_fn(group: dist.ProcessGroup) -> tuple:
        model = nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        avg = PlanAverager(model, opt, LocalSGD(k=4), group=group)
        for t in range(10):  # two rounds of 4, then 2 steps of the third
            _step(model, opt, 10 * group.rank() + t)
        avg.average()  # leave with one model
        s = avg.stats
        return s.round, s.steps, s.averages, s.bytes_sent, s.ddp_bytes, avg.models_in_sync()

    model_bytes = 4 * (3 * 2 + 2)
    for res in on_thread_ranks(2, rank_fn):
        assert res == (2, 10, 3, 3 * model_bytes, 10 * model_bytes, True)


def test_a_parameter_added_after_construction_is_refused_not_silently_left_out() -> None:
    model = nn.Sequential(nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    avg = PlanAverager(model, opt, LocalSGD(k=2))
    model.add_module("head", nn.Linear(2, 2))
    with pytest.raises(StlsgdError, match=r"^model: its parameters or buffers changed \(one added"):
        avg.models_in_sync()
    _step(model, opt, 0)
    with pytest.raises(StlsgdError, match="^model: its parameters or buffers changed"):
        _step(model, opt, 1)  # the round's end: the average would miss the new layer


def test_a_moved_model_is_re_flattened_and_stays_averaged() -> None:
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    avg = PlanAverager(model, opt, LocalSGD(k=1))
    model.weight.data = model.weight.data.clone()  # storage moved (as model.to() does), same Parameter
    _step(model, opt, 0)
    assert avg.flat.intact() and avg.models_in_sync()


def _saved_after(steps: int) -> tuple[nn.Module, torch.optim.Optimizer, dict]:
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    avg = PlanAverager(model, opt, STLSGD(T1=4, k1=2.0, gamma=2.0, option=2))
    for t in range(steps):
        _step(model, opt, t)
    return model, opt, copy.deepcopy(avg.state_dict())


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda s: s.update(anchor=[torch.zeros(1), torch.zeros(2)]), "anchor[0] has shape (1,), its parameter (2, 3)"),
        (lambda s: s.update(step=-4), "step must be a whole number >= 0, got -4"),
        (lambda s: s.pop("cursor"), "the state has no cursor"),
        (lambda s: s.pop("stats"), "the state has no stats"),
        (lambda s: s.update(step=7), "step 7 is outside round 1, which has 2 steps"),
    ],
    ids=["anchor-shape", "negative-step", "no-cursor", "no-stats", "step-past-the-round"],
)
def test_a_bad_state_is_refused_in_one_line(damage, message: str) -> None:
    _, _, saved = _saved_after(3)  # mid-round: step 1 of round 1
    damage(saved)
    model = nn.Linear(3, 2)
    avg = PlanAverager(model, torch.optim.SGD(model.parameters(), lr=0.1), STLSGD(T1=4, k1=2.0, gamma=2.0, option=2))
    with pytest.raises(StlsgdError) as err:
        avg.load_state_dict(saved)
    assert str(err.value).startswith("PlanAverager.load_state_dict: ") and message in str(err.value)
    assert "\n" not in str(err.value)


def test_a_load_after_training_began_is_refused() -> None:
    _, _, saved = _saved_after(3)
    model, opt, _ = _saved_after(0)
    avg = PlanAverager(model, opt, LocalSGD(k=2))
    _step(model, opt, 0)
    with pytest.raises(StlsgdError, match="^PlanAverager.load_state_dict: training already began"):
        avg.load_state_dict(saved)


def test_after_step_by_hand_with_the_hook_on_does_not_count_twice() -> None:
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    avg = PlanAverager(model, opt, LocalSGD(k=2))
    ended = []
    for t in range(4):
        _step(model, opt, t)
        ended.append(avg.after_step())  # as a loop written for hook=False would
    assert ended == [False, True, False, True]
    assert (avg.iteration, avg.round_index) == (4, 2)


def test_plan_lr_scales_every_param_group_by_the_plans_factor() -> None:
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
    opt = torch.optim.SGD(
        [{"params": model[0].parameters(), "lr": 1e-4}, {"params": model[1].parameters(), "lr": 0.1}], lr=0.1
    )
    # Group 1 takes the plan's lr (0.05, then 0.025 in stage 2); group 0 keeps its ratio 1e-3 to it.
    PlanAverager(model, opt, STLSGD(lr=0.05, T1=2, k1=1.0), plan_lr=True, lr_group=1)
    seen = []
    for t in range(3):
        _step(model, opt, t)
        seen.append([g["lr"] for g in opt.param_groups])
    assert sum(seen, []) == pytest.approx([5e-5, 0.05, 5e-5, 0.05, 2.5e-5, 0.025])
    zero = torch.optim.SGD([{"params": model[0].parameters(), "lr": 0.0}, {"params": model[1].parameters()}], lr=0.1)
    with pytest.raises(StlsgdError, match="^plan_lr: param group 0 has lr 0.0"):
        PlanAverager(model, zero, STLSGD(lr=0.05, T1=2, k1=1.0), plan_lr=True)
