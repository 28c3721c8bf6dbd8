"""Round sequences of the non-convex settings (Section 5, Algorithm 3), written out by hand."""

from stlsgd.algorithms import CRPSGD, STLSGD, LocalSGD, PlanContext
from stlsgd.algorithms.stl_sgd import STLNCConfig


def _rounds(plan, n):
    it = plan.rounds()
    return [next(it) for _ in range(n)]


def test_stl_nc_option1_iid_doubles_period_and_length_halves_lr_with_prox_anchor_per_stage() -> None:
    plan = STLSGD(lr=0.8, T1=6, k1=3, iid=True, option=1, gamma=100.0, batch=64, name="stl_nc")
    got = [(r.stage, r.start_iteration, r.steps, r.period, r.lr, r.new_anchor, r.prox_gamma) for r in _rounds(plan, 6)]
    assert got == [
        (1, 0, 3, 3, 0.8, True, 100.0),
        (1, 3, 3, 3, 0.8, False, 100.0),  # T1 = 6, k1 = 3
        (2, 6, 6, 6, 0.4, True, 100.0),
        (2, 12, 6, 6, 0.4, False, 100.0),  # T2 = 12, k2 = 6, eta/2
        (3, 18, 12, 12, 0.2, True, 100.0),
        (3, 30, 12, 12, 0.2, False, 100.0),
    ]


def test_stl_nc_option2_noniid_linear_length_sqrt_period() -> None:
    plan = STLSGD(lr=0.8, T1=4, k1=3, iid=False, option=2, gamma=1.0, batch=64, name="stl_nc")
    got = [(r.stage, r.steps, r.period, round(r.lr, 12), r.new_anchor) for r in _rounds(plan, 8)]
    # s=1: T=4, k=3 -> 3+1; s=2: T=8, k=floor(3 sqrt 2)=4 -> 4+4; s=3: T=12, k=floor(3 sqrt 3)=5 -> 5+5+2, eta_1/s
    assert got == [
        (1, 3, 3, 0.8, True),
        (1, 1, 3, 0.8, False),
        (2, 4, 4, 0.4, True),
        (2, 4, 4, 0.4, False),
        (3, 5, 5, round(0.8 / 3, 12), True),
        (3, 5, 5, round(0.8 / 3, 12), False),
        (3, 2, 5, round(0.8 / 3, 12), False),
        (4, 6, 6, 0.2, True),
    ]


def test_stl_nc_first_stage_from_epochs() -> None:
    # 20 epochs of n = 50,000 samples with 8 clients at batch 64: ceil(20 * 50000 / 512) = 1954 iterations.
    alg = STLNCConfig(lr=0.08, k=5, gamma=1e2, T1_epochs=20, option=2, batch=64)
    plan = alg.plan(PlanContext(num_samples=50_000, num_clients=8, lam=None, iid=True))
    assert isinstance(plan, STLSGD) and plan.T1 == 1954 and plan.option == 2 and plan.gamma == 100.0


def test_cr_psgd_grows_batch_by_rho_once_per_epoch_until_512() -> None:
    # n = 1024 samples, 8 clients: an epoch is done when 1024 samples have been drawn in total.
    plan = CRPSGD(lr=0.08, rho=1.3, batch=64, max_batch=512, grow="epoch", samples_per_epoch=1024, num_clients=8)
    batches = [r.batch for r in _rounds(plan, 40)]
    # 64 * 8 = 512 samples per round: the first epoch ends after round 1 (1024 seen) -> 83 = floor(64 * 1.3);
    # 83 * 8 = 664 per round: 1688 seen after round 2 (still epoch 2), 2352 after round 3 -> floor(64 * 1.3^2).
    assert batches[:5] == [64, 64, 83, 83, 108]
    assert max(batches) == 512 and batches[-1] == 512
    assert all(b1 <= b2 for b1, b2 in zip(batches, batches[1:]))
    assert all(r.steps == 1 and r.period == 1 and r.prox_gamma is None for r in _rounds(plan, 5))


def test_fixed_lr_baselines() -> None:
    plan = LocalSGD(lr=0.08, k=5, batch=64)
    assert [(r.steps, r.lr, r.lrs.decay, r.start_iteration) for r in _rounds(plan, 3)] == [
        (5, 0.08, 0.0, 0),
        (5, 0.08, 0.0, 5),
        (5, 0.08, 0.0, 10),
    ]
