"""In-process tests of the distributed pieces: client slices, the flat-buffer all-reduce, the verdict
broadcast, collective timeouts and the drop-in's plan arithmetic, averaging and state dicts.

Several ranks are real gloo process groups on threads (see ``dist_helpers.on_thread_ranks``).
"""

from __future__ import annotations

import copy
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from dist_helpers import on_thread_ranks
from torch import nn

from stlsgd.algorithms import CRPSGD, STLSGD, Cursor, SyncSGD
from stlsgd.dropin import PlanAverager
from stlsgd.errors import ConfigError, StlsgdError
from stlsgd.executors.averaging import allreduce_mean, copy_state, gather_mean, mean_over_clients
from stlsgd.executors.distributed import (
    client_slice,
    collective_timeout,
    make_topology,
    resolve_comm_backend,
)
from stlsgd.executors.simulator import RunState
from stlsgd.experiments.config import Experiment
from stlsgd.experiments.runner import run_experiment

# --------------------------------------------------------------------------- executor pieces


@pytest.mark.parametrize(("n", "p", "sizes"), [(32, 4, [8, 8, 8, 8]), (6, 4, [2, 2, 1, 1]), (5, 5, [1] * 5)])
def test_client_slices_are_contiguous_and_cover_every_client(n: int, p: int, sizes: list[int]) -> None:
    slices = [client_slice(n, p, r) for r in range(p)]
    assert [s.stop - s.start for s in slices] == sizes
    assert [s.start for s in slices] == [0, *[s.stop for s in slices[:-1]]]
    assert slices[-1].stop == n


def test_allreduce_mean_over_uneven_ranks_equals_the_simulators_mean() -> None:
    rng = np.random.default_rng(0)
    full = {
        "w": rng.standard_normal((6, 5)),  # NumPy float64, as the logistic problem holds it
        "conv": torch.randn(6, 3, 2, generator=torch.Generator().manual_seed(1)),  # a net's float32 tensor
        "num_batches_tracked": torch.arange(6),  # an integer buffer: left alone
    }
    expected = copy_state(full)
    mean_over_clients(expected)

    def rank_fn(group: dist.ProcessGroup) -> dict:
        part = client_slice(6, group.size(), group.rank())
        local = {k: v[part].copy() if isinstance(v, np.ndarray) else v[part].clone() for k, v in full.items()}
        summed = {k: v.copy() if isinstance(v, np.ndarray) else v.clone() for k, v in local.items()}
        allreduce_mean(summed, 6, group)
        gather_mean(local, 6, group)
        return {"slice": part, "state": local, "summed": summed}

    for result in on_thread_ranks(4, rank_fn):
        part, local, summed = result["slice"], result["state"], result["summed"]
        # The gathered mean (NumPy arrays) is the simulator's, bit for bit; the all-reduced one agrees to rounding.
        assert np.array_equal(local["w"], expected["w"][part])
        assert torch.equal(local["conv"], full["conv"][part])  # gather_mean leaves torch tensors alone
        np.testing.assert_allclose(summed["w"], expected["w"][part], rtol=1e-13, atol=1e-15)
        torch.testing.assert_close(summed["conv"], expected["conv"][part], rtol=1e-6, atol=1e-7)
        assert torch.equal(summed["num_batches_tracked"], full["num_batches_tracked"][part])


def test_rank_zeros_verdict_reaches_every_rank() -> None:
    def rank_fn(group: dist.ProcessGroup) -> tuple:
        topo = make_topology(6, group)
        state = RunState(clients={}, sampler_state={}, cursor=Cursor(index=7, iteration=70).to_dict(),
                         last_eval_iteration=60)
        if topo.is_root:
            state.status, state.rounds_to_target, state.iterations_to_target = "reached", 7, 70
            state.last_eval_iteration, state.objective = 70, 0.1 + 0.2
        finished = topo.agree(state, topo.is_root)
        return topo.clients, finished, state.status, state.rounds_to_target, state.last_eval_iteration, state.objective

    results = on_thread_ranks(3, rank_fn)
    assert [r[0] for r in results] == [slice(0, 2), slice(2, 4), slice(4, 6)]
    assert all(r[1:] == (True, "reached", 7, 70, 0.1 + 0.2) for r in results)  # the objective to the last bit


