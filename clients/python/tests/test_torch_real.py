"""yard_probe.torch.wrap against real PyTorch: a 3-process gloo job on loopback
(``torch_job.py script``), each rank reporting to one fake node, whose frames must say exactly
what the job did: ops, per-group seq numbers, sizes, dtypes, peers and group members.

The fake torch of ``test_torch.py`` only has the signatures its author believed in; this test
catches what it cannot (argument positions, torch's group names, non-member groups, works
with and without futures). torch runs in its own interpreter: ``$YARD_TORCH_PYTHON``, else
``/usr/bin/python3`` (Debian's ``python3-torch`` installs for it, not for a pyenv python3 on
PATH), so this file runs under any python3. Without torch there it FAILS, never skips: CI
installs it (``deploy/install-deps.sh``), and a silent skip would hide a broken install.
"""

import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir))
sys.path.insert(0, HERE)

from yard_probe import wire  # noqa: E402
from fake_node import FakeNode  # noqa: E402

TORCH_PYTHON = os.environ.get("YARD_TORCH_PYTHON") or "/usr/bin/python3"
WORLD = 3
RANK_TIMEOUT_S = 120

F32, F16, F64, I32, I64 = (wire.DTYPES[n] for n in
                           ("float32", "float16", "float64", "int32", "int64"))
NO_DTYPE = wire.DTYPE_OTHER

# What torch_job.py's script mode does, per group and rank: (op, seq, dtype, count, bytes,
# peer) in call order. Group "0" is the default group (ranks 0-2), "1" the subgroup [0, 1]
# made by new_group, which rank 2 is not in: it reports nothing there.
AR, AG, BC, RD, BAR, RS = (wire.OPS[n] for n in
                           ("all_reduce", "all_gather", "broadcast", "reduce", "barrier",
                            "reduce_scatter"))
SEND, RECV = wire.OPS["send"], wire.OPS["recv"]


def expected(rank):
    """{group name: [(op, seq, dtype, count, bytes, peer), ...]} for ``rank``."""
    default = [
        (AR, 1, F32, 1000, 4000, None),
        (AR, 2, F64, 100, 800, None),    # async_op given by position
        (AG, 3, I32, 5, 20, None),       # sized by this rank's tensor, not the list
        (BAR, 4, NO_DTYPE, 0, 0, None),
        (RD, 5, I64, 4, 32, None),       # group given by position
        (AR, 6, F32, 8, 32, None),       # ended through get_future().wait()
        (RS, 7, F32, 6, 24, None),       # refused by gloo: ends when it raises
    ]
    # p2p ops have their own counter: rank 1 isends to 0, which irecvs it.
    if rank == 0:
        default.append((RECV, 1, F32, 3, 12, 1))
    elif rank == 1:
        default.append((SEND, 1, F32, 3, 12, 0))
    out = {"0": default}
    if rank in (0, 1):
        sub = [(BC, 1, I64, 10, 80, None)]
        sub.append((SEND, 1, F16, 7, 14, 1) if rank == 0 else (RECV, 1, F16, 7, 14, 0))
        out["1"] = sub
    return out


