"""One rank of a DDP training job summed through yard_agg's comm hook, then the same training
with DDP's own gloo all-reduce, for ``cluster-tests/tests/agg_torch.rs`` and
``test_agg_torch_real.py``. Run by an interpreter with real torch.

    agg_torch_job.py size                      # prints the model's trainable values
    agg_torch_job.py train --rank R --world N --init tcp://IP:PORT --job NAME
                           --socket AGG_SOCK --addr IP --out FILE [--steps S --lr LR]
                           [--step-sleep-ms MS --give-up-s S]

The model is linear in its parameters (three ``nn.Linear`` on slices of the input, their
outputs summed) with an MSE loss, so the gradient is ``H θ − c`` for a fixed Hessian ``H``
that every rank can compute from the seeded data of all ranks: its infinity norm is the
Lipschitz constant the test's tolerance propagates the aggregator's error bound with. DDP's
first bucket and bucket cap are made small so the hook sees several buckets per pass.

``--out`` gets one JSON object: the final parameters of both runs as float32 bits, the hook's
per-step error bound of the average (``HookState.bounds``), the per-step largest local
gradient element, the Lipschitz constant, lr and steps.
"""

import argparse
import datetime
import json
import os
import struct
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

import yard_agg  # noqa: E402

DIMS = (48, 96, 160)
OUT = 8
SAMPLES = 64  # per rank


class Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.parts = nn.ModuleList(nn.Linear(d, OUT) for d in DIMS)

    def forward(self, x):
        at, y = 0, 0
        for d, layer in zip(DIMS, self.parts):
            y = y + layer(x[:, at:at + d])
            at += d
        return y


def make_model():
    torch.manual_seed(1234)
    return Wide()


def values():
    return sum(p.numel() for p in make_model().parameters() if p.requires_grad)


def data(rank):
    """This rank's fixed samples: inputs and targets of a noisy linear teacher."""
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(SAMPLES, sum(DIMS), generator=g)
    teacher = torch.randn(sum(DIMS), OUT, generator=torch.Generator().manual_seed(7)) * 0.1
    y = x @ teacher + 0.01 * torch.randn(SAMPLES, OUT, generator=g)
    return x, y


def lipschitz(world):
    """||H||_inf of the averaged MSE loss's Hessian (float64): per output, the block
    (2 / (SAMPLES * OUT * world)) * sum over ranks of Z^T Z, Z = [x_1, 1, x_2, 1, x_3, 1]."""
    gram = 0
    for r in range(world):
        x, _ = data(r)
        cols, at = [], 0
        for d in DIMS:
            cols += [x[:, at:at + d].double(), torch.ones(SAMPLES, 1, dtype=torch.float64)]
            at += d
        z = torch.cat(cols, dim=1)
        gram = gram + z.t() @ z
    h = gram * (2.0 / (SAMPLES * OUT * world))
    return float(h.abs().sum(dim=1).max())


def bits(model):
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return list(struct.unpack("<%dI" % flat.numel(), struct.pack("<%df" % flat.numel(),
                                                               *flat.tolist())))


def train(model, x, y, steps, lr, sleep_s=0.0, label=None):
    """``steps`` SGD steps; with ``label``, prints "<label> step N" after each (the namespace
    test watches rank 0's progress), and sleeps ``sleep_s`` after each (simulated compute, so
    a test can act mid-training)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = nn.MSELoss()
    for step in range(steps):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if label:
            print("%s step %d" % (label, step + 1), flush=True)
        if sleep_s:
            time.sleep(sleep_s)
    return float(loss)


def recording_hook(per_step):
    """yard_agg.hook, also recording the largest local gradient element of each pass (before
    the sum) into ``per_step``, for the tolerance's rounding term. A function, not a callable
    object: DDP reads the hook's ``__name__``."""
    biggest = [0.0]

    def hook(state, bucket):
        biggest[0] = max(biggest[0], float(bucket.buffer().abs().max()))
        if bucket.is_last():
            per_step.append(biggest[0])
            biggest[0] = 0.0
        return yard_agg.hook(state, bucket)

    return hook


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["size", "train"])
    ap.add_argument("--rank", type=int)
    ap.add_argument("--world", type=int)
    ap.add_argument("--init")
    ap.add_argument("--job")
    ap.add_argument("--socket")
    ap.add_argument("--addr")
    ap.add_argument("--out")
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--timeout-s", type=int, default=120)
    ap.add_argument("--step-sleep-ms", type=int, default=0)
    ap.add_argument("--give-up-s", type=float, default=10.0)
    a = ap.parse_args()
    if a.mode == "size":
        print(values())
        return
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=a.init, rank=a.rank, world_size=a.world,
                            timeout=datetime.timedelta(seconds=a.timeout_s))
    dist._DEFAULT_FIRST_BUCKET_BYTES = 2048
    x, y = data(a.rank)
    began = time.monotonic()

    state = yard_agg.HookState(a.job, a.rank, (a.addr, 0), path=a.socket,
                               tuning=yard_agg.Tuning(give_up=a.give_up_s),
                               join_timeout=a.timeout_s, round_timeout=a.timeout_s)
    # a ring job (--grouping ring) has no aggregator: its ring membership instead
    joined = state.ring or state.worker.membership
    print("rank %d joined job %s: %r" % (a.rank, a.job, joined), flush=True)
    hooked = nn.parallel.DistributedDataParallel(make_model(), bucket_cap_mb=4096 / 2**20)
    grad_max = []
    hooked.register_comm_hook(state, recording_hook(grad_max))
    hook_loss = train(hooked, x, y, a.steps, a.lr, a.step_sleep_ms / 1000.0, "hook")
    hook_s = time.monotonic() - began
    stats = state.worker.stats._asdict() if state.worker else None
    state.leave()

    plain = nn.parallel.DistributedDataParallel(make_model(), bucket_cap_mb=4096 / 2**20)
    gloo_loss = train(plain, x, y, a.steps, a.lr)
    with open(a.out + ".tmp", "w") as f:
        json.dump({
            "rank": a.rank, "world": a.world, "values": values(), "steps": a.steps,
            "samples": SAMPLES,
            "lr": a.lr, "lipschitz": lipschitz(a.world), "bounds": state.bounds,
            "grad_max": grad_max, "hook": bits(hooked.module),
            "gloo": bits(plain.module), "initial": bits(make_model()),
            "hook_loss": hook_loss, "gloo_loss": gloo_loss, "hook_s": hook_s,
            "regroups": state.regroups, "resent": state.resent,
            "epoch": joined.epoch if state.ring else state.worker.membership.epoch,
            "aggregator": None if state.ring else "%s:%d" % state.worker.membership.aggregator,
            "buckets": state.buckets_last_pass, "last_round": stats,
            "torch": torch.__version__,
        }, f)
    os.rename(a.out + ".tmp", a.out)
    print("rank %d done: loss %.6f (hook) %.6f (gloo)" % (a.rank, hook_loss, gloo_loss),
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
