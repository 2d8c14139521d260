"""yard_agg's DDP hook with real PyTorch on loopback: 4 gloo ranks (``agg_torch_job.py
train``) join a fake node agent and sum through the in-process fake aggregator (with loss and
reordering); their final parameters must be bit-identical across ranks and equal to the same
training with DDP's gloo all-reduce within the tolerance :func:`tolerance` derives from the
fixed-point error bound. The namespace test ``cluster-tests/tests/agg_torch.rs`` does the same
with real yard nodes and the XDP aggregator.

torch runs in its own interpreter: ``$YARD_TORCH_PYTHON``, else ``/usr/bin/python3``
(Debian's ``python3-torch``). Without torch there this test FAILS, never skips.
"""

import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir))
sys.path.insert(0, HERE)

from fake_agg import FakeAgent, FakeAggregator  # noqa: E402

TORCH_PYTHON = os.environ.get("YARD_TORCH_PYTHON") or "/usr/bin/python3"
WORLD = 4
CV = 360
RANK_TIMEOUT_S = 180


def f32s(bits):
    return struct.unpack("<%df" % len(bits), struct.pack("<%dI" % len(bits), *bits))


def tolerance(reports):
    """How far the hook's training may end from gloo's, per parameter (the same derivation
    as ``cluster-tests/tests/agg_torch.rs``): the two runs' parameters differ by ``d_t``;
    each SGD step adds the two gradients' difference times ``lr``. At equal parameters that
    difference is at most ``D_t``: the hook's fixed-point bound of the average ``B_t`` (from
    the result's exponents, ``HookState.bounds``) plus float32 rounding, first order, of the
    two sums and of the local gradient's ``samples``-term dot products, ``(samples + 8) u
    G_t`` (``G_t`` the largest local gradient element). Different parameters add at most
    ``L d_t`` (``L`` = ||H||_inf of the loss, linear in the parameters), and each update's
    own rounding ``2 u Θ``. So ``d_{t+1} <= (1 + lr L) d_t + lr D_t + 2 u Θ``, from 0."""
    u = 2.0 ** -24
    r0 = reports[0]
    steps, lr, lip, samples = r0["steps"], r0["lr"], r0["lipschitz"], r0["samples"]
    theta = max(abs(v) for r in reports for k in ("hook", "gloo", "initial")
                for v in f32s(r[k]))
    d = 0.0
    for t in range(steps):
        b = max(r["bounds"][t] for r in reports)
        g = max(r["grad_max"][t] for r in reports)
        d = (1 + lr * lip) * d + lr * (b + (samples + 8) * u * g) + 2 * u * theta
    return d


def check_reports(test, reports):
    """The assertions both the loopback and the namespace test make; returns figures."""
    hook0 = reports[0]["hook"]
    for r in reports[1:]:
        test.assertEqual(r["hook"], hook0, "rank %d's parameters differ from rank 0's bits"
                         % r["rank"])
    for r in reports:
        test.assertGreaterEqual(r["buckets"], 2, "the hook collected several buckets a pass")
    tol = tolerance(reports)
    worst = 0.0
    moved = 0.0
    for r in reports:
        for h, g, i in zip(f32s(r["hook"]), f32s(r["gloo"]), f32s(r["initial"])):
            worst = max(worst, abs(h - g))
            moved = max(moved, abs(g - i))
    test.assertLessEqual(worst, tol, "hook vs gloo: %g > tolerance %g" % (worst, tol))
    test.assertLess(tol, 1e-3 * moved, "the tolerance %g is not small against the training's "
                    "movement %g" % (tol, moved))
    return worst, tol, moved


