"""Byte-for-byte checks of the encoder against frames written out by hand from the spec in
diagnosis/src/wire.rs."""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))

from yard_probe import wire  # noqa: E402


def h(*parts):
    return bytes.fromhex("".join(parts).replace(" ", ""))


class EncodingTest(unittest.TestCase):
    def test_hello(self):
        frame = wire.hello(3, 8, 1, 1234, "job", host="", nic="eth0", switch="", ports=[29500])
        self.assertEqual(frame, h(
            "26000000",          # body length 38
            "01", "0100",        # HELLO, version 1
            "03000000", "08000000", "01000000", "d2040000",  # rank, world, local rank, pid
            "0300 6a6f62",       # job
            "0000",              # host (empty)
            "0400 65746830",     # nic
            "0000",              # switch
            "0100 3c73",         # one port, 29500
        ))

    def test_group(self):
        self.assertEqual(wire.group(2, "0", "dp", [0, 1]), h(
            "18000000", "02", "02000000",
            "0100 30", "0200 6470",
            "02000000", "00000000", "01000000",
        ))

    def test_large_group_spans_frames(self):
        frames = wire.group(0, "0", "", range(2000))
        # 800 + 800 + 400 ranks: three frames, each within the limit.
        lengths = []
        at = 0
        while at < len(frames):
            n = int.from_bytes(frames[at : at + 4], "little")
            self.assertLessEqual(n, wire.MAX_FRAME)
            lengths.append(n)
            at += 4 + n
        self.assertEqual(lengths, [1 + 4 + 3 + 2 + 4 + 4 * n for n in (800, 800, 400)])

    def test_coll(self):
        frame = wire.coll(1, 7, wire.OPS["send"], wire.DTYPES["bfloat16"], wire.START, 5, 10,
                          20, 0x0102030405060708)
        self.assertEqual(frame, h(
            "2d000000", "03", "01000000", "0700000000000000",
            "07", "02", "01", "01",   # op send, dtype bfloat16, phase start, has peer
            "05000000",
            "0a00000000000000", "1400000000000000", "0807060504030201",
        ))
        no_peer = wire.coll(1, 7, 0, 0, wire.END, None, 1, 4, 0)
        self.assertEqual(no_peer[4 + 1 + 4 + 8 + 3], 0, "flags clear without a peer")

    def test_peer(self):
        self.assertEqual(wire.peer(1, 2, 3, wire.RECV, 4, 5, 6), h(
            "2a000000", "04", "01000000", "0200000000000000", "03000000", "01",
            "0400000000000000", "0500000000000000", "0600000000000000",
        ))

    def test_heartbeat_and_exit(self):
        self.assertEqual(wire.heartbeat(0x0102030405060708), h("09000000 05 0807060504030201"))
        self.assertEqual(wire.exit_(1), h("09000000 06 0100000000000000"))

    def test_long_strings_are_cut_at_a_character_boundary(self):
        frame = wire.hello(0, 1, 0, 0, "\u00e9" * 200)
        self.assertEqual(int.from_bytes(frame[23:25], "little"), 254)

    def test_names_map_to_the_rust_codes(self):
        self.assertEqual(wire.op_code("all_reduce"), 0)
        self.assertEqual(wire.op_code("_all_gather_base"), 1)
        self.assertEqual(wire.op_code("all_gather_into_tensor"), 1)
        self.assertEqual(wire.op_code("reduce_scatter_tensor"), 2)
        self.assertEqual(wire.op_code("nccl:all_to_all_single"), 5)
        self.assertEqual(wire.op_code("allreduce_coalesced"), 11)
        self.assertEqual(wire.op_code("frobnicate"), 255)
        self.assertEqual(wire.dtype_code("torch.bfloat16"), 2)
        self.assertEqual(wire.dtype_code("half"), 1)
        self.assertEqual(wire.dtype_code("torch.float8_e4m3fn"), 9)
        self.assertEqual(wire.dtype_code("complex64"), 255)
        self.assertEqual(wire.dtype_code(None), 255)


if __name__ == "__main__":
    unittest.main()