def test_a_gloo_collective_times_out_when_a_peer_stalls() -> None:
    peer_may_leave = threading.Event()

    def rank_fn(group: dist.ProcessGroup) -> tuple[float, str] | None:
        if group.rank() == 1:  # alive (its sockets stay open) but never joins the collective
            peer_may_leave.wait(30)
            return None
        start = time.perf_counter()
        try:
            dist.all_reduce(torch.ones(4), group=group)
            message = "completed"
        except RuntimeError as exc:
            message = str(exc)
        finally:
            peer_may_leave.set()
        return time.perf_counter() - start, message

    elapsed, message = on_thread_ranks(2, rank_fn, timeout_s=1.0)[0]
    assert message != "completed"
    assert "timed out" in message.lower() or "timeout" in message.lower(), message
    assert 0.9 <= elapsed < 15.0


def test_backend_choice_and_timeout_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available():
        assert resolve_comm_backend("auto") == "gloo"
        with pytest.raises(StlsgdError, match="nccl needs CUDA"):
            resolve_comm_backend("nccl")
    assert resolve_comm_backend("gloo") == "gloo"
    monkeypatch.setenv("STLSGD_DIST_TIMEOUT", "12.5")
    assert collective_timeout().total_seconds() == 12.5
    monkeypatch.setenv("STLSGD_DIST_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match="STLSGD_DIST_TIMEOUT"):
        collective_timeout()


def test_dist_backend_outside_torchrun_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StlsgdError, match="torchrun --nproc_per_node"):
        run_experiment(Experiment(), tmp_path / "out", backend="dist")
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- drop-in


def _lr_before_step(opt: torch.optim.Optimizer) -> float:
    return float(opt.param_groups[0]["lr"])


def test_dropin_follows_the_plans_learning_rates_and_periods() -> None:
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=123.0)
    # Stage 1: lr 0.4, 4 steps, period 1; stage 2: lr 0.2, 8 steps, period 2; stage 3: lr 0.1, period 4.
    stl = PlanAverager(model, opt, STLSGD(lr=0.4, T1=4, k1=1.0, iid=True))
    lrs, averaged_after, stages = [], [], []
    for t in range(1, 14):
        lrs.append(_lr_before_step(opt))
        stages.append(stl.stage)
        opt.step()
        if stl.step():
            averaged_after.append(t)
    assert lrs == pytest.approx([0.4] * 4 + [0.2] * 8 + [0.1])
    assert stages == [1] * 4 + [2] * 8 + [3]
    assert averaged_after == [1, 2, 3, 4, 6, 8, 10, 12]
    assert (stl.iteration, stl.period) == (13, 4)


def test_dropin_exposes_the_plans_growing_batch() -> None:
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    stl = PlanAverager(model, opt, CRPSGD(lr=0.1, rho=2.0, batch=1, max_batch=8))
    batches = []
    for _ in range(5):
        batches.append(stl.batch_size)
        opt.step()
        stl.step()
    assert batches == [1, 2, 4, 8, 8]


def test_dropin_adds_the_proximal_gradient_and_resets_the_anchor_each_stage() -> None:
    model = nn.Linear(2, 1, bias=False)
    w0 = model.weight.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    # Stage 1 = one round of 2 steps at lr 0.5; gamma = 0.25, so the prox gradient is 4 (w - x_s).
    stl = PlanAverager(model, opt, STLSGD(lr=0.5, T1=2, k1=2.0, gamma=0.25))
    model.weight.grad = torch.zeros_like(model.weight)
    opt.step()  # w = x_s: no pull
    torch.testing.assert_close(model.weight.detach(), w0)
    with torch.no_grad():
        model.weight += 1.0
    opt.step()  # w + 1 - 0.5 * 4 * 1
    torch.testing.assert_close(model.weight.detach(), w0 - 1.0)
    assert stl.step() is False and stl.step() is True  # (first call belongs to the first opt.step)
    # Stage 2 began: x_s is the (averaged) model at the end of stage 1.
    torch.testing.assert_close(stl.state_dict()["anchor"][0], w0 - 1.0)


