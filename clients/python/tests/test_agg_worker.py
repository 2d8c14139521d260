"""yard_agg.worker against the in-process fake aggregator on loopback: exact int32 sums and
bounded float32 sums through loss, duplicates and reordering; the window; RETX; the give-up
error; and an epoch change in the middle of training with workers a round apart, which only
the REPLAY of the last completed round lets finish."""

import math
from array import array
import os
import socket
import sys
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir))
sys.path.insert(0, HERE)

from yard_agg import fixed, wire  # noqa: E402
from yard_agg.session import Membership  # noqa: E402
from yard_agg.worker import AggTimeout, DtypeError, SizeError, Tuning, Worker  # noqa: E402
from fake_agg import FakeAggregator  # noqa: E402

JOB = 9
CV = 360


def wrap(v):
    return ((v + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


def grad_i32(rank, rnd, n):
    """Deterministic int32s, different per rank and round, whose sums overflow (and wrap)."""
    return [wrap(i * 2654435761 + rank * 97 + rnd * 1000003) for i in range(n)]


def exact_i32(ranks, rnd, n):
    out = [0] * n
    for r in ranks:
        for i, v in enumerate(grad_i32(r, rnd, n)):
            out[i] = wrap(out[i] + v)
    return out


def grad_f32(rank, rnd, n):
    return [math.sin(i * 0.37 + rank * 1.3 + rnd) * 10.0 ** ((i % 7) - 3) for i in range(n)]


def membership(agg, worker, workers, values, epoch=1, dtype="i32"):
    return Membership(JOB, epoch, worker, workers, agg.addr, wire.Geometry(values, CV), dtype,
                      agg.token(worker), agg.result_token)


_SOCKS = []


def udp():
    """A worker's UDP socket on loopback, closed after the test."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    _SOCKS.append(s)
    return s


def run_workers(n, body):
    """Runs ``body(rank)`` on ``n`` threads; returns their results, re-raising the first
    exception."""
    results, errors = [None] * n, []

    def run(r):
        try:
            results[r] = body(r)
        except BaseException as e:  # noqa: B902 - reported below
            errors.append((r, e))

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        if t.is_alive():
            raise AssertionError("a worker thread did not finish in 120 s")
    if errors:
        r, e = errors[0]
        raise AssertionError("worker %d: %r" % (r, e)) from e
    return results


class WorkerTest(unittest.TestCase):
    def tearDown(self):
        while _SOCKS:
            _SOCKS.pop().close()

    def sum_rounds(self, agg, n, values, rounds, dtype="i32"):
        def body(r):
            w = Worker(udp(), membership(agg, r, n, values, dtype=dtype),
                       Tuning(give_up=5.0))
            out = []
            for rnd in range(rounds):
                if dtype == "i32":
                    out.append(list(w.all_reduce_i32(grad_i32(r, rnd, values))))
                else:
                    out.append(list(w.all_reduce_f32(grad_f32(r, rnd, values))))
                out.append(w.stats)
            return out
        return run_workers(n, body)

    def test_exact_int32_sums_through_loss_duplicates_and_reordering(self):
        values = 3 * CV + 1
        with FakeAggregator(JOB, 1, 3, values, CV, seed=1, drop_data=0.2, drop_result=0.2,
                            duplicate=0.2, reorder=0.3) as agg:
            res = self.sum_rounds(agg, 3, values, 4)
        for rnd in range(4):
            want = exact_i32(range(3), rnd, values)
            for r in range(3):
                self.assertEqual(res[r][2 * rnd], want, "rank %d round %d" % (r, rnd))
        self.assertTrue(all(c == 1 for c in agg.completed.values()), "completed once each")
        self.assertEqual(sum(res[r][2 * k + 1].conflicting for r in range(3) for k in range(4)),
                         0, "repeated results are the same sums")
        resent = sum(res[r][2 * k + 1].resent for r in range(3) for k in range(4))
        self.assertGreater(resent, 0, "20%% loss must have caused resends")
        retx = [f for (_, _, _, f) in agg.flags_seen if f & wire.FLAG_RETX]
        self.assertGreater(len(retx), 0, "resends are flagged RETX")

    def test_sizes_one_chunk_minus_one_chunk_and_chunk_plus_one(self):
        for values in (1, CV - 1, CV, CV + 1):
            with FakeAggregator(JOB, 1, 2, values, CV, seed=values) as agg:
                res = self.sum_rounds(agg, 2, values, 2)
            for rnd in range(2):
                self.assertEqual(res[0][2 * rnd], exact_i32(range(2), rnd, values), values)
                self.assertEqual(res[1][2 * rnd], res[0][2 * rnd])

    def test_float32_sums_are_identical_on_every_worker_and_within_the_bound(self):
        values, n = 2 * CV + 17, 4
        with FakeAggregator(JOB, 1, n, values, CV, dtype="f32", seed=2, drop_data=0.1,
                            drop_result=0.1, duplicate=0.1, reorder=0.3) as agg:
            res = self.sum_rounds(agg, n, values, 3, dtype="f32")
            slots = dict(agg.slots)
        for rnd in range(3):
            for r in range(1, n):
                self.assertEqual(res[r][2 * rnd], res[0][2 * rnd], "identical bits")
            inputs = [fixed.as_f32(grad_f32(r, rnd, values)) for r in range(n)]
            for j, got in enumerate(res[0][2 * rnd]):
                exp = slots[(rnd, j // CV)]["exp"]
                exact = math.fsum(x[j] for x in inputs)
                slack = fixed.error_bound(n, exp) + abs(got) * 2.0 ** -24
                self.assertLessEqual(abs(got - exact), slack, "round %d element %d" % (rnd, j))

    def test_the_window_holds_64_chunks_at_most(self):
        values = 200 * CV
        agg = FakeAggregator(JOB, 1, 1, values, CV, hold_results=True)
        try:
            w = Worker(udp(), membership(agg, 0, 1, values), Tuning(give_up=5.0))
            done = []
            t = threading.Thread(target=lambda: done.append(w.all_reduce_i32([1] * values)),
                                 daemon=True)
            t.start()
            deadline = time.monotonic() + 5
            while agg.max_outstanding < 64 and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.1)  # more would arrive now if the window leaked
            self.assertEqual(agg.max_outstanding, 64)
            firsts = {c for (_, _, c, f) in agg.flags_seen if not f & wire.FLAG_RETX}
            self.assertEqual(firsts, set(range(64)), "only the first 64 chunks were sent")
            agg.release()
            t.join(30)
            self.assertEqual(list(done[0]), [1] * values)
        finally:
            agg.close()

    def test_a_silent_aggregator_gives_up_naming_the_job_and_the_aggregator(self):
        with FakeAggregator(JOB, 1, 2, 10, CV) as agg:  # worker 1 never comes
            w = Worker(udp(), membership(agg, 0, 2, 10), Tuning(give_up=0.3))
            started = time.monotonic()
            with self.assertRaises(AggTimeout) as cm:
                w.all_reduce_i32([1] * 10)
            took = time.monotonic() - started
        msg = str(cm.exception)
        self.assertIn("job %d: no result from aggregator 127.0.0.1:%d" % (JOB, agg.addr[1]), msg)
        self.assertIn("round 0, 1 chunks missing", msg)
        self.assertLess(took, 3.0)
        self.assertEqual(w.round, 0, "a failed round is not counted")
        # Resent, flagged RETX, with the timeout doubling: 20, 40, 80, 160 ms...
        self.assertGreaterEqual(sum(1 for f in agg.flags_seen if f[3] & wire.FLAG_RETX), 3)

    def test_a_wrong_size_or_dtype_is_refused(self):
        with FakeAggregator(JOB, 1, 1, 10, CV) as agg:
            w = Worker(udp(), membership(agg, 0, 1, 10), Tuning(give_up=0.3))
            with self.assertRaises(SizeError) as cm:
                w.all_reduce_i32([1] * 11)
            self.assertEqual(str(cm.exception), "the gradient has 11 values but job 9 sums 10")
            with self.assertRaises(DtypeError) as cm:
                w.all_reduce_f32([1.0] * 10)
            self.assertEqual(str(cm.exception), "job 9 sums i32 values, not f32")
            with self.assertRaises(fixed.NotFiniteError):
                Worker(udp(), membership(agg, 0, 1, 10, dtype="f32")).all_reduce_f32(
                    [1.0] * 9 + [float("inf")])

    def split_then_regroup(self, n, dtype, values=CV + 5, rounds=4):
        """Workers 0..n-2 get every result of round 1 from the first aggregator, worker n-1
        none: then the first aggregator dies. At the second (a new epoch) the fast workers are
        in round 2 and the slow one still in round 1: round 1 completes there only because
        the fast ones replay their stored results of it. Returns (results, first, second)."""
        slow = n - 1
        grad = grad_i32 if dtype == "i32" else (lambda r, rnd, k: [
            v * 10.0 ** r for v in grad_f32(r, rnd, k)])  # other exponents per worker
        # The slow worker gets nothing of round 1 on: set before any result is sent, so no
        # race with the last result of round 0.
        first = FakeAggregator(JOB, 1, n, values, CV, dtype=dtype, seed=3, mute_to=[slow],
                               mute_from_round=1)
        second = None
        current = {"m": None}
        progress = [0] * n
        timeouts = [0] * n
        lock = threading.Lock()

        def body(r):
            w = Worker(udp(), membership(first, r, n, values, epoch=1, dtype=dtype),
                       Tuning(give_up=0.3))
            out = []
            for rnd in range(rounds):
                started = time.monotonic()
                while True:
                    try:
                        if dtype == "i32":
                            out.append(list(w.all_reduce_i32(grad(r, rnd, values))))
                        else:
                            out.append(list(w.all_reduce_f32(grad(r, rnd, values))))
                        break
                    except AggTimeout:
                        with lock:
                            timeouts[r] += 1
                            m = current["m"]
                        if time.monotonic() - started > 20:
                            raise
                        if m is not None:
                            w.set_membership(m._replace(worker=r, token=FakeAggregator.token(r)))
                with lock:
                    progress[r] = rnd + 1
            return out

        results = [None] * n
        errors = []

        def run(r):
            try:
                results[r] = body(r)
            except BaseException as e:  # noqa: B902
                errors.append(e)

        threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(n)]
        for t in threads:
            t.start()
        try:
            deadline = time.monotonic() + 20
            while not (min(progress[:slow]) >= 2 and timeouts[slow] >= 1):
                self.assertLess(time.monotonic(), deadline, "did not reach the split")
                time.sleep(0.01)
            self.assertEqual(progress, [2] * slow + [1], "fast workers a round ahead")
            first.close()
            second = FakeAggregator(JOB, 2, n, values, CV, dtype=dtype, seed=4)
            with lock:
                current["m"] = membership(second, 0, n, values, epoch=2, dtype=dtype)
            for t in threads:
                t.join(60)
            self.assertFalse(errors, errors)
        finally:
            if not first.stop_flag:
                first.close()
            if second is not None:
                second.close()
        replays = {(w, rnd) for (w, rnd, _, f) in second.flags_seen if f & wire.FLAG_REPLAY}
        for w in range(slow):
            self.assertIn((w, 1), replays, "worker %d replayed round 1 at the new epoch" % w)
        self.assertIn((slow, 0), replays, "the slow worker replayed round 0 (everybody has it)")
        self.assertTrue(all(c == 1 for c in second.completed.values()), "completed once each")
        return results, first, second

    def test_an_epoch_change_with_workers_a_round_apart_completes_through_replay(self):
        n, values, rounds = 2, CV + 5, 4
        results, _, second = self.split_then_regroup(n, "i32", values, rounds)
        for rnd in range(rounds):
            want = exact_i32(range(n), rnd, values)
            for r in range(n):
                self.assertEqual(results[r][rnd], want, "rank %d round %d" % (r, rnd))
        self.assertEqual(second.completed.get((1, 0)), 1, "round 1 completed at epoch 2")

    def test_float_results_stay_bit_identical_across_a_regrouping(self):
        """Three workers with different exponents: a re-sum of round 1 at the new aggregator
        could differ in the last bits from the first sum, which the fast workers keep; the
        replayed results make the slow worker's round 1 the very same bits."""
        n, values, rounds = 3, 2 * CV + 5, 4
        results, _, _ = self.split_then_regroup(n, "f32", values, rounds)
        for rnd in range(rounds):
            for r in range(1, n):
                self.assertEqual(results[r][rnd], results[0][rnd],
                                 "round %d: worker %d's bits differ from worker 0's" % (rnd, r))
            inputs = [fixed.as_f32([v * 10.0 ** r for v in grad_f32(r, rnd, values)])
                      for r in range(n)]
            for j, got in enumerate(results[0][rnd]):
                exact = math.fsum(x[j] for x in inputs)
                c = j // CV
                top = max(abs(x[k]) for x in inputs for k in range(c * CV, min((c + 1) * CV,
                                                                                values)))
                slack = fixed.error_bound(n, fixed.exp_of_max(top)) + abs(got) * 2.0 ** -24
                self.assertLessEqual(abs(got - exact), slack, "round %d element %d" % (rnd, j))

    def test_a_replay_to_fewer_workers_is_rebased(self):
        """An elastic job goes from 3 workers to 2: the stored float results of the last round
        travel in the 2-worker fixed point, decoding to the same floats."""
        with FakeAggregator(JOB, 1, 1, 10, CV, dtype="f32") as agg:
            w = Worker(udp(), membership(agg, 0, 1, 10, dtype="f32"), Tuning(give_up=0.3))
            w._last = (3, [5], array("i", [123456789, -98765, 0, 1 << 28] + [7] * 6))
            w.set_membership(membership(agg, 0, 1, 10, epoch=1, dtype="f32"))
            frames = w._replay_frames(w._last, 0)
        h, body = wire.parse(frames[0])
        self.assertEqual(h.flags, wire.FLAG_REPLAY)
        self.assertEqual(h.exp, 5 + fixed.frac_bits(1) - fixed.frac_bits(3))
        self.assertEqual(list(fixed.dequantize(wire.values(body), h.exp, 1)),
                         list(fixed.dequantize(w._last[2], 5, 3)))

    def test_a_forged_result_from_another_address_is_ignored(self):
        """Issue 25, finding 6: a result from anyone but the job's aggregator, or without its
        result token, is ignored, even one that names the job, epoch, round and chunk and
        arrives before the aggregator's."""
        agg, forger, sock = udp(), udp(), udp()
        values = 2 * 4
        m = Membership(JOB, 2, 0, 1, agg.getsockname(), wire.Geometry(values, 4), "i32",
                       0x11112222, 0x33334444)

        def fake():
            agg.settimeout(5.0)
            answered = set()
            while len(answered) < 2:
                data, sender = agg.recvfrom(65536)
                h, body = wire.parse(data)
                self.assertEqual(h.token, 0x11112222)
                reply = h._replace(kind=wire.KIND_RESULT, worker=0, contributors=1,
                                   token=0x33334444)
                if h.chunk not in answered:
                    answered.add(h.chunk)
                    # the same result with another sum, first: from another port of the same
                    # host with the right token, and from the aggregator's own address (as a
                    # host that forges it would) with a wrong one
                    forger.sendto(wire.encode(reply, [666] * 4), sender)
                    agg.sendto(wire.encode(reply._replace(token=0x33334445), [667] * 4), sender)
                    time.sleep(0.005)
                agg.sendto(wire.encode(reply, wire.values(body)), sender)

        t = threading.Thread(target=fake, daemon=True)
        t.start()
        w = Worker(sock, m, Tuning(give_up=5.0))
        out = w.all_reduce_i32(list(range(1, values + 1)))
        t.join(10)
        self.assertEqual(list(out), list(range(1, values + 1)), "the aggregator's sums only")
        self.assertEqual(w.stats.foreign, 4, "each forged result counted")
        self.assertEqual(w.stats.conflicting, 0)


if __name__ == "__main__":
    unittest.main()
