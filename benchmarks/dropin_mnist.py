"""A practitioner's MNIST loop, as one writes it, under several ways of synchronising it (one per run).

    torchrun --nproc_per_node=2 benchmarks/dropin_mnist.py --data-dir ../shared/data --mode stlsgd --schedule lrc

The loop: an MLP 784-256-BN-ReLU-128-ReLU-10 on the first 12,000 MNIST training images, SGD with momentum 0.9 and
weight decay 5e-4, a ``StepLR(200, 0.5)`` (or ``--lr-schedule cosine``), a DataLoader with a
``DistributedSampler``, 700 steps of batch 32 per process; test accuracy on the 10,000 MNIST test images.
``--mode``: ``ddp`` (DDP, gradients all-reduced every step), ``pma`` (torch's ``PeriodicModelAverager``, period
4), ``postlocal`` (torch's ``PostLocalSGDOptimizer``: DDP for 100 warm-up steps, then period 4), ``stlsgd``
(:class:`stlsgd.dropin.PlanAverager` with ``--schedule``: ``fixed`` (period ``--k``), ``stl`` (the paper's
stages: T1 ``--T1`` steps, k doubling), ``lrc`` (LR-coupled: k = k1 eta_1 / eta), ``qsr``, ``postlocal``
(stlsgd's post-local SGD plan), with ``--gamma`` for STL-SGD^nc's proximal term, ``--outer`` for DiLoCo's outer
Nesterov step, ``--optimizer-state``, ``--drift`` for drift correction (SCAFFOLD's control variates)).
``--partition classes`` gives each process a disjoint set of classes (label skew: 2 processes hold digits 0-4
and 5-9, 4 hold 0-2, 3-5, 6-7, 8-9), each shuffling its own share; ``--partition dirichlet`` splits each class
among the processes in Dirichlet(``--dirichlet-alpha``, default 0.1) proportions drawn with ``--seed``
(:func:`stlsgd.data.partition.make_partition`); ``--lr-schedule warmcos`` is a linear warm-up from 0.1 lr over
``--warmup`` steps, then cosine to 0.

Rank 0 prints one JSON line: all-reduces over the whole group and their bytes (counted at the Python
collective calls and a counting DDP comm hook), wall time, test accuracy, and whether the processes' models
(and momentum) agree at the end. ``accuracy_bn`` is rank 0's model's test accuracy after its BatchNorm statistics
are recomputed over all processes' training images (each process passes over its share with torch's
``update_bn``; the group's mean and variance are combined exactly, uncounted): under label skew DDP keeps rank 0's
statistics (it broadcasts rank 0's buffers every step) and ``PeriodicModelAverager`` each rank's own, so
``accuracy`` measures those statistics as much as the weights.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, Subset, TensorDataset

# allreduce: collective calls; syncs: rounds of communication (DDP all-reduces its gradients in buckets, several
# calls a step); bytes: what each process contributed.
COUNT = {"allreduce": 0, "syncs": 0, "bytes": 0}


_ALL_REDUCE = dist.all_reduce


def count_collectives() -> None:
    """Count every all-reduce over more than one process issued from Python (averagers, stlsgd)."""
    original = _ALL_REDUCE

    def counted(tensor: torch.Tensor, *args, group=None, **kwargs):
        if (group or dist.group.WORLD).size() > 1:
            COUNT["allreduce"] += 1
            COUNT["syncs"] += 1
            COUNT["bytes"] += tensor.numel() * tensor.element_size()
        return original(tensor, *args, group=group, **kwargs)

    dist.all_reduce = counted


def counting_hook(state, bucket):
    """DDP's all-reduce of a gradient bucket, counted (what ``default_hooks.allreduce_hook`` does)."""
    group = state if state is not None else dist.group.WORLD
    tensor = bucket.buffer()
    if group.size() > 1:
        COUNT["allreduce"] += 1
        COUNT["syncs"] += bucket.index() == 0
        COUNT["bytes"] += tensor.numel() * tensor.element_size()
    fut = _ALL_REDUCE(tensor.div_(group.size()), group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def mlp() -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(784, 256),
        nn.BatchNorm1d(256),
        nn.ReLU(),
        nn.Linear(256, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )


def load(data_dir: str, train: int) -> tuple[TensorDataset, TensorDataset]:
    from stlsgd.data import mnist10
    from stlsgd.data.registry import resolve_data_dir

    root = resolve_data_dir(data_dir) / "mnist"
    tr = mnist10(root / "train-images-idx3-ubyte.gz", root / "train-labels-idx1-ubyte.gz")
    te = mnist10(root / "t10k-images-idx3-ubyte.gz", root / "t10k-labels-idx1-ubyte.gz")
    return (
        TensorDataset(torch.from_numpy(tr.X[:train]), torch.from_numpy(tr.y[:train])),
        TensorDataset(torch.from_numpy(te.X), torch.from_numpy(te.y)),
    )


def plan_for(args: argparse.Namespace):
    from stlsgd.algorithms import QSR, STLSGD, LocalSGD, LRCoupled, PostLocalSGD

    if args.schedule == "fixed":
        return LocalSGD(k=args.k)
    if args.schedule == "stl":
        return STLSGD(
            T1=args.T1,
            k1=args.k,
            gamma=args.gamma,
            lr=args.lr if args.plan_lr else None,
            name="stl_nc" if args.gamma else "stl_sc",
        )
    if args.schedule == "lrc":
        return LRCoupled(k1=args.k)
    if args.schedule == "qsr":
        return QSR(h_base=args.k, alpha=args.alpha)
    return PostLocalSGD(k=args.k, warmup=100)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default=None)
    p.add_argument("--mode", choices=("ddp", "pma", "postlocal", "stlsgd"), default="stlsgd")
    p.add_argument("--schedule", choices=("fixed", "stl", "lrc", "qsr", "postlocal"), default="lrc")
    p.add_argument("--k", type=float, default=4, help="period (fixed, postlocal), k1 (stl, lrc) or H_base (qsr)")
    p.add_argument("--T1", type=int, default=100)
    p.add_argument("--gamma", type=float, default=None)
    p.add_argument("--alpha", type=float, default=0.2, help="QSR's alpha")
    p.add_argument("--plan-lr", action="store_true", help="the plan owns the lr (the paper's Algorithms 2-3)")
    p.add_argument("--optimizer-state", choices=("average", "keep", "reset"), default="keep")
    p.add_argument("--outer", default=None, help="DiLoCo outer step LR,MOMENTUM (e.g. 0.7,0.9)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--lr-schedule", choices=("step", "cosine", "warmcos"), default="step")
    p.add_argument("--warmup", type=int, default=50, help="warmcos: linear warm-up steps")
    p.add_argument("--partition", choices=("iid", "classes", "dirichlet"), default="iid")
    p.add_argument("--dirichlet-alpha", type=float, default=0.1, help="dirichlet: concentration of the label split")
    p.add_argument("--drift", action="store_true", help="stlsgd: drift correction (control variates)")
    p.add_argument("--steps", type=int, default=700)
    p.add_argument("--train", type=int, default=12000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    count_collectives()
    train, test = load(args.data_dir, args.train)
    torch.manual_seed(args.seed)
    model = mlp()
    optimizer = None
    net: nn.Module = model
    if args.mode in ("ddp", "postlocal"):
        net = nn.parallel.DistributedDataParallel(model)
        if args.mode == "ddp":
            net.register_comm_hook(None, counting_hook)
        else:
            from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as pl

            # Subgroups of one process: after the warm-up DDP all-reduces nothing, as in Lin et al.'s setting.
            solo, _ = dist.new_subgroups(group_size=1)
            state = pl.PostLocalSGDState(process_group=None, subgroup=solo, start_localSGD_iter=100)

            def hook(state, bucket):
                if state.iter < state.start_localSGD_iter:
                    state.maybe_increase_iter(bucket)
                    return counting_hook(None, bucket)
                return pl.post_localSGD_hook(state, bucket)

            net.register_comm_hook(state, hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    averager = None
    if args.mode == "pma":
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

        averager = PeriodicModelAverager(period=int(args.k), warmup_steps=0)
        for p_ in model.parameters():  # processes start from rank 0's model, as DDP's constructor does
            dist.broadcast(p_.data, 0)
    elif args.mode == "postlocal":
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
        from torch.distributed.optim import PostLocalSGDOptimizer

        optimizer = PostLocalSGDOptimizer(optimizer, PeriodicModelAverager(period=4, warmup_steps=100))
    elif args.mode == "stlsgd":
        from stlsgd.dropin import PlanAverager

        outer = None
        if args.outer:
            from stlsgd.executors.averaging import OuterNesterov

            lr, momentum = (float(v) for v in args.outer.split(","))
            outer = OuterNesterov(lr=lr, momentum=momentum)
        PlanAverager(
            net,
            optimizer,
            plan_for(args),
            plan_lr=args.plan_lr,
            optimizer_state=args.optimizer_state,
            drift=args.drift,
            **({"outer": outer} if outer else {}),
        )
    inner = optimizer.optim if args.mode == "postlocal" else optimizer
    scheduler = make_scheduler(inner, args)
    sampler: DistributedSampler | RandomSampler
    if args.partition == "classes":  # label skew: this process's classes only, shuffled by its own generator
        mine = torch.tensor_split(torch.arange(10), world)[rank]
        train = Subset(train, torch.nonzero(torch.isin(train.tensors[1], mine)).flatten().tolist())
        sampler = RandomSampler(train, generator=torch.Generator().manual_seed(1000 * args.seed + rank))
    elif args.partition == "dirichlet":  # label skew drawn per class, the same split on every process
        from stlsgd.data.partition import make_partition

        split = make_partition(train.tensors[1].numpy(), world, "dirichlet", seed=args.seed, alpha=args.dirichlet_alpha)
        train = Subset(train, split.client_rows(rank).tolist())
        sampler = RandomSampler(train, generator=torch.Generator().manual_seed(1000 * args.seed + rank))
    else:
        sampler = DistributedSampler(train, seed=args.seed)
    if len(train) < 32:  # an empty loader would never reach the last step
        raise SystemExit(f"dropin_mnist: --partition {args.partition}: rank {rank} holds {len(train)} images (< 32)")
    loader = DataLoader(train, batch_size=32, sampler=sampler, drop_last=True)

    started = time.perf_counter()
    step, epoch = 0, 0
    net.train()
    while step < args.steps:
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(net(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            if averager is not None:
                averager.average_parameters(model.parameters())
            step += 1
            if step == args.steps:
                break
        epoch += 1
    wall = time.perf_counter() - started

    model.eval()
    with torch.no_grad():
        X, Y = test.tensors
        accuracy = float((model(X).argmax(1) == Y).float().mean())
    params = torch.cat([t.detach().reshape(-1) for t in model.state_dict().values() if t.is_floating_point()])
    momentum = [inner.state[p_].get("momentum_buffer") for p_ in model.parameters()]
    moms = (
        torch.cat([m.reshape(-1) for m in momentum if m is not None])
        if any(m is not None for m in momentum)
        else torch.zeros(1)
    )
    gaps = torch.stack([_spread(params), _spread(moms)])
    recompute_bn(model, train)
    with torch.no_grad():
        accuracy_bn = float((model(X).argmax(1) == Y).float().mean())
    if rank == 0:
        label = args.mode if args.mode != "stlsgd" else f"stlsgd {args.schedule}"
        print(
            json.dumps(
                {
                    "run": label,
                    "k": args.k,
                    "T1": args.T1,
                    "gamma": args.gamma,
                    "plan_lr": args.plan_lr,
                    "optimizer_state": args.optimizer_state,
                    "outer": args.outer,
                    "drift": args.drift,
                    "partition": args.partition,
                    "dirichlet_alpha": args.dirichlet_alpha if args.partition == "dirichlet" else None,
                    "world": world,
                    "steps": args.steps,
                    "syncs": COUNT["syncs"],
                    "allreduces": COUNT["allreduce"],
                    "mbytes": COUNT["bytes"] / 2**20,
                    "wall_s": round(wall, 2),
                    "accuracy": accuracy,
                    "accuracy_bn": accuracy_bn,
                    "param_spread": float(gaps[0]),
                    "momentum_spread": float(gaps[1]),
                }
            ),
            flush=True,
        )
    dist.destroy_process_group()


def make_scheduler(optimizer: torch.optim.Optimizer, args: argparse.Namespace) -> torch.optim.lr_scheduler.LRScheduler:
    lr = torch.optim.lr_scheduler
    if args.lr_schedule == "step":
        return lr.StepLR(optimizer, 200, 0.5)
    if args.lr_schedule == "cosine":
        return lr.CosineAnnealingLR(optimizer, args.steps)
    warm = lr.LinearLR(optimizer, start_factor=0.1, total_iters=args.warmup)
    return lr.SequentialLR(
        optimizer, [warm, lr.CosineAnnealingLR(optimizer, args.steps - args.warmup)], milestones=[args.warmup]
    )


def recompute_bn(model: nn.Module, train: torch.utils.data.Dataset) -> None:
    """BatchNorm statistics of the whole group's training images: each process's exact mean and variance of its
    share (``update_bn`` with cumulative averaging over one pass), combined as the pooled mean and variance."""
    from torch.optim.swa_utils import update_bn

    update_bn(DataLoader(train, batch_size=len(train)), model)  # one batch: the share's exact statistics
    n = torch.tensor([float(len(train))])
    _ALL_REDUCE(n)
    for bn in (m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)):
        mean, var = bn.running_mean, bn.running_var
        w = len(train) / float(n)
        box = torch.cat([w * mean, w * (var + mean**2)])
        _ALL_REDUCE(box)
        pooled_mean, second = box.chunk(2)
        mean.copy_(pooled_mean)
        var.copy_(second - pooled_mean**2)
    model.eval()


def _spread(x: torch.Tensor) -> torch.Tensor:
    """max |x - x on rank 0| over all ranks (not counted: a check, not the algorithm's traffic)."""
    ref = x.clone()
    dist.broadcast(ref, 0)
    gap = (x - ref).abs().max()
    box = [torch.zeros_like(gap) for _ in range(dist.get_world_size())]
    dist.all_gather(box, gap)
    return torch.stack(box).max()


if __name__ == "__main__":
    main()
