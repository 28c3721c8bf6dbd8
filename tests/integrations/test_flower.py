"""StlsgdFedAvg + StlsgdClient: an stlsgd plan as a Flower run (Flower's own server loop, two clients in this
process, no ray), and the client's proximal term against a hand computation."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from flwr.common import ndarrays_to_parameters
from torch import nn

from stlsgd.algorithms import STLSGD, LocalSGD
from stlsgd.errors import StlsgdError
from stlsgd.integrations.flower import (
    StlsgdClient,
    StlsgdFedAvg,
    get_weights,
    pack,
    run_in_process,
    run_local_steps,
    unpack,
)


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))


class RecordingClient(StlsgdClient):
    """Records, per round, the config, the parameters received and returned, and the forward passes made."""

    def __init__(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        batches = [(torch.randn(8, 3, generator=g) + seed, torch.randint(0, 2, (8,), generator=g)) for _ in range(3)]
        torch.manual_seed(seed)
        super().__init__(_net(), batches)
        self.forwards = 0
        self.model.register_forward_hook(lambda *_: setattr(self, "forwards", self.forwards + 1))
        self.log: list[dict] = []

    def fit(self, parameters, config):
        before = self.forwards
        arrays, n, metrics = super().fit(parameters, config)
        self.log.append(
            {
                "config": dict(config),
                "received": copy.deepcopy(parameters),
                "returned": arrays,
                "forwards": self.forwards - before,
                "n": n,
                "metrics": metrics,
            }
        )
        return arrays, n, metrics


def test_rounds_follow_the_plan_and_fedavg_averages_parameters_and_bn_buffers() -> None:
    # STL-SGD^nc, T1 = 2, k1 = 1, lr 0.1, gamma 0.5, a budget of 14 local steps. By hand: stage 1 = 2 rounds of 1
    # step (lr 0.1); stage 2 (T 4, k 2, lr 0.05) = 2 rounds of 2; stage 3 (T 8, k 4, lr 0.025) = 2 rounds of 4:
    # 14 steps in 6 rounds. Flower is asked for 8 rounds: the last 2 train nothing.
    plan = STLSGD(lr=0.1, T1=2, k1=1.0, gamma=0.5)
    torch.manual_seed(0)
    initial = get_weights(_net())
    strategy = StlsgdFedAvg(
        plan,
        max_iterations=14,
        initial_parameters=ndarrays_to_parameters(initial),
        fraction_evaluate=0.0,
        min_fit_clients=2,
        min_available_clients=2,
    )
    assert strategy.planned_rounds() == 6
    clients = [RecordingClient(1), RecordingClient(2)]
    run_in_process(strategy, clients, num_rounds=8)
    assert strategy.averages == 6 and strategy.cursor.iteration == 14
    assert [r.steps for r in strategy.completed] == [1, 1, 2, 2, 4, 4]
    keys = [k for k, v in clients[0].model.state_dict().items() if v.is_floating_point()]
    bn = [i for i, k in enumerate(keys) if "running" in k]
    assert bn  # BatchNorm statistics travel with the weights
    for c in clients:
        assert len(c.log) == 6
        cfg = [e["config"] for e in c.log]
        assert [x["stlsgd_steps"] for x in cfg] == [1, 1, 2, 2, 4, 4]
        assert [x["stlsgd_stage"] for x in cfg] == [1, 1, 2, 2, 3, 3]
        assert [x["stlsgd_period"] for x in cfg] == [1, 1, 2, 2, 4, 4]
        assert [x["stlsgd_lr"] for x in cfg] == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025, 0.025])
        assert all(x["stlsgd_gamma"] == 0.5 and "stlsgd_lrs" not in x for x in cfg)
        assert ["stlsgd_anchor" in x for x in cfg] == [False, True, False, True, False, True]
        assert [e["forwards"] for e in c.log] == [1, 1, 2, 2, 4, 4]  # exactly the round's local steps
        for r in (1, 3, 5):  # x_s: the global model sent in the stage's first round, as sent
            anchor = unpack(cfg[r]["stlsgd_anchor"])
            assert len(anchor) == len(keys)
            for sent, received in zip(anchor, c.log[r - 1]["received"]):
                np.testing.assert_array_equal(sent, received)
    a, b = clients
    np.testing.assert_array_equal(a.log[0]["received"][0], initial[0])
    for r in range(6):
        for x, y in zip(a.log[r]["received"], b.log[r]["received"]):
            np.testing.assert_array_equal(x, y)  # both clients start each round from one global model
        if r == 5:
            break
        # right after each average: the mean of the two clients' models, parameters AND BN buffers
        for i, (x, y) in enumerate(zip(a.log[r]["returned"], b.log[r]["returned"])):
            mean = (x.astype(np.float64) + y.astype(np.float64)) / 2
            np.testing.assert_allclose(a.log[r + 1]["received"][i], mean.astype(x.dtype), rtol=1e-6, atol=1e-7)
        assert any(not np.array_equal(a.log[r]["returned"][i], b.log[r]["returned"][i]) for i in bn)
    # the clients' first-batch losses are fed back (weighted mean), for adaptive plans
    last = [c.log[-1]["metrics"]["stlsgd_loss"] for c in clients]
    assert strategy.objective == pytest.approx(sum(last) / 2)


def _linear(w: list[float]) -> nn.Module:
    model = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([w]))
    return model


def _half_squared(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 0.5 * ((out.squeeze(1) - y) ** 2).sum()


BATCH = [(torch.tensor([[1.0, 2.0]]), torch.tensor([0.5]))]


def test_the_proximal_term_against_a_hand_computation() -> None:
    # f(w) = 1/2 (w.x - y)^2 with x = (1, 2), y = 0.5; w = (1, -2); x_s = (0.5, 0.5) sent by the server;
    # gamma = 0.25, lr = 0.1. grad f = (1 - 4 - 0.5) x = (-3.5, -7); prox = (w - x_s)/gamma = (0.5, -2.5)/0.25 =
    # (2, -10); w' = w - 0.1 (-1.5, -17) = (1.15, -0.3).
    # (FedProx's bugs would give: anchor = the live parameters -> prox 0 -> (1.35, -1.3) [flwr #1654]; the norm
    # without the square -> prox (w - x_s)/(2 gamma ||w - x_s||) -> (1.3108, -1.1039) [flwr #2210].)
    model = _linear([1.0, -2.0])
    config = {
        "stlsgd_steps": 1,
        "stlsgd_lr": 0.1,
        "stlsgd_gamma": 0.25,
        "stlsgd_anchor": pack([np.array([[0.5, 0.5]], dtype=np.float32)]),
    }
    out = run_local_steps(model, BATCH, config, loss_fn=_half_squared)
    torch.testing.assert_close(model.weight.detach(), torch.tensor([[1.15, -0.3]]))
    assert out == {"steps": 1, "num_examples": 1, "loss": pytest.approx(0.5 * 3.5**2), "last_loss": out["loss"]}


def test_in_a_stages_first_round_the_anchor_is_a_copy_of_the_received_model() -> None:
    # No anchor sent: x_s = the model received, w0 = (1, -2). Step 1: prox 0 -> w1 = w0 - 0.1 (-3.5, -7) =
    # (1.35, -1.3). Step 2: w1.x - y = -1.75 -> grad f = (-1.75, -3.5); prox = (w1 - w0)/0.25 = (1.4, 2.8) -- not
    # 0, as it would be if x_s were the live parameters -> w2 = w1 - 0.1 (-0.35, -0.7) = (1.385, -1.23).
    model = _linear([1.0, -2.0])
    run_local_steps(model, BATCH, {"stlsgd_steps": 2, "stlsgd_lr": 0.1, "stlsgd_gamma": 0.25}, loss_fn=_half_squared)
    torch.testing.assert_close(model.weight.detach(), torch.tensor([[1.385, -1.23]]))


def test_a_learning_rate_that_decays_within_a_round_is_sent_per_step() -> None:
    strategy = StlsgdFedAvg(LocalSGD(lr=0.1, k=3, lr_decay=0.5))
    config = strategy.round_config(ndarrays_to_parameters([np.zeros((1, 2), np.float32)]))
    lrs = np.frombuffer(config["stlsgd_lrs"], dtype=np.float64)
    np.testing.assert_allclose(lrs, [0.1, 0.1 / 1.5, 0.1 / 2.0])
    assert config["stlsgd_lr"] == 0.1 and config["stlsgd_steps"] == 3 and "stlsgd_gamma" not in config
    model = _linear([0.0, 0.0])
    run_local_steps(model, BATCH, config, loss_fn=lambda out, y: model.weight.sum())  # gradient 1 per weight
    torch.testing.assert_close(model.weight.detach(), -torch.full((1, 2), float(lrs.sum())))


def test_a_plan_without_an_lr_sends_none_and_uses_the_clients_optimizer() -> None:
    strategy = StlsgdFedAvg(LocalSGD(k=2))
    config = strategy.round_config(ndarrays_to_parameters([np.zeros((1, 2), np.float32)]))
    assert "stlsgd_lr" not in config and config["stlsgd_steps"] == 2
    model = _linear([0.0, 0.0])
    with pytest.raises(StlsgdError, match="^run_local_steps: the plan has no learning rate of its own"):
        run_local_steps(model, BATCH, config)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.25)
    run_local_steps(model, BATCH, config, optimizer=optimizer, loss_fn=lambda out, y: model.weight.sum())
    torch.testing.assert_close(model.weight.detach(), torch.full((1, 2), -0.5))
