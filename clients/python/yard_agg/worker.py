"""A worker's side of one job, as ``clients/agg/src/worker.rs``: each call sums one round of
the gradient with every other worker's, through the job's aggregator.

Sending is windowed (at most ``window`` chunks awaiting their result: 64, so a burst of
results fits a default socket receive buffer), a chunk whose result has not come back within
its timeout is sent again flagged RETX (20 ms, doubling up to 500 ms), and results are taken
in any order. The aggregator answers a resend to a finished chunk with the stored sum, so a
lost result costs one timeout, never the round. A round that receives no new result for
``give_up`` fails with :class:`AggTimeout`, naming the job and the aggregator; the caller
then gives the worker the session's newest membership (:meth:`Worker.set_membership`) and
sums the round again, or stops with the session's reason if the job failed.
"""

import select
import time
from array import array
from collections import namedtuple

from . import fixed, wire
from .wire import DTYPE_F32, DTYPE_I32, FLAG_REPLAY, FLAG_RETX, KIND_DATA, KIND_RESULT

Tuning = namedtuple("Tuning", "window timeout max_timeout give_up")
Tuning.__new__.__defaults__ = (64, 0.020, 0.500, 10.0)
Tuning.__doc__ = """The client's window (chunks awaiting their result), first resend timeout,
its cap (it doubles on each resend) and how long a round may go without a new result before
it fails, in seconds. The defaults are the Rust client's."""

RoundStats = namedtuple("RoundStats", "sent resent results ignored conflicting foreign",
                        defaults=(0,))
RoundStats.__doc__ = """Frames sent and resent, results taken, and frames ignored (results
for chunks already received, or for another job, epoch or round, and ``foreign`` ones) in one
round; ``conflicting``: repeats of a result already taken in this round and epoch whose exponent
or sum differ from the first (a chunk completed twice with different sums, which must never
happen); and ``foreign``: frames from anyone but the job's aggregator (its address and port),
or without its result token, ignored whatever they carry. The Rust client counts the same."""


class AggError(Exception):
    """A round failed; the message says why."""


class SizeError(AggError):
    def __init__(self, job, got, want):
        self.job, self.got, self.want = job, got, want
        super().__init__("the gradient has %d values but job %d sums %d" % (got, job, want))


class DtypeError(AggError):
    def __init__(self, job, want, got):
        self.job, self.want, self.got = job, want, got
        super().__init__("job %d sums %s values, not %s" % (job, want, got))


class AggTimeout(AggError):
    """No result for ``give_up``: the job may be gone or its aggregator down."""

    def __init__(self, job, aggregator, round, missing, waited):
        self.job, self.aggregator, self.round = job, aggregator, round
        self.missing, self.waited = missing, waited
        super().__init__(
            "job %d: no result from aggregator %s:%d for %.3f s (round %d, %d chunks missing);"
            " the job may be gone or its aggregator down"
            % (job, aggregator[0], aggregator[1], waited, round, missing))


class _I32:
    """An int32 round's input."""

    dtype = DTYPE_I32

    def __init__(self, values):
        self.values = array("i", values)

    def __len__(self):
        return len(self.values)

    def quantize(self, workers, geometry):
        return [0] * geometry.chunks(), self.values


class _F32:
    """A float32 round's input (pure Python: one chunk at a time)."""

    dtype = DTYPE_F32

    def __init__(self, values):
        self.values = fixed.as_f32(values)
        fixed.check_finite(self.values)

    def __len__(self):
        return len(self.values)

    def quantize(self, workers, geometry):
        exps, q = [], array("i")
        for c in range(geometry.chunks()):
            s, e = geometry.chunk_range(c)
            exp, values = fixed.quantize(self.values[s:e], workers)
            exps.append(exp)
            q.extend(values)
        return exps, q


class _Tensor:
    """A float32 round's input as a torch tensor (quantized all at once, bit-identical)."""

    dtype = DTYPE_F32

    def __init__(self, flat):
        self.flat = flat.detach().reshape(-1).clone()
        fixed.check_finite_tensor(self.flat)

    def __len__(self):
        return self.flat.numel()

    def quantize(self, workers, geometry):
        exps, q = fixed.quantize_tensor(self.flat, workers, geometry.chunk_values)
        return exps.tolist(), _int32_array(q)


def _int32_array(t):
    """An int32 tensor's values as an ``array('i')`` (through numpy's buffer if present)."""
    a = array("i")
    try:
        a.frombytes(t.contiguous().numpy().tobytes())
    except (ImportError, RuntimeError, TypeError):
        a.extend(t.tolist())
    return a


