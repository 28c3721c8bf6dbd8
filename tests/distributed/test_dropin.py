"""The drop-in in real training loops: the user's learning rate and scheduler, optimizer state at averages,
DDP without extra collectives, exact resume in any order, constant cost per step, observability, bad input.

Several ranks are real gloo process groups on threads (see ``dist_helpers.on_thread_ranks``).
"""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from dist_helpers import launch_worker, on_thread_ranks
from torch import nn

from stlsgd.algorithms import CRPSGD, QSR, STLSGD, LocalSGD, LRCoupled, PostLocalSGD
from stlsgd.dropin import PlanAverager, RoundStats
from stlsgd.errors import StlsgdError


def _grads(model: nn.Module, step: int, rank: int = 0) -> None:
    g = torch.Generator().manual_seed(1000 * rank + step)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)


def _train(
    model: nn.Module, opt: torch.optim.Optimizer, start: int, steps: int, rank: int = 0, scheduler: object | None = None
) -> list[float]:
    """``steps`` optimizer steps on fixed random gradients; the lr each step used."""
    lrs = []
    for t in range(start, start + steps):
        _grads(model, t, rank)
        opt.step()
        lrs.append(float(opt.param_groups[0]["lr"]))  # what the step used (a scheduler changes it next)
        if scheduler is not None:
            scheduler.step()
    return lrs


# --------------------------------------------------------------------------- the learning rate is the user's


def test_the_users_lr_scheduler_is_left_alone_and_lr_coupled_periods_follow_it() -> None:
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, 10, 0.5)
    rounds: list[RoundStats] = []
    avg = PlanAverager(model, opt, LRCoupled(k1=2), on_round=lambda s: rounds.append(copy.copy(s)))
    lrs = _train(model, opt, 0, 40, scheduler=sched)
    assert lrs == pytest.approx([0.1] * 10 + [0.05] * 10 + [0.025] * 10 + [0.0125] * 10)  # StepLR's, untouched
    # k = k1 eta_1 / eta of each round's first step (set by StepLR before it): 2 at 0.1, 4 at 0.05, 8 at 0.025,
    # 16 at 0.0125 (the round from step 30 is still going at step 40).
    assert [r.steps for r in rounds] == [2, 4, 6, 8, 10, 14, 18, 22, 30]
    assert [r.period for r in rounds] == [2, 2, 2, 2, 2, 4, 4, 4, 8]
    assert (avg.stats.round, avg.period, avg.step_in_round) == (9, 16, 10)


def test_plan_lr_is_an_explicit_opt_in_logged_once(capsys: pytest.CaptureFixture[str]) -> None:
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=123.0)
    # Stage 1: lr 0.4, 4 steps, period 1; stage 2: lr 0.2, 8 steps, period 2; stage 3: lr 0.1, period 4.
    avg = PlanAverager(model, opt, STLSGD(lr=0.4, T1=4, k1=1.0), plan_lr=True)
    assert capsys.readouterr().err.count("plan_lr=True") == 1
    assert _train(model, opt, 0, 13) == pytest.approx([0.4] * 4 + [0.2] * 8 + [0.1])
    assert (avg.iteration, avg.period, avg.stage) == (13, 4, 3)
    with pytest.raises(StlsgdError, match="^plan_lr: the plan has no learning rate of its own"):
        PlanAverager(model, opt, LocalSGD(k=2), plan_lr=True)


def test_every_schedule_answers_in_constant_time_over_ten_thousand_rounds() -> None:
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    plan = LocalSGD(k=1)  # SyncSGD-like: a round every step
    calls = {"next": 0}
    original = plan.next_round

    def counted(*args: object, **kwargs: object):
        calls["next"] += 1
        return original(*args, **kwargs)

    plan.next_round = counted  # type: ignore[method-assign]
    avg = PlanAverager(model, opt, plan, hook=False)
    for _ in range(10_000):
        avg.after_step()
    # One question to the plan per round, whatever the round number (it used to re-seek from round 0: that would
    # be 5 x 10^7 questions here).
    assert calls["next"] == 10_000 and avg.round_index == 10_000 and avg.iteration == 10_000