def _grads(model: nn.Module, step: int) -> None:
    g = torch.Generator().manual_seed(step)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)


def _continue(model: nn.Module, opt: torch.optim.Optimizer, stl: PlanAverager, start: int, steps: int) -> list:
    trace = []
    for t in range(start, start + steps):
        _grads(model, t)
        trace.append(_lr_before_step(opt))
        opt.step()
        trace.append(stl.step())
    return trace


def test_dropin_state_dict_restores_the_exact_position_in_the_plan() -> None:
    def make() -> tuple[nn.Module, torch.optim.Optimizer, PlanAverager]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
        opt = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
        return model, opt, PlanAverager(model, opt, STLSGD(lr=0.1, T1=3, k1=2.0, gamma=2.0, option=2))

    model, opt, stl = make()
    _continue(model, opt, stl, 0, 8)  # mid-round of stage 2
    # deepcopy: state dicts hold references to live tensors (parameters, momentum buffers)
    saved = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict(), "stl": stl.state_dict()})
    assert saved["stl"]["step"] > 0
    trace_a = _continue(model, opt, stl, 8, 12)

    model_b, opt_b, stl_b = make()
    model_b.load_state_dict(saved["model"])
    opt_b.load_state_dict(saved["opt"])
    stl_b.load_state_dict(saved["stl"])
    trace_b = _continue(model_b, opt_b, stl_b, 8, 12)
    assert trace_a == trace_b
    for a, b in zip(model.state_dict().values(), model_b.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(stl.state_dict()["anchor"], stl_b.state_dict()["anchor"], rtol=0, atol=0)
    with pytest.raises(ValueError, match="plan"):
        PlanAverager(nn.Linear(4, 3), torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=1.0),
                     SyncSGD(lr=0.1)).load_state_dict(saved["stl"])


def test_dropin_averages_parameters_and_batchnorm_buffers_over_the_group() -> None:
    def rank_fn(group: dist.ProcessGroup) -> dict:
        r = group.rank()
        torch.manual_seed(r)  # different initial models: construction must hand rank 0's to everyone
        model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        stl = PlanAverager(model, opt, SyncSGD(lr=0.1), group=group)
        initial = [p.detach().clone() for p in model.parameters()]
        bn = model[1]
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(r + 1.0)
            bn.running_mean.fill_(10.0 * (r + 1))
            bn.running_var.fill_((r + 1.0) ** 2)
            bn.num_batches_tracked.fill_(r)
        opt.step()  # no gradients: the step changes nothing
        first = stl.step()
        after = {k: v.clone() for k, v in model.state_dict().items()}
        model[0].weight.data = torch.full((4, 3), 3.0 * (r + 1))  # replaces the storage: must re-flatten
        opt.step()
        stl.step()
        return {"initial": initial, "first": first, "after": after, "weight": model[0].weight.detach().clone(),
                "in_sync": stl.models_in_sync()}

    ranks = on_thread_ranks(2, rank_fn)
    for a, b in zip(ranks[0]["initial"], ranks[1]["initial"]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for r, res in enumerate(ranks):
        assert res["first"] is True and res["in_sync"] is True
        after = res["after"]
        assert torch.all(after["0.weight"] == 1.5) and torch.all(after["1.bias"] == 1.5)
        assert torch.all(after["1.running_mean"] == 15.0) and torch.all(after["1.running_var"] == 2.5)
        assert int(after["1.num_batches_tracked"]) == r  # integers are not averaged
        assert torch.all(res["weight"] == 4.5)