class Worker:
    """One worker of one job, sending from ``sock`` (a UDP socket bound to the address the job
    registered for it), as ``membership`` (a :class:`yard_agg.session.Membership`) says."""

    def __init__(self, sock, membership, tuning=None):
        # Sends block, as the Rust client's do: behind a rate-limited link the queue holds
        # the send buffer and ``sendto`` waits for it to drain. A socket timeout would bound
        # sends too and fail them with a bare TimeoutError, which is not AggTimeout, so the
        # documented recovery would not run; waiting for results uses select instead.
        sock.settimeout(None)
        self.sock = sock
        self.membership = membership
        self.tuning = tuning or Tuning()
        self.round = 0
        self.stats = RoundStats(0, 0, 0, 0, 0, 0)
        # The last completed round's results as they came, for a regrouping:
        # (workers, exponent per chunk, values).
        self._last = None
        self._replay = False

    def set_round(self, round):
        """Starts counting rounds at ``round`` (a worker that joins a running job)."""
        self.round = round & 0xFFFFFFFF
        self._last = None

    def set_membership(self, membership):
        """Takes a new membership (a regrouping: the aggregator moved, or a worker left an
        elastic job). The round that failed under the old one is summed again, whole, under
        the new epoch by the next call. Workers can be one round apart when the epoch changes,
        so the next call also sends this worker's stored *results* of its last completed
        round, flagged REPLAY: the new aggregator takes each as that chunk's result, so a
        slower worker gets the very bits this one already has (a re-sum of float32 could
        differ in the last bits), and this worker takes the echo only as an acknowledgement.
        A float32 result is re-based onto the new epoch's fixed point if the number of
        workers changed (:func:`yard_agg.fixed.rebase`)."""
        if membership.epoch != self.membership.epoch:
            self._replay = self._last is not None
        self.membership = membership

    # -- the three entry points ---------------------------------------------------------

    def all_reduce_i32(self, grad):
        """Sums ``grad`` (int32s) with every worker's: an ``array('i')``; sums wrap modulo
        2^32 as int32 adds do."""
        _, out = self._reduce(_I32(grad))
        return out

    def all_reduce_f32(self, grad):
        """Sums ``grad`` (rounded to float32) with every worker's, within
        :func:`yard_agg.fixed.error_bound`: an ``array('f')``."""
        inp = _F32(grad)
        exps, acc = self._reduce(inp)
        g = self.membership.geometry
        workers = self.membership.workers
        out = array("f")
        for c in range(g.chunks()):
            s, e = g.chunk_range(c)
            out.extend(fixed.dequantize(acc[s:e], exps[c], workers))
        return out

    def all_reduce_tensor(self, flat):
        """Sums a flat float32 tensor with every worker's (vectorised with torch, the same
        bits as :meth:`all_reduce_f32`): a new float32 tensor. ``self.last_exps`` then holds
        the result's exponent per chunk, for :func:`yard_agg.fixed.error_bound`."""
        import torch

        inp = _Tensor(flat)
        exps, acc = self._reduce(inp)
        g = self.membership.geometry
        acc_t = torch.frombuffer(bytearray(acc.tobytes()), dtype=torch.int32) if len(acc) \
            else torch.zeros(0, dtype=torch.int32)
        self.last_exps = exps
        return fixed.dequantize_tensor(acc_t, torch.tensor(exps, dtype=torch.int32),
                                       self.membership.workers, g.chunk_values)

    # -- one round ----------------------------------------------------------------------

    def _check(self, n, dtype):
        m = self.membership
        if n != m.geometry.values:
            raise SizeError(m.job, n, m.geometry.values)
        if dtype != m.dtype:
            raise DtypeError(m.job, m.dtype, dtype)

    def _reduce(self, inp):
        self._check(len(inp), inp.dtype)
        exps, acc = self._round_trip(inp)
        self._last = (self.membership.workers, list(exps), array("i", acc))  # the caller's own
        self._replay = False
        self.round = (self.round + 1) & 0xFFFFFFFF
        return exps, acc

    def _frames(self, inp, round, flags):
        """DATA frames of ``inp``'s chunks for ``round``."""
        exps, q = inp.quantize(self.membership.workers, self.membership.geometry)
        return self._encode(exps, q, round, flags)

    def _replay_frames(self, last, round):
        """REPLAY frames of the stored results ``last`` of ``round``, re-based if the number
        of workers changed."""
        workers, exps, acc = last
        m = self.membership
        if m.dtype == DTYPE_F32 and workers != m.workers:
            out_exps, out = [], array("i")
            for c in range(m.geometry.chunks()):
                s, e = m.geometry.chunk_range(c)
                exp, values = fixed.rebase(exps[c], acc[s:e], workers, m.workers)
                out_exps.append(exp)
                out.extend(values)
            exps, acc = out_exps, out
        return self._encode(exps, acc, round, FLAG_REPLAY)

    def _encode(self, exps, q, round, flags):
        m = self.membership
        g = m.geometry
        frames = []
        for c in range(g.chunks()):
            s, e = g.chunk_range(c)
            h = wire.Header(KIND_DATA, flags, exps[c], m.job, m.epoch, round, c, m.worker, 0,
                            token=m.token)
            frames.append(wire.encode(h, q[s:e]))
        return frames

    def _round_trip(self, inp):
        """Every chunk of ``inp`` sent, resent until its result came; after a regrouping the
        last round's results too, whose echoes only acknowledge them. Returns the result's
        exponent per chunk and its int32 values."""
        m = self.membership
        g = m.geometry
        t = self.tuning
        chunks = g.chunks()
        previous = (self.round - 1) & 0xFFFFFFFF
        replayed = self._last if self._replay and self._last is not None else None
        # Frame i < chunks is this round's chunk i; i >= chunks the last round's result of
        # chunk i - chunks, replayed: sent at once, outside the window, resent until
        # acknowledged or until this round is complete, never waited for. A worker that was
        # itself behind replays a round everybody has; it completes a slot nobody waits on.
        frames = self._frames(inp, self.round, 0)
        if replayed is not None:
            frames += self._replay_frames(replayed, previous)
        total = len(frames)
        now = time.monotonic()
        sent_at = [now] * total
        timeout = [t.timeout] * total
        done = [False] * total
        taken = [None] * total  # the result taken per frame: (exp, body), to tell repeats
        in_flight = set()
        sent = resent = results = ignored = conflicting = foreign = 0
        send = self.sock.sendto
        dest = m.aggregator
        # Results come from the aggregator's address and port only (the XDP program answers
        # from the address the worker sent to, and its fan-out keeps it), with its result token.
        source = (dest[0], int(dest[1]))
        result_token = m.result_token
        for i in range(chunks, total):
            send(frames[i], dest)
            in_flight.add(i)
            sent += 1
        out_exps = [0] * chunks
        out = array("i", bytes(4 * g.values))
        nxt = 0
        window_used = 0
        left = chunks
        last_progress = time.monotonic()
        while left > 0:
            while window_used < t.window and nxt < chunks:
                send(frames[nxt], dest)
                sent_at[nxt] = time.monotonic()
                in_flight.add(nxt)
                sent += 1
                window_used += 1
                nxt += 1
            now = time.monotonic()
            wait = t.max_timeout
            for i in list(in_flight):
                due = sent_at[i] + timeout[i]
                if due <= now:
                    f = bytearray(frames[i])
                    f[6] |= FLAG_RETX
                    send(bytes(f), dest)
                    resent += 1
                    sent_at[i] = now
                    timeout[i] = min(timeout[i] * 2, t.max_timeout)
                    wait = min(wait, timeout[i])
                else:
                    wait = min(wait, due - now)
            waited = time.monotonic() - last_progress
            if waited > t.give_up:
                self.stats = RoundStats(sent, resent, results, ignored, conflicting, foreign)
                raise AggTimeout(m.job, m.aggregator, self.round, left, waited)
            readable, _, _ = select.select([self.sock], [], [], max(wait, 0.0001))
            if not readable:
                continue
            try:
                data, sender = self.sock.recvfrom(65536)
            except BlockingIOError:
                continue
            if sender[:2] != source:
                ignored += 1
                foreign += 1
                continue
            try:
                h, body = wire.parse(data)
            except wire.WireError:
                ignored += 1
                continue
            if h.token != result_token:
                ignored += 1
                foreign += 1
                continue
            if h.round == self.round and h.chunk < chunks:
                i = h.chunk
            elif replayed is not None and h.round == previous and h.chunk < chunks:
                i = chunks + h.chunk
            else:
                i = None
            if (i is None or h.kind != KIND_RESULT or h.job != m.job or h.epoch != m.epoch
                    or h.count != g.chunk_len(h.chunk)):
                ignored += 1
                continue
            if done[i]:
                ignored += 1
                if taken[i] != (h.exp, body):
                    conflicting += 1
                continue
            was_in_flight = i in in_flight
            in_flight.discard(i)
            done[i] = True
            taken[i] = (h.exp, body)
            if i >= chunks:
                continue  # a replay's acknowledgement
            s, e = g.chunk_range(h.chunk)
            out[s:e] = wire.values(body)
            out_exps[h.chunk] = h.exp
            if was_in_flight:
                window_used -= 1
            results += 1
            left -= 1
            last_progress = time.monotonic()
        self.stats = RoundStats(sent, resent, results, ignored, conflicting, foreign)
        return out_exps, out
