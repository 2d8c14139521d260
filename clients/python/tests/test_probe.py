"""The Probe against a fake node: what it sends, and that it never blocks or raises when the
node is away, slow or restarting."""

import os
import socket
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))

from yard_probe import Probe, wire  # noqa: E402
from fake_node import FakeNode, count  # noqa: E402


class FakeTensor:
    def __init__(self, n, size=4, dtype="torch.float32"):
        self.n, self.size, self.dtype = n, size, dtype

    def numel(self):
        return self.n

    def element_size(self):
        return self.size


class ProbeTest(unittest.TestCase):
    def test_reports_hello_group_phases_peer_and_exit(self):
        node = FakeNode()
        probe = Probe("job-py", rank=1, world_size=2, socket=node.path, nic="eth0",
                      ports=[29500])
        pg = probe.group("0", [0, 1], desc="default_pg")
        with probe.collective(pg, "all_reduce", FakeTensor(256, 2, "torch.bfloat16")) as seq:
            self.assertEqual(seq, 1)
        probe.peer(pg, seq, 0, wire.RECV, 512, busy_ns=99)
        probe.exit()
        node.wait_for(lambda s: count("exit")(s) == 1)
        probe.close()

        self.assertEqual(node.kinds(), ["hello", "group", "coll", "coll", "coll", "peer", "exit"])
        hello = node.of_kind("hello")[0]
        self.assertEqual((hello["rank"], hello["world_size"], hello["job"], hello["nic"],
                          hello["ports"], hello["pid"]),
                         (1, 2, "job-py", "eth0", [29500], os.getpid()))
        self.assertEqual(node.of_kind("group")[0],
                         dict(handle=0, name="0", desc="default_pg", ranks=[0, 1]))
        colls = node.of_kind("coll")
        self.assertEqual([c["phase"] for c in colls], [wire.ENQUEUE, wire.START, wire.END])
        for c in colls:
            self.assertEqual((c["seq"], c["op"], c["dtype"], c["count"], c["bytes"], c["peer"]),
                             (1, 0, 2, 256, 512, None))
        self.assertLessEqual(colls[0]["t_ns"], colls[2]["t_ns"])
        peer = node.of_kind("peer")[0]
        self.assertEqual((peer["peer"], peer["dir"], peer["bytes"], peer["busy_ns"]),
                         (0, wire.RECV, 512, 99))

    def test_nothing_follows_exit(self):
        # A heartbeat the background thread sends just after exit() would make the node think
        # the rank alive again, and then dead.
        node = FakeNode()
        probe = Probe("j", rank=0, world_size=1, socket=node.path, heartbeat=False)
        probe.exit()
        probe.heartbeat()
        self.assertEqual(probe.dropped, 1)
        node.wait_for(lambda s: count("exit")(s) == 1)
        probe.close()
        self.assertEqual(node.kinds(skip_heartbeats=False)[-1], "exit")

    def test_send_recv_use_their_own_counter_and_carry_the_peer(self):
        node = FakeNode()
        probe = Probe("j", rank=0, world_size=2, socket=node.path, heartbeat=False)
        pg = probe.group("0", [0, 1])
        with probe.collective(pg, "all_reduce", 4, dtype="float32"):
            pass
        with probe.collective(pg, "send", 8, dtype="int64", peer=1) as seq:
            self.assertEqual(seq, 1)
        node.wait_for(lambda s: count("coll")(s) == 6)
        probe.close()
        send = node.of_kind("coll")[3]
        self.assertEqual((send["op"], send["peer"], send["bytes"], send["seq"]), (7, 1, 64, 1))
        self.assertEqual(node.of_kind("coll")[0]["bytes"], 16)

    def test_an_exception_leaves_the_op_unfinished(self):
        node = FakeNode()
        probe = Probe("j", rank=0, world_size=1, socket=node.path, heartbeat=False)
        pg = probe.group("0", [0])
        with self.assertRaises(RuntimeError):
            with probe.collective(pg, "barrier", 0):
                raise RuntimeError("watchdog timeout")
        probe.heartbeat()
        node.wait_for(lambda s: count("heartbeat")(s) == 1)
        probe.close()
        self.assertEqual([c["phase"] for c in node.of_kind("coll")], [wire.ENQUEUE, wire.START])

    def test_heartbeats_flow_on_their_own(self):
        node = FakeNode()
        probe = Probe("j", rank=0, world_size=1, socket=node.path)
        node.wait_for(lambda s: count("heartbeat")(s) >= 3)
        probe.close()

    def test_without_a_node_sends_are_dropped_quickly(self):
        path = os.path.join(tempfile.mkdtemp(), "absent.sock")
        probe = Probe("j", rank=0, world_size=1, socket=path, heartbeat=False)
        pg = probe.group("0", [0])
        start = time.monotonic()
        for _ in range(1000):
            probe.coll(pg, 1, "all_reduce", "float32", 1, 4, wire.START)
        self.assertLess(time.monotonic() - start, 1.0)
        self.assertEqual(probe.dropped, 1000)
        self.assertFalse(probe.connected)
        probe.close()

    def test_a_full_socket_drops_instead_of_blocking(self):
        path = os.path.join(tempfile.mkdtemp(), "probe.sock")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(1)
        probe = Probe("j", rank=0, world_size=1, socket=path, heartbeat=False)
        conn, _ = server.accept()  # never read
        pg = probe.group("0", [0])
        start = time.monotonic()
        for _ in range(50000):
            probe.coll(pg, 1, "all_reduce", "float32", 1, 4, wire.START)
        self.assertLess(time.monotonic() - start, 10.0)
        self.assertGreater(probe.dropped, 0)
        self.assertTrue(probe.connected)
        probe.close()
        conn.close()
        server.close()

    def test_reconnects_after_a_node_restart(self):
        node = FakeNode()
        probe = Probe("job-r", rank=0, world_size=2, socket=node.path)
        pg = probe.group("3", [0, 1], desc="tp")
        node.wait_for(lambda s: count("group")(s) == 1)
        node.kill()
        # `old` owns the temporary directory the socket lives in: it must outlive the new node,
        # or collecting it deletes the new node's socket.
        old, node = node, FakeNode(node.path)
        # The heartbeat thread notices the dead connection and reconnects.
        node.wait_for(lambda s: count("heartbeat")(s) >= 1)
        probe.coll(pg, 5, "broadcast", "float32", 1, 4, wire.ENQUEUE)
        node.wait_for(lambda s: count("coll")(s) == 1)
        probe.close()
        self.assertEqual(node.kinds()[:3], ["hello", "group", "coll"])
        self.assertEqual(node.of_kind("group")[0]["name"], "3")
        self.assertGreaterEqual(probe.dropped, 1, "the beat on the dead connection is lost")
        del old


if __name__ == "__main__":
    unittest.main()