def torch_version():
    probe = subprocess.run(
        [TORCH_PYTHON, "-c", "import torch, torch.distributed as d; "
         "assert d.is_gloo_available(), 'no gloo'; print(torch.__version__)"],
        capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        raise AssertionError(
            "real torch with gloo is needed at %s (apt-get install python3-torch, or run "
            "deploy/install-deps.sh; another interpreter via $YARD_TORCH_PYTHON): %s"
            % (TORCH_PYTHON, probe.stderr.strip()[-500:]))
    return probe.stdout.strip()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RealTorchHookTest(unittest.TestCase):
    def test_ddp_through_the_hook_matches_gloo_and_is_identical_on_every_rank(self):
        version = torch_version()
        size = subprocess.run([TORCH_PYTHON, os.path.join(HERE, "agg_torch_job.py"), "size"],
                              capture_output=True, text=True, timeout=120, check=True)
        values = int(size.stdout)
        agg = FakeAggregator(7, 1, WORLD, values, CV, dtype="f32", seed=5, drop_data=0.05,
                             drop_result=0.05, duplicate=0.05, reorder=0.2)
        member = lambda join: [{"waiting": "x"}, 0.2, {"membership": {  # noqa: E731
            "job": 7, "epoch": 1, "worker": join["rank"], "workers": WORLD,
            "aggregator": "127.0.0.1:%d" % agg.addr[1], "values": values, "chunk_values": CV,
            "dtype": "f32", "token": agg.token(join["rank"]), "result_token": agg.result_token}}]
        agent = FakeAgent(member)
        out = tempfile.mkdtemp(prefix="yard-agg-torch-")
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        init = "tcp://127.0.0.1:%d" % free_port()
        logs = [tempfile.TemporaryFile(mode="w+") for _ in range(WORLD)]
        ranks = []
        try:
            for r in range(WORLD):
                ranks.append(subprocess.Popen(
                    [TORCH_PYTHON, os.path.join(HERE, "agg_torch_job.py"), "train",
                     "--rank", str(r), "--world", str(WORLD), "--init", init, "--job", "t",
                     "--socket", agent.path, "--addr", "127.0.0.1",
                     "--out", os.path.join(out, "rank%d.json" % r), "--timeout-s", "60"],
                    env=env, stdin=subprocess.DEVNULL, stdout=logs[r],
                    stderr=subprocess.STDOUT))
            deadline = time.monotonic() + RANK_TIMEOUT_S
            failed = []
            for r, p in enumerate(ranks):
                try:
                    status = p.wait(timeout=max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    status = "a timeout after %d s" % RANK_TIMEOUT_S
                if status != 0:
                    failed.append("rank %d ended with %s" % (r, status))
            if failed:
                text = []
                for r, f in enumerate(logs):
                    f.seek(0)
                    text.append("--- rank %d:\n%s" % (r, f.read()[-3000:]))
                self.fail("torch %s: %s\n%s" % (version, "; ".join(failed), "\n".join(text)))
            reports = []
            for r in range(WORLD):
                with open(os.path.join(out, "rank%d.json" % r)) as f:
                    reports.append(json.load(f))
        finally:
            for p in ranks:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for f in logs:
                f.close()
            agent.close()
            agg.close()
        self.assertEqual(sorted(agent.leaves), list(range(WORLD)), "every rank left cleanly")
        self.assertTrue(all(c == 1 for c in agg.completed.values()))
        self.assertEqual(len({k[0] for k in agg.completed}), reports[0]["steps"],
                         "one round per training step")
        worst, tol, moved = check_reports(self, reports)
        print("\ntorch %s, %d ranks, %d values: hook vs gloo max |diff| %.3g <= tolerance "
              "%.3g (training moved parameters by up to %.3g)"
              % (version, WORLD, values, worst, tol, moved), file=sys.stderr)


class HookFaultTest(unittest.TestCase):
    """The hook when the job changes under it (``agg_hook_faults.py``, one gloo rank)."""

    def run_rank(self, mode, agent, port):
        p = subprocess.run([TORCH_PYTHON, os.path.join(HERE, "agg_hook_faults.py"), mode,
                            agent.path, str(port)],
                           capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1"))
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        return json.loads(p.stdout.strip().splitlines()[-1])

    @staticmethod
    def membership(agg, epoch):
        return {"membership": {"job": 7, "epoch": epoch, "worker": 0, "workers": 1,
                               "aggregator": "127.0.0.1:%d" % agg.addr[1], "values": 33,
                               "chunk_values": CV, "dtype": "f32", "token": agg.token(0),
                               "result_token": agg.result_token}}

    def test_a_deleted_job_raises_from_the_backward_pass_naming_it(self):
        torch_version()
        agg = FakeAggregator(7, 1, 1, 33, CV, dtype="f32", mute_to=[0])
        agent = FakeAgent(lambda join: [self.membership(agg, 1), 1.0,
                                        {"gone": "the job was deleted"}])
        try:
            out = self.run_rank("gone", agent, free_port())
        finally:
            agent.close()
            agg.close()
        self.assertEqual(out["steps"], 0)
        self.assertIn("AggJobError", out.get("error", ""))
        self.assertIn("job t, rank 0: the job was deleted", out["error"])

    def test_a_job_moved_to_another_aggregator_trains_on(self):
        torch_version()
        first = FakeAggregator(7, 1, 1, 33, CV, dtype="f32", mute_to=[0])
        second = FakeAggregator(7, 2, 1, 33, CV, dtype="f32")
        agent = FakeAgent(lambda join: [self.membership(first, 1), 0.8,
                                        self.membership(second, 2)])
        try:
            out = self.run_rank("regroup", agent, free_port())
        finally:
            agent.close()
            first.close()
            second.close()
        self.assertNotIn("error", out)
        self.assertEqual((out["steps"], out["epoch"], out["regroups"]), (3, 2, 1))
        self.assertEqual(len(second.completed), 3 * 1, "three rounds of one chunk at epoch 2")
        self.assertFalse(first.completed.keys() - {(0, 0)}, "no later round at the first")


if __name__ == "__main__":
    unittest.main()
