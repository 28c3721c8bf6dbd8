"""StlsgdLocalSGD: any plan in a Hugging Face Accelerate loop, as accelerate.local_sgd.LocalSGD is used.

Two real processes under torchrun (MULTI_CPU, gloo, DDP, gradient accumulation); one process (NO); and the
distributed types it refuses.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator, DistributedType
from adapter_helpers import HERE, ranks, torchrun
from torch import nn

from stlsgd.algorithms import LocalSGD
from stlsgd.errors import StlsgdError
from stlsgd.integrations.accelerate import StlsgdLocalSGD


def test_two_processes_average_parameters_and_bn_buffers_at_the_plans_rounds(tmp_path: Path) -> None:
    result = torchrun(HERE / "accelerate_worker.py", tmp_path)
    a, b = ranks(tmp_path)
    assert a["type"] == b["type"] == "MULTI_CPU" and a["world"] == 2
    assert a["ddp_grad_allreduces"] == b["ddp_grad_allreduces"] == 0  # only the averages communicate
    p, q = a["phase1"], b["phase1"]
    # STLSGD(T1=4, k1=1) by hand: stage 1 = 4 rounds of 1 step; stage 2 (T 8, k 2) = rounds ending at steps 6, 8,
    # 10, 12; stage 3 (T 16, k 4) would end its first round at 16. 30 micro-batches with gradient accumulation 2 =
    # 15 optimizer steps: 8 rounds, then steps 13-15 are mid-round, so leaving the context averages once more.
    expected = [
        (1, 1, 1, 1),
        (2, 1, 1, 2),
        (3, 1, 1, 3),
        (4, 1, 1, 4),
        (5, 2, 2, 6),
        (6, 2, 2, 8),
        (7, 2, 2, 10),
        (8, 2, 2, 12),
    ]
    for res in (p, q):
        assert [(r["round"], r["stage"], r["period"], r["steps"]) for r in res["rounds"]] == expected
        assert res["calls"] == 30 and res["iteration"] == 15  # step() counts optimizer steps, not micro-batches
        assert res["mid_round_at_exit"] and res["averages"] == 8 + 1 and res["in_sync"]
        assert (res["sync_before"], res["sync_inside"], res["sync_after"]) == (True, False, True)
    for ra, rb in zip(p["rounds"], q["rounds"]):  # right after each average: parameters AND BN buffers agree
        assert ra["state"] == rb["state"]
        assert any(k.endswith("running_mean") for k in ra["state"])
    assert p["final"] == q["final"]  # the exit's average
    # Between averages the ranks' models differ (each trains on its own data): the averages do the syncing.
    assert any(sa["state"] != sb["state"] for sa, sb in zip(p["steps"], q["steps"]) if not sa["boundary"])
    averaged_at = [s["iteration"] for s in p["steps"] if s["averaged"]]
    assert averaged_at == [1, 2, 3, 4, 6, 8, 10, 12]
    # Local SGD k = 3 for 12 optimizer steps: 4 averages, ending on a boundary, so no extra one at exit.
    for res in (a["phase2"], b["phase2"]):
        assert (res["iteration"], res["rounds"], res["averages"], res["in_sync"]) == (12, 4, 4, True)
    assert a["phase2"]["final"] == b["phase2"]["final"]
    assert "DDP's per-step gradient all-reduce is switched off" in result.stderr


def test_one_process_counts_rounds_and_averaging_is_the_identity() -> None:
    accelerator = Accelerator(cpu=True)
    assert accelerator.distributed_type == DistributedType.NO
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    with StlsgdLocalSGD(accelerator, model, optimizer, LocalSGD(k=2)) as local_sgd:
        ended = []
        for _ in range(5):
            accelerator.backward(model(torch.randn(8, 3)).pow(2).mean())
            optimizer.step()
            optimizer.zero_grad()
            ended.append(local_sgd.step())
        local_sgd.step()  # no optimizer step since the last call: nothing to count
    assert ended == [False, True, False, True, False]
    stats = local_sgd.averager.stats
    assert (local_sgd.averager.iteration, stats.round, stats.averages, stats.bytes_sent) == (5, 2, 0, 0)
    with StlsgdLocalSGD(accelerator, model, optimizer, LocalSGD(k=2), enabled=False) as off:
        off.step()
    assert off.averager is None and off.num_steps == 1


@pytest.mark.parametrize(
    "kind", [DistributedType.DEEPSPEED, DistributedType.FSDP, DistributedType.XLA, DistributedType.MEGATRON_LM]
)
def test_unsupported_distributed_types_are_refused_in_one_line(kind: DistributedType) -> None:
    model = nn.Linear(2, 1)
    stub = SimpleNamespace(distributed_type=kind)  # what the adapter reads of the Accelerator
    with pytest.raises(StlsgdError) as err:
        StlsgdLocalSGD(stub, model, torch.optim.SGD(model.parameters(), lr=0.1), LocalSGD(k=2))
    message = str(err.value)
    assert message.startswith(f"StlsgdLocalSGD: Accelerate's distributed type {kind.value} is not supported")
    assert "\n" not in message and "MULTI_CPU" in message


def test_calling_step_after_several_optimizer_steps_is_refused() -> None:
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    local_sgd = StlsgdLocalSGD(SimpleNamespace(distributed_type=DistributedType.NO), model, optimizer, LocalSGD(k=4))
    for _ in range(2):
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
    with pytest.raises(StlsgdError, match="^StlsgdLocalSGD.step: the optimizer stepped 2 times since the last call"):
        local_sgd.step()
    local_sgd.close()


def test_drift_passes_through_to_the_averager() -> None:
    # One process: c is its own c_i, so the correction is 0; the control variate is still kept and saved.
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    kind = SimpleNamespace(distributed_type=DistributedType.NO)
    with StlsgdLocalSGD(kind, model, optimizer, LocalSGD(k=2), drift=True) as local_sgd:
        for _ in range(2):
            model(torch.ones(1, 2)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            local_sgd.step()
        saved = local_sgd.state_dict()
    assert local_sgd.averager is not None and local_sgd.averager.drift
    # The round's gradients were all ones (d/dw of w.x + b at x = 1): their lr-weighted mean is 1.
    assert saved["drift"] and [c.tolist() for c in saved["control"]] == [[[1.0, 1.0]], [1.0]]