def test_schedules_of_the_drop_in_family() -> None:
    def periods(plan: object, steps: int) -> list[int]:
        model = nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.04)
        seen: list[int] = []
        PlanAverager(model, opt, plan, on_round=lambda s: seen.append(s.period))
        _train(model, opt, 0, steps)
        return seen

    assert periods(PostLocalSGD(k=4, warmup=3), 11) == [1, 1, 1, 4, 4]
    assert periods(QSR(h_base=2, alpha=0.2), 50) == [25, 25]  # (0.2 / 0.04)^2 = 25 > H_base
    assert periods(CRPSGD(lr=0.1, rho=2.0, max_batch=8), 3) == [1, 1, 1]


# --------------------------------------------------------------------------- optimizer state and the group


@pytest.mark.parametrize("policy", ["average", "keep", "reset"])
def test_momentum_at_an_average_follows_the_policy(policy: str) -> None:
    def rank_fn(group: dist.ProcessGroup) -> dict:
        r = group.rank()
        torch.manual_seed(r)  # different initial models: a fresh run starts from rank 0's
        model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        avg = PlanAverager(model, opt, LocalSGD(k=3), group=group, optimizer_state=policy)
        with torch.no_grad():
            model[1].running_mean.fill_(10.0 * (r + 1))
        _train(model, opt, 0, 3, rank=r)  # one round: local steps on different gradients, then the average
        momentum = torch.cat([opt.state[p]["momentum_buffer"].reshape(-1) for p in model.parameters()])
        return {
            "state": copy.deepcopy(model.state_dict()),
            "momentum": momentum,
            "bytes": avg.stats.bytes_sent,
            "in_sync": avg.models_in_sync(),
        }

    a, b = on_thread_ranks(2, rank_fn)
    assert a["in_sync"] and b["in_sync"]
    for key in a["state"]:
        assert torch.equal(a["state"][key], b["state"][key]), key  # parameters and BN statistics
    model_bytes = 4 * (3 * 4 + 4 + 4 + 4 + 4 + 4)  # float32 weights, biases, BN weight, bias, mean, var
    if policy == "average":
        assert torch.equal(a["momentum"], b["momentum"]) and a["momentum"].abs().sum() > 0
        assert a["bytes"] == model_bytes + 4 * (12 + 4 + 4 + 4)  # the momentum rides along
    elif policy == "reset":
        assert not a["momentum"].any() and not b["momentum"].any() and a["bytes"] == model_bytes
    else:
        assert not torch.equal(a["momentum"], b["momentum"]) and a["bytes"] == model_bytes


def test_ddp_accumulation_and_amp_keep_working_without_ddps_per_step_all_reduce(tmp_path: Path) -> None:
    # Real processes: DDP needs a registered process group. The worker trains a DDP-wrapped model with two
    # micro-batches a step (the first under ddp.no_sync()), autocast and a GradScaler that skips one step.
    result = launch_worker("dropin_ddp_worker.py", tmp_path, timeout_s=180)
    assert result.returncode == 0, result.stderr[-3000:]
    a, b = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    for res in (a, b):
        assert res["ddp_grad_allreduces"] == 0  # DDP's hook was never asked to all-reduce
        assert res["counted_steps"] == 20 and res["skipped"] == 1  # 21 steps, the scaler skipped one
        assert res["averages"] == 4  # rounds of 5 counted optimizer steps
        assert res["in_sync"] is True
    assert a["weights"] == b["weights"] and a["bn_mean"] == b["bn_mean"]
    # The inner module of a live DDP was refused in one line (its all-reduce would have stayed on).
    assert a["inner_refused"] == b["inner_refused"]
    assert a["inner_refused"].startswith("model: a live DistributedDataParallel wraps this module")
    assert "DDP's per-step gradient all-reduce is switched off" in result.stderr


def test_a_group_of_one_runs_as_a_single_client() -> None:
    def rank_fn(group: dist.ProcessGroup) -> RoundStats:
        model = nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        avg = PlanAverager(model, opt, LocalSGD(k=2), group=group)
        _train(model, opt, 0, 6)
        return avg.stats

    (stats,) = on_thread_ranks(1, rank_fn)
    assert (stats.round, stats.averages, stats.bytes_sent) == (3, 0, 0)


