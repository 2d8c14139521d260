"""yard_probe.torch.wrap against a tiny fake ``torch`` injected into sys.modules: fast, and
proof that the wrapper needs no torch until wrap() runs. Real torch is tested in
``test_torch_real.py``."""

import os
import sys
import types
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))

from yard_probe import Probe, wire  # noqa: E402
import yard_probe.torch as yard_torch  # noqa: E402
from fake_node import FakeNode, count  # noqa: E402


class FakeTensor:
    def __init__(self, n, size, dtype):
        self.n, self.size, self.dtype = n, size, dtype

    def numel(self):
        return self.n

    def element_size(self):
        return self.size


class FakeDtype:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return "torch." + self.name


class FakeGroup:
    def __init__(self, name, ranks, desc):
        self.name, self.ranks, self.group_desc = name, ranks, desc


class FakeWork:
    def __init__(self, calls):
        self.calls = calls

    def wait(self):
        self.calls.append("wait")
        return True


def make_fake_torch():
    """torch + torch.distributed with the functions and helpers the wrapper uses."""
    torch = types.ModuleType("torch")
    dist = types.ModuleType("torch.distributed")
    c10d = types.ModuleType("torch.distributed.distributed_c10d")
    world = FakeGroup("0", [0, 1, 2, 3], "default_pg")
    calls = []

    def op(name):
        def fn(*args, **kwargs):
            calls.append(name)
            if kwargs.get("async_op"):
                return FakeWork(calls)
            return None
        fn.__name__ = name
        return fn

    for name in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast",
                 "barrier", "send", "recv"):
        setattr(dist, name, op(name))
    dist.get_process_group_ranks = lambda pg: list(pg.ranks)
    dist.get_global_rank = lambda pg, group_rank: pg.ranks[group_rank]
    c10d._get_default_group = lambda: world
    c10d._get_process_group_name = lambda pg: pg.name
    dist.distributed_c10d = c10d
    torch.distributed = dist
    torch.bfloat16 = FakeDtype("bfloat16")
    torch.float32 = FakeDtype("float32")
    return torch, dist, c10d, calls


