"""In-process tests of the distributed pieces: client slices, the averages over a group, the verdict
broadcast, collective timeouts and the backend choice.

Several ranks are real gloo process groups on threads (see ``dist_helpers.on_thread_ranks``).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from dist_helpers import on_thread_ranks

from stlsgd.algorithms import Cursor
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
        state = RunState(
            clients={}, sampler_state={}, cursor=Cursor(index=7, iteration=70).to_dict(), last_eval_iteration=60
        )
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