# --------------------------------------------------------------------------- checkpoints


def _make(group: dist.ProcessGroup) -> tuple[nn.Module, torch.optim.Optimizer, object]:
    torch.manual_seed(group.rank())
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, 5, 0.5)
    return model, opt, sched


def _resume_case(load_before: bool, source: str, stop: int, policy: str = "average") -> list[dict]:
    """Train 9 + 9 steps uninterrupted, and 9 then a restore then 9; return both final states per rank."""
    plan = STLSGD(T1=6, k1=2.0, gamma=2.0, option=2)

    def rank_fn(group: dist.ProcessGroup) -> dict:
        r = group.rank()
        model, opt, sched = _make(group)
        avg = PlanAverager(model, opt, plan, group=group, optimizer_state=policy)
        _train(model, opt, 0, stop, r, sched)
        saved = copy.deepcopy(
            {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(), "avg": avg.state_dict()}
        )
        _train(model, opt, stop, 9, r, sched)
        whole = copy.deepcopy(model.state_dict())
        avg.close()
        if source == "rank0":  # the usual DDP habit: rank 0 saves, every rank loads it
            box = [saved]
            dist.broadcast_object_list(box, group_src=0, group=group)
            saved = box[0]
        model2, opt2, sched2 = _make(group)
        error = None
        try:
            if load_before:
                model2.load_state_dict(saved["model"])
                opt2.load_state_dict(saved["opt"])
                sched2.load_state_dict(saved["sched"])
                avg2 = PlanAverager(model2, opt2, plan, group=group, optimizer_state=policy)
                avg2.load_state_dict(saved["avg"])
            else:
                avg2 = PlanAverager(model2, opt2, plan, group=group, optimizer_state=policy)
                avg2.load_state_dict(saved["avg"])
                model2.load_state_dict(saved["model"])
                opt2.load_state_dict(saved["opt"])
                sched2.load_state_dict(saved["sched"])
        except StlsgdError as exc:
            error = str(exc)
        errors: list[str | None] = [None, None]
        dist.all_gather_object(errors, error, group=group)  # a refusal on one rank stops both
        if any(errors):
            return {"error": error}
        _train(model2, opt2, stop, 9, r, sched2)
        return {"whole": whole, "resumed": copy.deepcopy(model2.state_dict())}

    return on_thread_ranks(2, rank_fn)


@pytest.mark.parametrize("load_before", [True, False], ids=["load-then-construct", "construct-then-load"])
def test_per_rank_checkpoints_resume_exactly_in_either_order(load_before: bool) -> None:
    for res in _resume_case(load_before, "own", stop=9):  # step 9: mid-round of stage 2
        assert "whole" in res, res
        for key in res["whole"]:
            assert torch.equal(res["whole"][key], res["resumed"][key]), key


def test_rank_zeros_checkpoint_mid_round_is_refused_on_other_ranks() -> None:
    rank0, rank1 = _resume_case(True, "rank0", stop=9)
    # Rank 0's own state is fine, rank 1 refuses it: every rank raises the same line (no rank is left waiting).
    assert rank0["error"] == rank1["error"]
    assert rank1["error"].startswith("rank 1: PlanAverager.load_state_dict: saved by rank 0 of 2 at step 3 of a round")


def test_rank_zeros_checkpoint_at_a_round_boundary_is_exact_with_averaged_momentum() -> None:
    # Step 6 ends stage 1 (T1 = 6, k1 = 2): models and momentum agree on every rank after the average.
    for res in _resume_case(True, "rank0", stop=6):
        assert "whole" in res, res
        for key in res["whole"]:
            assert torch.equal(res["whole"][key], res["resumed"][key]), key
    rank0, rank1 = _resume_case(True, "rank0", stop=6, policy="keep")
    assert rank0["error"] == rank1["error"]
    assert "with optimizer_state='keep' each rank's momentum differs" in rank1["error"]


