"""yard_agg.fixed: the exponent rule, Rust's rounding, the no-overflow scaling and the error
bound of any arrival order (bit-identity with the Rust code is in clients/agg/tests/python.rs)."""

import math
import os
import random
import struct
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))

from yard_agg import fixed  # noqa: E402


def f32(v):
    return struct.unpack("<f", struct.pack("<f", v))[0]


class FixedTest(unittest.TestCase):
    def test_frac_bits_leave_room_for_the_sum(self):
        self.assertEqual([fixed.frac_bits(n) for n in (0, 1, 2, 3, 4, 5, 64)],
                         [30, 30, 29, 28, 28, 27, 24])

    def test_block_exponents_bound_the_chunk(self):
        self.assertEqual(fixed.block_exp([1.0]), 1)
        self.assertEqual(fixed.block_exp([0.99, -0.5]), 0)
        self.assertEqual(fixed.block_exp([-4.0, 2.0]), 3)
        self.assertEqual(fixed.block_exp([0.0, -0.0]), -128)
        self.assertEqual(fixed.block_exp([2.0 ** -126]), -125)  # f32::MIN_POSITIVE
        self.assertEqual(fixed.block_exp([2.0 ** -140]), -127)  # clamped
        self.assertEqual(fixed.block_exp([3.0e38]), 127)  # clamped
        self.assertEqual(fixed.block_exp([f32(1.0 - 2 ** -24)]), 0)

    def test_rounding_is_half_away_from_zero_like_rust(self):
        self.assertEqual(
            [fixed.round_half_away(v) for v in (0.5, 1.5, 2.5, -0.5, -2.5, 0.49999999999999994)],
            [1, 2, 3, -1, -3, 0])
        self.assertEqual(fixed.round_half_away(1e20), 2**31 - 1)  # `as i32` saturates
        self.assertEqual(fixed.round_half_away(-1e20), -2**31)
        # Values exactly halfway after scaling (F = 29, e = 0) go away from zero, where
        # round-half-to-even (Python's round, torch.round) would give 0 and 2.
        e, q = fixed.quantize([0.75, 2.0 ** -30, -2.5 * 2.0 ** -29], 2)
        self.assertEqual(e, 0)
        self.assertEqual(list(q), [3 << 27, 1, -3])

    def test_infinities_and_nan_are_named(self):
        with self.assertRaises(fixed.NotFiniteError) as cm:
            fixed.check_finite([1.0, float("nan")])
        self.assertEqual(str(cm.exception), "gradient element 1 is NaN, which cannot be summed")
        with self.assertRaises(fixed.NotFiniteError) as cm:
            fixed.check_finite([1.0, 2.0, float("-inf")])
        self.assertEqual(cm.exception.index, 2)
        fixed.check_finite([1.0, -3.0])

    def test_sums_in_any_order_stay_within_the_bound_and_never_overflow(self):
        rng = random.Random(11)
        for trial in range(300):
            n = rng.randint(1, 8)
            inputs = []
            for _ in range(n):
                p = rng.randint(-20, 19)
                inputs.append([f32(rng.uniform(-1e6, 1e6) * 2.0 ** p) for _ in range(8)])
            if trial % 10 == 0:
                inputs[0] = [0.0] * 8
            order = list(range(n))
            rng.shuffle(order)
            acc, acc_exp = [0] * 8, -128
            for i in order:
                e, q = fixed.quantize(inputs[i], n)
                self.assertTrue(all(abs(v) <= 2 ** fixed.frac_bits(n) for v in q))
                acc_exp = fixed.add_into(acc, acc_exp, q, e)
                self.assertTrue(all(-2**31 <= v < 2**31 for v in acc))
            out = fixed.dequantize(acc, acc_exp, n)
            bound = fixed.error_bound(n, acc_exp)
            for j, got in enumerate(out):
                exact = math.fsum(x[j] for x in inputs)
                slack = bound + abs(got) * 2.0 ** -23
                self.assertLessEqual(abs(got - exact), slack,
                                     "trial %d element %d: got %r, exact %r"
                                     % (trial, j, got, exact))

    def test_the_largest_magnitudes_fill_but_do_not_overflow_the_sum(self):
        # Every worker at the top of its range: the N-way sum is 2^30 at most.
        for n in (1, 2, 3, 4, 7, 64):
            x = [f32(1.0 - 2 ** -24)] * 3
            acc, acc_exp = [0] * 3, -128
            for _ in range(n):
                e, q = fixed.quantize(x, n)
                acc_exp = fixed.add_into(acc, acc_exp, q, e)
            self.assertTrue(all(0 < v <= 2**30 for v in acc), (n, acc))

    def test_dequantize_rounds_to_float32(self):
        out = fixed.dequantize([2**30, -3, 0], 1, 1)  # scale 2^(1-30)
        self.assertEqual(list(out), [2.0, f32(-3 * 2.0 ** -29), 0.0])
        # (2^31 - 1) * 2^97 rounds past float32's largest: an infinity, as Rust's `as f32`.
        self.assertEqual(fixed.dequantize([2**31 - 1], 127, 1)[0], float("inf"))

    def test_a_rebased_result_decodes_to_the_same_floats(self):
        acc = [123_456_789, -98_765, 0, 1 << 28]
        for frm, to in ((3, 2), (8, 3), (2, 2), (64, 1)):
            e, v = fixed.rebase(5, acc, frm, to)
            self.assertEqual(list(v), acc, "%d -> %d: moving the exponent is enough" % (frm, to))
            self.assertEqual(fixed.dequantize(v, e, to), fixed.dequantize(acc, 5, frm))
        e, v = fixed.rebase(-128, [0, 0], 4, 2)
        self.assertEqual((e, list(v)), (-128, [0, 0]))
        # Past i8's range the values move instead; still the same floats where they fit.
        e, v = fixed.rebase(127, [1 << 10], 4, 2)
        self.assertEqual((e, list(v)), (127, [1 << 11]))
        e, v = fixed.rebase(-127, [1 << 10], 2, 4)
        self.assertEqual((e, list(v)), (-127, [1 << 9]))
        self.assertEqual(fixed.dequantize(v, e, 4), fixed.dequantize([1 << 10], -127, 2))
        e, v = fixed.rebase(127, [2**31 - 1, -2**31], 64, 1)  # saturates, as Rust's
        self.assertEqual((e, list(v)), (127, [2**31 - 1, -2**31]))

    def test_error_bound(self):
        self.assertEqual(fixed.error_bound(4, 0), 2.5 * 4 * 2.0 ** -28)
        self.assertEqual(fixed.error_bound(0, 3), 2.5 * 2.0 ** (3 - 30))


if __name__ == "__main__":
    unittest.main()
