"""One rank of a real ``torch.distributed`` gloo job with ``yard_probe.torch.wrap`` in place.

Run by ``test_torch_real.py`` (world of 3 on loopback, ``script`` mode) and by the namespace
test in ``cluster-tests/tests/torch.rs`` (one rank per host, ``train`` mode). It needs real
torch (Debian's ``python3-torch`` installs it for ``/usr/bin/python3``) and ``PYTHONPATH``
pointing at ``clients/python``.

``script``: one fixed sequence of calls, chosen to exercise what a fake torch cannot show:
the argument positions of ``group`` and ``async_op`` in the real signatures, torch's own group
names, a rank that is not a member of a subgroup, works with and without a future, and
tensor lists. Every result is checked, so a wrapper that changed what torch does fails the
rank (exit status 1). ``SCRIPT`` in ``test_torch_real.py`` lists what it must report.

``train``: all-reduce steps until SIGTERM. The stop flag travels in the all-reduced tensor, so
every rank leaves after the same step (a rank that left alone would leave its peers blocked in
the next all-reduce); a progress line after every step tells the harness how far it got.
"""

import argparse
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from yard_probe import Probe
import yard_probe.torch as yard_torch

PROGRESS_PREFIX = "torch-rank progress:"


def check(ok, what):
    """Fails the rank (exit 1, the reason on stderr): the harness shows the log."""
    if not ok:
        print("torch_job: rank check failed: %s" % what, file=sys.stderr, flush=True)
        sys.exit(1)


def script(rank, world):
    """The fixed sequence (world of 3; ranks 0 and 1 form the subgroup)."""
    check(world == 3, "script mode needs a world of 3")
    t = torch.full((1000,), float(rank + 1), dtype=torch.float32)
    dist.all_reduce(t)
    check(bool((t == 6.0).all()), "all_reduce sum")

    sub = dist.new_group([0, 1])  # every rank calls it; rank 2 gets the non-member sentinel

    b = torch.full((10,), rank, dtype=torch.int64)
    dist.broadcast(b, 1, sub)  # group by position; a no-op on rank 2
    if rank in (0, 1):
        check(bool((b == 1).all()), "broadcast from rank 1 in the subgroup")

    d = torch.full((100,), float(rank), dtype=torch.float64)
    if rank == 0:
        # Late on purpose: no rank's all_reduce can end before this one starts it, which the
        # test checks on the reported times (an async op taken for a sync one ends at once).
        time.sleep(0.3)
    work = dist.all_reduce(d, dist.ReduceOp.SUM, None, True)  # async_op by position
    check(type(work).__module__.startswith("torch"), "a work with a future comes back as is")
    work.wait()
    check(bool((d == 3.0).all()), "async all_reduce sum")

    parts = [torch.zeros(5, dtype=torch.int32) for _ in range(world)]
    dist.all_gather(parts, torch.full((5,), rank, dtype=torch.int32))
    check([int(p[0]) for p in parts] == [0, 1, 2], "all_gather")

    dist.barrier()

    h = torch.full((7,), 1.5 if rank == 0 else 0.0, dtype=torch.float16)
    if rank == 0:
        dist.send(h, 1, group=sub)
    elif rank == 1:
        dist.recv(h, src=0, group=sub)
        check(bool((h == 1.5).all()), "recv in the subgroup")

    p = torch.full((3,), 9.0 if rank == 1 else 0.0)
    if rank == 1:
        dist.isend(p, 0).wait()
    elif rank == 0:
        w = dist.irecv(p, 1)
        # gloo's p2p works have no future in 1.13 (the wrapper then ends the op in wait()),
        # and their is_completed() turns true only once wait() ran: so wait, not poll.
        w.wait()
        check(w.is_completed(), "completed after wait()")
        check(bool((p == 9.0).all()), "irecv")

    r = torch.full((4,), rank + 1, dtype=torch.int64)
    dist.reduce(r, 2, dist.ReduceOp.SUM, None)  # group by position
    if rank == 2:
        check(bool((r == 6).all()), "reduce to rank 2")

    last = torch.ones(8)
    dist.all_reduce(last, async_op=True).get_future().wait()
    check(bool((last == 3.0).all()), "all_reduce waited through its future")
    # gloo refuses reduce_scatter up front ("does not support"), and jobs fall back when it
    # does: the refused op must end, or the analyzer would see this rank hung in it.
    out = torch.empty(2)
    try:
        dist.reduce_scatter_tensor(out, torch.ones(2 * world))
    except RuntimeError as e:
        check("support" in str(e), "gloo refuses reduce_scatter: %s" % e)
    # The end of an op with a future is reported by a done-callback on gloo's thread, which
    # may run just after wait() returned here: let it send before the goodbye.
    time.sleep(0.2)