class TorchWrapTest(unittest.TestCase):
    def setUp(self):
        self.saved = {k: sys.modules.get(k) for k in
                      ("torch", "torch.distributed", "torch.distributed.distributed_c10d")}
        self.torch, self.dist, c10d, self.calls = make_fake_torch()
        sys.modules["torch"] = self.torch
        sys.modules["torch.distributed"] = self.dist
        sys.modules["torch.distributed.distributed_c10d"] = c10d

    def tearDown(self):
        for k, v in self.saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v

    def test_without_torch_wrap_is_a_no_op(self):
        sys.modules["torch"] = None  # makes `import torch` raise ImportError
        sys.modules["torch.distributed"] = None
        probe = Probe("j", rank=0, world_size=1, socket="/nonexistent/probe.sock",
                      heartbeat=False)
        self.assertFalse(yard_torch.wrap(probe))
        probe.close()

    def test_wrapped_collectives_are_reported_with_flight_recorder_numbering(self):
        node = FakeNode()
        probe = Probe("job-t", rank=2, world_size=4, socket=node.path, heartbeat=False)
        self.assertTrue(yard_torch.wrap(probe))
        self.assertTrue(yard_torch.wrap(probe), "wrapping twice is harmless")
        dist = self.torch.distributed
        tp = FakeGroup("7", [2, 3], "tp")
        bf16 = FakeTensor(1024, 2, self.torch.bfloat16)
        f32 = FakeTensor(10, 4, self.torch.float32)

        dist.all_reduce(bf16)
        dist.all_gather_into_tensor(FakeTensor(4096, 2, self.torch.bfloat16), bf16, group=tp)
        dist.reduce_scatter_tensor(f32, FakeTensor(40, 4, self.torch.float32))
        dist.broadcast(f32, 0, group=tp)
        dist.barrier()
        # Wrapped again mid-job (a library calling wrap too): groups and counters carry on.
        self.assertTrue(yard_torch.wrap(probe))
        dist.send(f32, 3, group=tp)
        dist.recv(f32, src=3, group=tp)
        work = dist.all_reduce(f32, async_op=True)
        self.assertEqual(self.calls[-1], "all_reduce")
        n_before_wait = 7 * 3 + 2
        node.wait_for(lambda s: count("coll")(s) == n_before_wait)
        self.assertTrue(work.wait())
        node.wait_for(lambda s: count("coll")(s) == n_before_wait + 1)
        probe.close()

        self.assertEqual(self.calls, ["all_reduce", "all_gather_into_tensor",
                                      "reduce_scatter_tensor", "broadcast", "barrier", "send",
                                      "recv", "all_reduce", "wait"])
        groups = {g["handle"]: g for g in node.of_kind("group")}
        self.assertEqual(sorted((g["name"], g["desc"], tuple(g["ranks"]))
                                for g in groups.values()),
                         [("0", "default_pg", (0, 1, 2, 3)), ("7", "tp", (2, 3))])
        ends = [(groups[c["handle"]]["name"], c["seq"], c["op"], c["dtype"], c["count"],
                 c["bytes"], c["peer"])
                for c in node.of_kind("coll") if c["phase"] == wire.END]
        self.assertEqual(ends, [
            ("0", 1, wire.OPS["all_reduce"], 2, 1024, 2048, None),
            ("7", 1, wire.OPS["all_gather"], 2, 1024, 2048, None),   # sized by the input
            ("0", 2, wire.OPS["reduce_scatter"], 0, 40, 160, None),
            ("7", 2, wire.OPS["broadcast"], 0, 10, 40, None),
            ("0", 3, wire.OPS["barrier"], 255, 0, 0, None),
            ("7", 1, wire.OPS["send"], 0, 10, 40, 3),                # p2p counter
            ("7", 2, wire.OPS["recv"], 0, 10, 40, 3),
            ("0", 4, wire.OPS["all_reduce"], 0, 10, 40, None),       # ended by wait()
        ])

        yard_torch.unwrap()
        self.assertEqual(self.torch.distributed.all_reduce.__name__, "all_reduce")
        self.assertFalse(hasattr(self.torch.distributed, "_yard_probe_groups"))
        self.assertFalse(hasattr(self.torch.distributed.all_reduce, "_yard_probe_original"))

    def test_a_peer_given_by_group_rank_is_reported_as_its_global_rank(self):
        """torch >= 2.6 takes ``group_dst``/``group_src`` (a rank within the group) instead
        of ``dst``/``src``; the wire carries global ranks."""
        node = FakeNode()
        probe = Probe("job-g", rank=5, world_size=8, socket=node.path, heartbeat=False)
        self.assertTrue(yard_torch.wrap(probe))
        pp = FakeGroup("3", [4, 5, 6, 7], "pp")
        f32 = FakeTensor(10, 4, self.torch.float32)
        self.torch.distributed.send(f32, group=pp, group_dst=2)
        self.torch.distributed.recv(f32, group=pp, group_src=0)
        node.wait_for(lambda s: count("coll")(s) == 6)
        probe.close()
        ends = [(c["op"], c["seq"], c["peer"]) for c in node.of_kind("coll")
                if c["phase"] == wire.END]
        self.assertEqual(ends, [(wire.OPS["send"], 1, 6), (wire.OPS["recv"], 2, 4)])

    def test_an_op_the_backend_refuses_ends_when_it_raises(self):
        """gloo refuses some ops up front ("not supported"); a job that catches that and falls
        back must not leave a started op behind, or the analyzer sees a hang."""
        node = FakeNode()
        probe = Probe("job-r", rank=0, world_size=4, socket=node.path, heartbeat=False)
        original = self.dist.reduce_scatter_tensor

        def refuse(*args, **kwargs):
            raise RuntimeError("ProcessGroupGloo does not support reduce_scatter_tensor")

        self.dist.reduce_scatter_tensor = refuse
        self.assertTrue(yard_torch.wrap(probe))
        f32 = FakeTensor(10, 4, self.torch.float32)
        with self.assertRaisesRegex(RuntimeError, "does not support"):
            self.dist.reduce_scatter_tensor(f32, FakeTensor(40, 4, self.torch.float32))
        self.dist.all_reduce(f32)
        node.wait_for(lambda s: count("coll")(s) == 6)
        probe.close()
        yard_torch.unwrap()
        self.dist.reduce_scatter_tensor = original
        phases = [(c["seq"], c["op"], c["phase"]) for c in node.of_kind("coll")]
        rs, ar = wire.OPS["reduce_scatter"], wire.OPS["all_reduce"]
        self.assertEqual(phases, [(1, rs, wire.ENQUEUE), (1, rs, wire.START), (1, rs, wire.END),
                                  (2, ar, wire.ENQUEUE), (2, ar, wire.START), (2, ar, wire.END)])


if __name__ == "__main__":
    unittest.main()
