"""StlsgdCallback: any plan in a Lightning Trainer(strategy="ddp", devices=2, accelerator="cpu") fit, resumable.

One launch of lightning_worker.py (Lightning starts the second rank) runs three fits: from scratch with
checkpoints, a resume from a round boundary, and a resume from the middle of a round.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from adapter_helpers import HERE, PYTHON, free_port, ranks, run
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from stlsgd.algorithms import STLSGD, LocalSGD
from stlsgd.dropin import PlanAverager
from stlsgd.errors import StlsgdError

# lightning is imported by the tests that use it, and they all run on one xdist worker: importing it at collection
# cost every worker three seconds.
pytestmark = pytest.mark.xdist_group("test_lightning")


@pytest.fixture(scope="module")
def ddp_fits(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], str]:
    out = tmp_path_factory.mktemp("lightning")
    result = run([PYTHON, HERE / "lightning_worker.py", out], MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return ranks(out), result.stderr


def _rounds(fit: dict) -> list[tuple[int, int, int, int]]:
    return [(r["round"], r["stage"], r["period"], r["steps"]) for r in fit["rounds"]]


def _check_synced(a: dict, b: dict) -> None:
    """Right after every average both ranks hold the same parameters AND BatchNorm buffers; between averages they
    differ (each rank trains on its own shard); DDP never all-reduced a gradient."""
    assert len(a["rounds"]) == len(b["rounds"])
    for ra, rb in zip(a["rounds"], b["rounds"]):
        assert ra["state"] == rb["state"]
        assert "net.1.running_mean" in ra["state"] and "net.1.running_var" in ra["state"]
    assert any(sa["state"] != sb["state"] for sa, sb in zip(a["steps"], b["steps"]) if not sa["boundary"])
    assert a["final"] == b["final"] and a["in_sync"] and b["in_sync"]
    assert a["grad_allreduces"] == b["grad_allreduces"] == 0


def test_ddp_fit_averages_parameters_and_bn_buffers_at_the_plans_rounds(ddp_fits: tuple[list[dict], str]) -> None:
    (a, b), stderr = ddp_fits
    first, other = a["first"], b["first"]
    # STLSGD(T1=4, k1=1) by hand: stage 1 = rounds ending at optimizer steps 1, 2, 3, 4 (period 1); stage 2
    # (T 8, k 2) = rounds ending at 6, 8, 10. max_steps=10 (accumulate_grad_batches=2: 20 batches) ends on the
    # boundary, so no extra average at the end.
    assert (
        _rounds(first)
        == _rounds(other)
        == [(1, 1, 1, 1), (2, 1, 1, 2), (3, 1, 1, 3), (4, 1, 1, 4), (5, 2, 2, 6), (6, 2, 2, 8), (7, 2, 2, 10)]
    )
    assert (first["global_step"], first["iteration"], first["averages"]) == (10, 10, 7)
    _check_synced(first, other)
    assert "DDP's per-step gradient all-reduce is switched off" in stderr


def test_a_resumed_fit_continues_the_stage_and_period(ddp_fits: tuple[list[dict], str]) -> None:
    (a, b), _ = ddp_fits
    second, other = a["second"], b["second"]
    # From the step-10 checkpoint (a round boundary): stage 2's last round ends at 12, stage 3 (T 16, k 4) has
    # rounds ending at 16 and 20; steps 21-22 are mid-round, so the end of the fit averages once more.
    assert _rounds(second) == _rounds(other) == [(8, 2, 2, 12), (9, 3, 4, 16), (10, 3, 4, 20)]
    assert (second["global_step"], second["iteration"], second["stage"], second["period"]) == (22, 22, 3, 4)
    assert second["averages"] == 7 + 3 + 1  # the checkpoint's 7, three rounds, the end-of-fit average
    _check_synced(second, other)


def test_a_fit_resumed_from_the_middle_of_a_round_finishes_that_round(ddp_fits: tuple[list[dict], str]) -> None:
    (a, b), stderr = ddp_fits
    third, other = a["third"], b["third"]
    # The step-5 checkpoint is 1 step into round 5 (steps 5-6): it ends at 6, round 6 at 8.
    assert _rounds(third) == _rounds(other) == [(5, 2, 2, 6), (6, 2, 2, 8)]
    assert (third["global_step"], third["iteration"], third["averages"]) == (8, 8, 4 + 2)
    _check_synced(third, other)
    # said once, by rank 0; the boundary resume of the second fit (momentum averaged) is exact and says nothing
    assert stderr.count("stlsgd: resuming") == 1
    assert (
        "stlsgd: resuming from rank 0's checkpoint taken at step 1 of round 5: every process continues from "
        "that rank's model and optimizer state (the middle of a round; not exact"
    ) in stderr


# --------------------------------------------------------------------------- one process, refusals


def _lightning() -> tuple[Any, Any]:
    """``lightning.pytorch`` and :class:`StlsgdCallback` (which subclasses lightning's Callback)."""
    import lightning.pytorch as pl

    from stlsgd.integrations.lightning import StlsgdCallback

    return pl, StlsgdCallback


def _tiny(manual: bool = False) -> Any:
    pl, _ = _lightning()

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = not manual
            self.net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))

        def training_step(self, batch, batch_idx):
            loss = nn.functional.cross_entropy(self.net(batch[0]), batch[1])
            if not self.automatic_optimization:
                opt = self.optimizers()
                opt.zero_grad()
                self.manual_backward(loss)
                opt.step()
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Tiny()