def free_port():
    """A port nobody listens on now, for rank 0's TCP store (the kernel picks it, so parallel
    runs do not collide)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_version():
    """The torch version TORCH_PYTHON imports, or fails the test saying how to get it."""
    probe = subprocess.run(
        [TORCH_PYTHON, "-c",
         "import torch, torch.distributed as d; assert d.is_available() and "
         "d.is_gloo_available(), 'no gloo'; print(torch.__version__)"],
        capture_output=True, text=True, timeout=120,
    )
    if probe.returncode != 0:
        raise AssertionError(
            "real torch with gloo is needed at %s (apt-get install python3-torch, or run "
            "deploy/install-deps.sh; another interpreter via $YARD_TORCH_PYTHON): %s"
            % (TORCH_PYTHON, probe.stderr.strip()[-500:]))
    return probe.stdout.strip()


class RealTorchTest(unittest.TestCase):
    def test_a_real_gloo_job_is_reported_as_it_ran(self):
        version = torch_version()
        node = FakeNode()
        env = dict(os.environ)
        env.update(
            PYTHONPATH=os.path.join(HERE, os.pardir),
            YARD_PROBE_SOCKET=node.path,
            GLOO_SOCKET_IFNAME="lo",
            OMP_NUM_THREADS="1",
        )
        init = "tcp://127.0.0.1:%d" % free_port()
        logs = [tempfile.TemporaryFile(mode="w+") for _ in range(WORLD)]
        ranks = []
        try:
            for r in range(WORLD):
                ranks.append(subprocess.Popen(
                    [TORCH_PYTHON, os.path.join(HERE, "torch_job.py"), "script",
                     "--rank", str(r), "--world", str(WORLD), "--init", init,
                     "--job", "torch-real", "--timeout-s", "60"],
                    env=env, stdin=subprocess.DEVNULL, stdout=logs[r],
                    stderr=subprocess.STDOUT,
                ))
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
                # Every rank's log: the one that hung is often not the one that broke.
                for p in ranks:
                    if p.poll() is None:
                        p.kill()
                        p.wait()
                text = []
                for r, f in enumerate(logs):
                    f.seek(0)
                    text.append("--- rank %d:\n%s" % (r, f.read()[-2000:]))
                self.fail("torch %s job: %s\n%s" % (version, "; ".join(failed), "\n".join(text)))
        finally:
            for p in ranks:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for f in logs:
                f.close()

        node.wait_for(lambda seen: sum(1 for _, k, _ in seen if k == "exit") == WORLD)
        by_conn = {}
        for conn, kind, msg in node.seen:
            by_conn.setdefault(conn, []).append((kind, msg))
        self.assertEqual(len(by_conn), WORLD, "one connection per rank")
        seen_ranks = set()
        for frames in by_conn.values():
            kind, hello = frames[0]
            self.assertEqual(kind, "hello")
            rank = hello["rank"]
            seen_ranks.add(rank)
            self.assertEqual((hello["world_size"], hello["job"]), (WORLD, "torch-real"))
            self.check_rank(rank, frames, version)
        self.assertEqual(seen_ranks, set(range(WORLD)))
        self.check_no_end_before_all_started(by_conn)

    def check_no_end_before_all_started(self, by_conn):
        """An all_reduce, all_gather or barrier cannot finish on any rank before every rank
        started it: each END's time must follow every rank's START of that seq (one host,
        one CLOCK_REALTIME). Catches an end reported when an async op was only issued."""
        starts, ends = {}, {}
        for frames in by_conn.values():
            rank = frames[0][1]["rank"]
            names = {m["handle"]: m["name"] for k, m in frames if k == "group"}
            for k, c in frames:
                if k != "coll" or c["op"] not in (AR, AG, BAR) or names[c["handle"]] != "0":
                    continue
                if c["phase"] == wire.START:
                    starts.setdefault(c["seq"], []).append(c["t_ns"])
                elif c["phase"] == wire.END:
                    ends.setdefault(c["seq"], []).append((rank, c["t_ns"]))
        self.assertEqual(sorted(ends), [1, 2, 3, 4, 6])
        for seq, done in ends.items():
            self.assertEqual(len(starts[seq]), WORLD, "seq %d" % seq)
            for rank, t in done:
                self.assertGreaterEqual(
                    t, max(starts[seq]),
                    "rank %d reported seq %d ended %.1f ms before the last rank started it"
                    % (rank, seq, (max(starts[seq]) - t) / 1e6))

    def check_rank(self, rank, frames, version):
        """One rank's frames: its groups, and each op's three phases in order, as expected."""
        what = "rank %d (torch %s)" % (rank, version)
        groups = {m["handle"]: m for k, m in frames if k == "group"}
        self.assertEqual(
            sorted((g["name"], g["desc"], tuple(g["ranks"])) for g in groups.values()),
            [("0", "default_pg", (0, 1, 2))] + ([("1", "", (0, 1))] if rank < 2 else []),
            what)
        self.assertEqual([k for k, _ in frames][-1], "exit",
                         "%s: the goodbye comes last, after every heartbeat" % what)
        colls = [m for k, m in frames if k == "coll"]
        got = {}
        phases = {}
        for c in colls:
            name = groups[c["handle"]]["name"]
            key = (name, c["op"] in (SEND, RECV), c["seq"])
            phases.setdefault(key, []).append(c["phase"])
            if c["phase"] == wire.ENQUEUE:
                got.setdefault(name, []).append(
                    (c["op"], c["seq"], c["dtype"], c["count"], c["bytes"], c["peer"]))
        want = expected(rank)
        # Collectives and p2p ops have separate counters: compare each set by seq, and the
        # collectives' seqs in the order they were enqueued.
        for name in want:
            self.assertEqual(sorted(got.get(name, []), key=_order),
                             sorted(want[name], key=_order), "%s, group %s" % (what, name))
            colls_in_order = [e for e in got.get(name, []) if e[0] not in (SEND, RECV)]
            self.assertEqual([e[1] for e in colls_in_order],
                             list(range(1, len(colls_in_order) + 1)),
                             "%s: group %s collective seqs in call order" % (what, name))
        self.assertEqual(set(got), set(want), what)
        for key, ps in phases.items():
            self.assertEqual(ps, [wire.ENQUEUE, wire.START, wire.END],
                             "%s: phases of %r" % (what, key))


def _order(e):
    """Sort key: p2p after collectives, then by seq."""
    return (e[0] in (SEND, RECV), e[1])


if __name__ == "__main__":
    unittest.main()