STRAGGLE = 4


def train(rank, world, elements, compute_ms):
    """All-reduce steps until SIGTERM (or SIGINT), all ranks stopping after the same step.
    SIGUSR1 makes this rank a compute straggler from then on: STRAGGLE times the compute."""
    stopping, slower = [], []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    signal.signal(signal.SIGUSR1, lambda *_: slower.append(True))
    buf = torch.empty(elements + 1, dtype=torch.float32)
    done, spent, since = 0, 0.0, time.monotonic()
    while True:
        time.sleep(compute_ms * (STRAGGLE if slower else 1) / 1000.0)
        buf.fill_(float(rank + 1))
        buf[-1] = 1.0 if stopping else 0.0
        start = time.monotonic()
        dist.all_reduce(buf)
        spent += time.monotonic() - start
        want = world * (world + 1) / 2
        check(float(buf[0]) == want and float(buf[-2]) == want, "step %d sum" % (done + 1))
        done += 1
        leaving = float(buf[-1]) > 0
        if leaving or time.monotonic() - since >= 0.2:
            mean_ms = spent * 1000.0 / max(done, 1)
            print("%s done=%d mean_ms=%.2f state=%s"
                  % (PROGRESS_PREFIX, done, mean_ms, "exiting" if leaving else "running"),
                  flush=True)
            since = time.monotonic()
        if leaving:
            return


def main():
    """Probe first, then ``wrap``, then ``init_process_group``: the order a training script
    would use, and wrap must not need an initialised group."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["script", "train"])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--init", required=True, help="init_method, e.g. tcp://127.0.0.1:29500")
    ap.add_argument("--job", required=True)
    ap.add_argument("--socket", help="the node's probe socket (else $YARD_PROBE_SOCKET)")
    ap.add_argument("--nic", default="")
    ap.add_argument("--elements", type=int, default=1 << 16)
    ap.add_argument("--compute-ms", type=int, default=20)
    ap.add_argument("--timeout-s", type=int, default=60, help="gloo's collective timeout")
    a = ap.parse_args()

    torch.set_num_threads(1)
    probe = Probe(a.job, rank=a.rank, world_size=a.world, socket=a.socket, nic=a.nic)
    check(yard_torch.wrap(probe), "wrap found torch")
    dist.init_process_group("gloo", init_method=a.init, rank=a.rank, world_size=a.world,
                            timeout=datetime.timedelta(seconds=a.timeout_s))
    print("torch_job: rank %d of %d up, torch %s, pid %d"
          % (a.rank, a.world, torch.__version__, os.getpid()), flush=True)
    if a.mode == "script":
        script(a.rank, a.world)
    else:
        train(a.rank, a.world, a.elements, a.compute_ms)
        # Leave gloo together: a rank that exits while a peer's gloo thread still reads from
        # it makes that peer abort (SIGABRT), which a launcher sees as a failed rank. (Script
        # mode is checked against its exact list of collectives, so it adds none.)
        dist.barrier()
        dist.destroy_process_group()
    probe.exit()
    probe.close()
    if a.mode == "script":  # the fake node always reads; a busy real one may lag a heartbeat
        check(probe.dropped == 0, "%d probe events dropped" % probe.dropped)


if __name__ == "__main__":
    main()