def _fit(module: Any, callback: Any, steps: int) -> Any:
    pl, _ = _lightning()
    data = TensorDataset(torch.randn(64, 3), torch.randint(0, 2, (64,)))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, DataLoader(data, batch_size=8))
    return trainer


def test_a_single_device_fit_counts_rounds_without_averaging() -> None:
    _, StlsgdCallback = _lightning()
    callback = StlsgdCallback(LocalSGD(k=3))
    _fit(_tiny(), callback, 7)
    stats = callback.averager.stats
    assert (callback.averager.iteration, stats.round, stats.averages, stats.bytes_sent) == (7, 2, 0, 0)
    assert callback.state_dict()["cursor"]["iteration"] == 6 and callback.state_dict()["step"] == 1


def test_drift_passes_through_to_the_averager() -> None:
    _, StlsgdCallback = _lightning()
    callback = StlsgdCallback(LocalSGD(k=3), drift=True)
    _fit(_tiny(), callback, 6)
    assert callback.averager.drift and callback.state_dict()["drift"]
    assert all(c.abs().sum() > 0 for c in callback.state_dict()["control"])  # one process: c_i = c, kept


def test_manual_optimization_is_refused_in_one_line() -> None:
    _, StlsgdCallback = _lightning()
    with pytest.raises(StlsgdError, match="^StlsgdCallback: manual optimization is not supported") as err:
        _fit(_tiny(manual=True), StlsgdCallback(LocalSGD(k=2)), 2)
    assert "\n" not in str(err.value)


def test_proximal_plans_run_as_in_a_plain_loop() -> None:
    # Lightning computes the gradients inside optimizer.step(closure); the drop-in adds the proximal gradient
    # after the closure's, so a fit equals the drop-in in a plain loop.
    plan = STLSGD(lr=0.1, T1=2, k1=1.0, gamma=0.5)
    pl, StlsgdCallback = _lightning()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(48, 3), torch.randint(0, 2, (48,)))
    torch.manual_seed(1)
    module = _tiny()
    start = copy.deepcopy(module.state_dict())
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=6,
        callbacks=[StlsgdCallback(plan, plan_lr=True)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, DataLoader(data, batch_size=8))
    plain = _tiny()
    plain.load_state_dict(start)
    optimizer = torch.optim.SGD(plain.parameters(), lr=0.1)
    PlanAverager(plain, optimizer, plan, plan_lr=True)
    for x, y in DataLoader(data, batch_size=8):
        loss = nn.functional.cross_entropy(plain.net(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(module.state_dict()[key], value)
