"""PyTorch DDP communication hook: gradients summed by Switchyard's aggregator.

    state = yard_agg.HookState("my-job", rank=rank, addr=(host_ip, 0))
    model = DistributedDataParallel(model)         # any process group, e.g. gloo
    model.register_comm_hook(state, yard_agg.hook)

Design. A job sums a fixed number of values each round (``yard agg job create NAME
--workers N --size BYTES --dtype f32``: BYTES = 4 x the model's trainable parameters), but DDP
calls the hook once per bucket, and buckets change between the first iteration and the next
(DDP rebuilds them in gradient-ready order). So the hook collects the buckets of one backward
pass and sums the whole flat gradient in **one round** when the last bucket arrives
(``bucket.is_last()``: DDP launches buckets in index order and waits for their futures only
when the backward pass ends, so holding the earlier futures back costs nothing). Then every
bucket's future is completed with its slice of the average: the sum divided by the job's
workers, as DDP's built-in all-reduce averages over the world size. Every rank gets the same
stored sums from the aggregator and dequantizes them the same way, so every rank's
gradients, and so its parameters, are bit-identical.

A job created with ``--grouping ring`` has no aggregator: the hook then averages each pass as
DDP does, dividing by the world size and summing with ``torch.distributed.all_reduce`` on the
default process group (the framework's own ring), so one training script runs under every
grouping.

A round that times out takes the session's newest membership (the job moved to another
aggregator or lost an elastic worker) and is summed again, for at most ``round_timeout``; a
job that failed or is gone raises :class:`AggJobError` from the backward pass, naming the job
and the node's reason.
"""

import socket
import time

from . import fixed
from .session import CLOSED, FAILED, RUNNING, RingMembership, Session
from .worker import AggError, AggTimeout, Tuning, Worker


class AggJobError(RuntimeError):
    """The job cannot sum this gradient (it failed, is gone, or timed out); says why."""


class HookState:
    """The hook's state: one worker of job ``job`` as ``rank``, joined through the node's
    agent socket (``path``, default ``$YARD_AGG_SOCKET`` or /var/lib/yard/agg.sock), sending
    from a UDP socket bound to ``addr`` (``(ip, port)``, port 0 for any: the ip must be this
    host's address the aggregator can answer). Joining waits up to ``join_timeout`` seconds
    for every rank and a placement."""

    def __init__(self, job, rank, addr, path=None, tuning=None, join_timeout=60.0,
                 round_timeout=60.0):
        self.job = job
        self.rank = rank
        self.round_timeout = round_timeout
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.sock.bind(addr)
            self.addr = self.sock.getsockname()
            self.session = Session.join(job, rank, self.addr, path=path)
        except BaseException:
            self.sock.close()
            raise
        try:
            membership = self.session.wait_running(join_timeout)
        except Exception as e:
            self.close()
            raise AggJobError("job %s, rank %d: %s" % (job, rank, e)) from None
        #: The job's ring membership if it is all-reduced by its workers (no aggregator).
        self.ring = membership if isinstance(membership, RingMembership) else None
        self.worker = None if self.ring else Worker(self.sock, membership, tuning or Tuning())
        self._buckets = {}
        #: Per round: the largest per-element error bound of the average (fixed point only,
        #: before the rounding to float32), for tests and metrics.
        self.bounds = []
        self.regroups = 0
        #: Buckets DDP handed over in the last backward pass.
        self.buckets_last_pass = 0
        #: Chunks resent after a timeout (RETX), over every round summed.
        self.resent = 0

    def _fail(self, why):
        return AggJobError("job %s, rank %d: %s" % (self.job, self.rank, why))

    def all_reduce(self, flat):
        """Sums one flat float32 tensor through the aggregator, following regroupings (or,
        for a ring job, with the default process group's all-reduce)."""
        if self.ring:
            s = self.session.state()
            if s.kind in (FAILED, CLOSED):
                raise self._fail(s.why)
            import torch.distributed as dist

            # DDP's own order: divide by the world, then sum.
            flat.div_(dist.get_world_size())
            dist.all_reduce(flat)
            return flat
        started = time.monotonic()
        while True:
            s = self.session.state()
            if s.kind in (FAILED, CLOSED):
                raise self._fail(s.why)
            try:
                return self.worker.all_reduce_tensor(flat)
            except AggTimeout as e:
                s = self.session.state()
                if s.kind in (FAILED, CLOSED):
                    raise self._fail(s.why) from None
                if time.monotonic() - started > self.round_timeout:
                    raise self._fail(e) from None
                if s.kind == RUNNING and s.membership.epoch != self.worker.membership.epoch:
                    self.regroups += 1
                if s.kind == RUNNING:
                    self.worker.set_membership(s.membership)
            except (AggError, fixed.NotFiniteError) as e:
                raise self._fail(e) from None

    def hook(self, bucket):
        """The hook's work for one bucket: a future completed when the pass's last bucket
        has been summed."""
        import torch

        fut = torch.futures.Future()
        buf = bucket.buffer()
        self._buckets[bucket.index()] = (buf, fut)
        if not bucket.is_last():
            return fut
        buckets, self._buckets = self._buckets, {}
        order = sorted(buckets)
        self.buckets_last_pass = len(order)
        try:
            for i in order:
                if buckets[i][0].dtype != torch.float32:
                    raise self._fail("bucket %d holds %s gradients; the hook sums float32"
                                     % (i, buckets[i][0].dtype))
            flat = torch.cat([buckets[i][0].reshape(-1) for i in order])
            summed = self.all_reduce(flat)
            if self.ring:
                # already the average (DDP's order); float32 all through: no fixed-point bound
                avg = summed
                self.bounds.append(0.0)
            else:
                self.resent += self.worker.stats.resent
                workers = self.worker.membership.workers
                exps = self.worker.last_exps
                self.bounds.append(max(fixed.error_bound(workers, e) for e in exps) / workers)
                avg = summed.div_(workers)
        except BaseException as e:
            for i in order:
                if buckets[i][1] is not fut:
                    buckets[i][1].set_exception(e)
            raise
        at = 0
        for i in order:
            b, f = buckets[i]
            n = b.numel()
            b.copy_(avg[at:at + n].view_as(b))
            at += n
            f.set_result(b)
        return fut

    def leave(self):
        """Leaves the job cleanly (the node does not report this rank gone)."""
        self.session.leave()
        self.sock.close()

    def close(self):
        """Ends the session without a leave (the node reports this rank gone)."""
        self.session.close()
        self.sock.close()


def hook(state, bucket):
    """The DDP communication hook: ``model.register_comm_hook(state, yard_agg.hook)`` with a
    :class:`HookState`. Returns a ``torch.futures.Future`` per bucket."""
    return state.hook(bucket)
