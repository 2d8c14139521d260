"""yard_agg.worker behind a slow link (issue 26, bug 11): a large gradient sent from a socket
whose send buffer the link's queue holds. The worker's ``sendto`` then waits for the queue to
drain; it must wait (as the Rust client does), not fail with a bare ``TimeoutError`` that is
not :class:`AggTimeout` (the documented recovery catches only that, so the DDP hook raised
out of the backward pass).

The link is loopback in a network namespace of the test's own (``unshare --net``, so it goes
when the child exits, also on a crash) with a TBF qdisc; the worker's SO_SNDBUF is small, so a
handful of queued frames hold it, as a rate-limited NIC's queue does. Needs root (``unshare``
and ``tc``); fails, never skips, without it.
"""

import json
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.join(HERE, os.pardir)

# Runs in the child, in its own network namespace: a TBF-limited loopback, the fake
# aggregator, and one worker summing a large gradient for two rounds.
CHILD = r"""
import json, socket, subprocess, sys
for cmd in (["ip", "link", "set", "lo", "mtu", "1500"], ["ip", "link", "set", "lo", "up"],
            ["tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "4mbit",
             "burst", "3000", "latency", "2s"]):
    subprocess.run(cmd, check=True)
from fake_agg import FakeAggregator
from yard_agg import wire
from yard_agg.session import Membership
from yard_agg.worker import AggTimeout, Tuning, Worker
CV = 360
values = 40 * CV
out = {}
with FakeAggregator(9, 1, 1, values, CV) as agg:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    s.bind(("127.0.0.1", 0))
    m = Membership(9, 1, 0, 1, agg.addr, wire.Geometry(values, CV), "i32", agg.token(0),
                   agg.result_token)
    w = Worker(s, m, Tuning(give_up=30.0))
    try:
        for rnd in range(2):
            got = list(w.all_reduce_i32([rnd + i % 1000 for i in range(values)]))
            if got != [rnd + i % 1000 for i in range(values)]:
                out["error"] = "round %d: wrong sum" % rnd
                break
        else:
            out["ok"] = True
    except AggTimeout as e:
        out["agg_timeout"] = str(e)
    except BaseException as e:
        out["error"] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(out))
"""


class SlowLinkTest(unittest.TestCase):
    def test_a_large_gradient_behind_a_slow_link_sums_without_a_send_timeout(self):
        self.assertEqual(os.geteuid(), 0, "this test needs root (unshare --net, tc)")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([PKG, HERE]))
        p = subprocess.run(["unshare", "--net", sys.executable, "-c", CHILD], env=env,
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        res = json.loads(p.stdout.strip().splitlines()[-1])
        self.assertEqual(res, {"ok": True}, "the worker failed behind the slow link: %s" % res)


if __name__ == "__main__":
    unittest.main()