def test_a_half_loaded_checkpoint_is_refused_rather_than_overwritten() -> None:
    def rank_fn(group: dist.ProcessGroup) -> str:
        model, opt, sched = _make(group)
        avg = PlanAverager(model, opt, LocalSGD(k=4), group=group)
        _train(model, opt, 0, 2, group.rank(), sched)
        saved = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict()})
        avg.close()
        model2, opt2, _ = _make(group)
        model2.load_state_dict(saved["model"])
        opt2.load_state_dict(saved["opt"])
        PlanAverager(model2, opt2, LocalSGD(k=4), group=group)  # the averager's own state forgotten
        with pytest.raises(StlsgdError, match="averager's state was not restored"):
            _train(model2, opt2, 2, 1, group.rank())
        return "ok"

    assert on_thread_ranks(2, rank_fn) == ["ok", "ok"]


def test_the_proximal_anchor_is_the_model_at_the_start_of_each_stage() -> None:
    model = nn.Linear(2, 1, bias=False)
    w0 = model.weight.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    # Stage 1 = one round of 2 steps; gamma = 0.25, so the prox gradient is 4 (w - x_s).
    avg = PlanAverager(model, opt, STLSGD(T1=2, k1=2.0, gamma=0.25))
    model.weight.grad = torch.zeros_like(model.weight)
    opt.step()  # w = x_s: no pull
    torch.testing.assert_close(model.weight.detach(), w0)
    with torch.no_grad():
        model.weight += 1.0
    opt.step()  # w + 1 - 0.5 * 4 * 1
    torch.testing.assert_close(model.weight.detach(), w0 - 1.0)
    opt.step()  # stage 2 begins: x_s is the model at the end of stage 1, so no pull again
    torch.testing.assert_close(avg.state_dict()["anchor"][0], w0 - 1.0)


# --------------------------------------------------------------------------- observability


def test_rounds_are_reported_by_callback_log_and_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = nn.Linear(10, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: list[RoundStats] = []
    avg = PlanAverager(
        model,
        opt,
        LocalSGD(k=4),
        on_round=lambda s: seen.append(copy.copy(s)),
        log_every=2,
        csv=tmp_path / "rounds.csv",
    )
    _train(model, opt, 0, 16)
    assert [s.round for s in seen] == [1, 2, 3, 4] and [s.steps for s in seen] == [4, 8, 12, 16]
    assert seen[-1].ddp_bytes == 16 * 110 * 4  # a per-step DDP sends the model's gradients every step
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in lines] == ["stlsgd round 2", "stlsgd round 4"]
    rows = list(csv.DictReader(open(tmp_path / "rounds.csv")))
    assert [int(r["round"]) for r in rows] == [1, 2, 3, 4] and float(rows[-1]["lr"]) == 0.1
    assert avg.stats.round == 4


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: STLSGD(T1=10, k1=0.5), "k1: must be >= 1"),
        (lambda: STLSGD(T1=10, k1=2, lr=-0.1), "lr: must be a positive finite number"),
        (lambda: LRCoupled(k1=0), "k1: must be >= 1"),
        (lambda: LocalSGD(k=0), "k: must be a positive finite number"),
        (lambda: QSR(h_base=2, alpha=float("inf")), "alpha: must be a positive finite number"),
        (lambda: PostLocalSGD(k=4, warmup=-1), "warmup: must be >= 0 steps"),
    ],
)
def test_bad_schedules_name_the_argument(make, message: str) -> None:
    with pytest.raises(ValueError) as err:
        make()
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_bad_averager_arguments_name_the_argument() -> None:
    opt = torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)
    with pytest.raises(StlsgdError, match="^model: has no floating-point parameters to average$"):
        PlanAverager(nn.Module(), opt, LocalSGD(k=2))
    for kwargs, message in (
        ({"optimizer_state": "sum"}, "optimizer_state: must be"),
        ({"log_every": 0}, "log_every: must be >= 1 round"),
        ({"lr_group": 3}, "lr_group: the optimizer has 1 param groups"),
    ):
        with pytest.raises(StlsgdError, match=f"^{message}"):
            PlanAverager(nn.Linear(1, 1), opt, LocalSGD(k=2), **kwargs)
