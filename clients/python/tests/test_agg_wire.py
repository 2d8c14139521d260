"""yard_agg.wire: the 32-byte header and values, checked against bytes laid out by hand from
docs/aggregation-protocol.md (the Rust encoder is compared in clients/agg/tests/python.rs)."""

import os
import random
import struct
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))

from yard_agg import wire  # noqa: E402
from yard_agg.wire import Geometry, Header, WireError  # noqa: E402


def header(**kw):
    h = Header(kind=wire.KIND_DATA, flags=wire.FLAG_RETX, exp=-3, job=7, epoch=2, round=41,
               chunk=9, worker=3, count=3, token=0xDEADBEEF)
    return h._replace(**kw)


class WireTest(unittest.TestCase):
    def test_the_layout_is_the_documented_one(self):
        b = wire.encode(header(), [1, -2, 2**31 - 1])
        want = (b"YAGG" + bytes([3, 1, 0x01, 0xFD]) + struct.pack("<IIII", 7, 2, 41, 9)
                + struct.pack("<BBHI", 3, 0, 3, 0xDEADBEEF) + struct.pack("<iii", 1, -2, 2**31 - 1))
        self.assertEqual(b, want)
        self.assertEqual(len(b), wire.HEADER_LEN + 12)

    def test_a_result_of_64_contributions_keeps_its_count_apart_from_the_worker_index(self):
        h = header(kind=wire.KIND_RESULT, worker=0, contributors=wire.WORKERS_MAX)
        b = wire.encode(h, [1, 2, 3])
        self.assertEqual(b[24], 0)
        self.assertEqual(b[25], 64)
        self.assertEqual(b[28:32], struct.pack("<I", 0xDEADBEEF))
        self.assertEqual(wire.parse(b)[0], h)

    def test_a_frame_round_trips(self):
        b = wire.encode(header(count=0), [1, -2, 2**31 - 1])  # count set from the values
        h, body = wire.parse(b)
        self.assertEqual(h, header())
        self.assertEqual(list(wire.values(body)), [1, -2, 2**31 - 1])
        # Trailing bytes (Ethernet padding) are ignored.
        h2, body2 = wire.parse(b + b"\0" * 7)
        self.assertEqual((h2, body2), (h, body))

    def test_random_headers_round_trip(self):
        rng = random.Random(5)
        for _ in range(500):
            n = rng.randint(1, wire.VALUES_MAX)
            h = Header(rng.choice(wire.KINDS), rng.randrange(256), rng.randint(-128, 127),
                       rng.randrange(2**32), rng.randrange(2**32), rng.randrange(2**32),
                       rng.randrange(2**32), rng.randrange(2**8), n, rng.randrange(2**8),
                       rng.randrange(2**32))
            vals = [rng.randint(-2**31, 2**31 - 1) for _ in range(n)]
            got, body = wire.parse(wire.encode(h, vals))
            self.assertEqual(got, h)
            self.assertEqual(list(wire.values(body)), vals)

    def test_bad_frames_are_refused_with_the_reason(self):
        good = wire.encode(header(), [1, 2, 3])
        cases = [
            (good[:31], "needs 32 header bytes, got 31"),
            (b"X" + good[1:], "bad magic"),
            (good[:4] + b"\x02" + good[5:], "unsupported protocol version 2"),
            (good[:5] + b"\x09" + good[6:], "unknown frame kind 9"),
            (good[:26] + b"\0\0" + good[28:], "1 to 768 values, this one says 0"),
            (good[:26] + struct.pack("<H", 769) + good[28:], "this one says 769"),
            (good[:-1], "announces 3 values but 11 bytes follow"),
            (b"", "got 0"),
        ]
        for bad, why in cases:
            with self.assertRaises(WireError) as cm:
                wire.parse(bad)
            self.assertIn(why, str(cm.exception))

    def test_parse_never_fails_other_than_with_a_wire_error(self):
        rng = random.Random(9)
        good = wire.encode(header(), [1, 2, 3])
        for _ in range(2000):
            b = bytearray(good[: rng.randint(0, len(good) + 4)])
            for _ in range(rng.randint(0, 4)):
                if b:
                    b[rng.randrange(len(b))] = rng.randrange(256)
            try:
                wire.parse(bytes(b))
            except WireError:
                pass

    def test_values_out_of_int32_are_refused(self):
        with self.assertRaises(OverflowError):
            wire.encode(header(), [2**31])

    def test_chunk_geometry_covers_the_gradient_exactly(self):
        self.assertEqual(Geometry.chunk_values_for_mtu(1500), 360)
        self.assertEqual(Geometry.chunk_values_for_mtu(9000), 768)
        self.assertIsNone(Geometry.chunk_values_for_mtu(60))
        g = Geometry(1_000_003, 360)
        self.assertEqual(g.chunks(), 2778)
        self.assertEqual(g.chunk_len(2777), 1_000_003 - 2777 * 360)
        self.assertEqual(g.chunk_len(2778), 0)
        rng = random.Random(3)
        for _ in range(300):
            g = Geometry(rng.randint(1, 5_000_000), rng.randint(1, 768))
            self.assertEqual(sum(g.chunk_len(c) for c in range(g.chunks())), g.values)
            s, e = g.chunk_range(g.chunks() - 1)
            self.assertEqual(e, g.values)


if __name__ == "__main__":
    unittest.main()
