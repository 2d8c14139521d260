"""float32 gradients as block fixed point, bit-identical to ``clients/agg/src/fixed.rs``.

A worker's chunk ``x`` has block exponent ``e``, the least integer with ``max|x| < 2^e``
(-128 for an all-zero chunk, clamped to -127..127 otherwise), and travels as
``q = round(x * 2^(F - e))`` with ``F = frac_bits(workers) = 30 - ceil(log2 workers)``, so
an N-way sum of them fits int32. The result of the aggregator is ``acc * 2^(E - F)``
(``docs/aggregation-protocol.md``, "Values").

Why this is bit-identical to the Rust code, operation by operation:

- The exponent is exact in both: Rust corrects ``floor(log2 max) + 1`` against powers of two
  until it is the least ``e`` with ``max < 2^e``; here ``frexp`` gives that ``e`` directly.
- ``x * 2^k`` in float64 is exact for every float32 ``x`` and the ``k`` that occur (no
  overflow or underflow of float64), in Rust and here.
- Rounding is Rust's ``f64::round``: half away from zero (``round()`` in Python and
  ``torch.round`` round half to even, so neither is used). ``floor(|y| + 0.5)`` is exact for
  ``y = float32 * 2^k`` (such a ``y`` has 24 significant bits, so adding 0.5 loses nothing
  where it could matter), and the pure path uses ``floor`` and an exact remainder anyway.
- ``as i32`` saturates in Rust (NaN to 0, which cannot occur: non-finite input is refused).
- Dequantizing is ``(f64(acc) * 2^(exp - F)) as f32``: an exact product, then one rounding to
  nearest even (overflow to infinity), as ``struct``'s float32 packing and torch's
  ``to(float32)`` do.

The pure-Python functions take any sequence of floats and first round it to float32 (what a
float32 tensor holds); the ``*_tensor`` functions take torch tensors and need torch only when
called.
"""

import math
import struct
from array import array

I32_MIN = -(1 << 31)
I32_MAX = (1 << 31) - 1
EXP_ZERO = -128


class NotFiniteError(ValueError):
    """A gradient element is an infinity or NaN: it cannot be summed in fixed point."""

    def __init__(self, index, value):
        self.index = index
        self.value = value
        super().__init__("gradient element %d is %s, which cannot be summed"
                         % (index, _rust_float(value)))


def _rust_float(v):
    """How Rust's Display writes a non-finite f32 (the message matches the Rust client's)."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return repr(v)


def frac_bits(workers):
    """The fraction bits for a job of ``workers`` (at least 1)."""
    n = max(int(workers), 1)
    return 30 - (n - 1).bit_length()


def exp_of_max(m):
    """The block exponent of a chunk whose largest magnitude is the float ``m`` (>= 0)."""
    if m == 0:
        return EXP_ZERO
    _, e = math.frexp(m)  # m = f * 2^e with 0.5 <= f < 1: the least e with m < 2^e
    return max(-127, min(127, e))


def as_f32(x):
    """``x`` rounded to float32, as an ``array('f')`` (no copy if it already is one)."""
    if isinstance(x, array) and x.typecode == "f":
        return x
    return array("f", x)


def check_finite(x):
    """Raises :class:`NotFiniteError` naming the first infinity or NaN of ``x``."""
    for i, v in enumerate(x):
        if not math.isfinite(v):
            raise NotFiniteError(i, v)


def block_exp(x):
    """Least ``e`` with ``max|x| < 2^e``, or -128 if ``x`` is all zero."""
    x = as_f32(x)
    return exp_of_max(max((abs(v) for v in x), default=0.0))


def round_half_away(y):
    """Rust's ``f64::round`` (half away from zero), then ``as i32`` (saturating)."""
    a = abs(y)
    f = math.floor(a)
    if a - f >= 0.5:
        f += 1
    q = -f if y < 0 else f
    return I32_MIN if q < I32_MIN else I32_MAX if q > I32_MAX else q


def quantize(x, workers):
    """One chunk as a worker sends it: ``(exp, array('i') of values)``."""
    x = as_f32(x)
    e = block_exp(x)
    if e == EXP_ZERO:
        return e, array("i", bytes(4 * len(x)))
    scale = math.ldexp(1.0, frac_bits(workers) - e)
    return e, array("i", (round_half_away(v * scale) for v in x))


def _to_f32(y):
    """A float64 rounded to float32 (nearest even; overflow gives an infinity)."""
    try:
        return struct.unpack("<f", struct.pack("<f", y))[0]
    except OverflowError:
        return math.copysign(math.inf, y)


def dequantize(acc, exp, workers):
    """A summed chunk back to float32, as an ``array('f')``."""
    scale = math.ldexp(1.0, exp - frac_bits(workers))
    return array("f", (_to_f32(v * scale) for v in acc))


def error_bound(workers, exp):
    """Largest absolute error of a summed element against the exact sum of the inputs, for a
    result with exponent ``exp`` over ``workers`` contributions, before rounding to float32."""
    return 2.5 * max(int(workers), 1) * math.ldexp(1.0, exp - frac_bits(workers))


def rebase(exp, acc, from_workers, to_workers):
    """A result ``(exp, acc)`` of a job of ``from_workers`` in the fixed point of
    ``to_workers`` (an elastic job that lost a worker replays its last round's results after
    the regrouping): the same values, ``acc * 2^(exp - F(from))``, re-expressed by moving the
    exponent, which is exact. Only if the exponent leaves i8's range is ``acc`` shifted
    instead: right (losing low bits) below it, left (saturating) above it. As
    ``fixed::rebase``; returns ``(exp, array('i'))``."""
    if exp == EXP_ZERO:
        return exp, array("i", acc)  # an all-zero chunk
    want = exp + frac_bits(to_workers) - frac_bits(from_workers)
    clamped = max(-127, min(127, want))
    shift = want - clamped
    if shift == 0:
        return clamped, array("i", acc)
    if shift < 0:
        return clamped, array("i", (a >> min(-shift, 31) for a in acc))
    m = 1 << min(shift, 30)
    return clamped, array("i", (max(I32_MIN, min(I32_MAX, a * m)) for a in acc))


def _wrap_i32(v):
    return ((v + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


def add_into(acc, acc_exp, values, exp):
    """What the aggregator does with one contribution: ``acc`` (a mutable int sequence) and
    its exponent plus ``(values, exp)``; returns the new exponent. Arithmetic shifts of at most
    31 places and int32 wrapping, as the XDP program and ``fixed::add_into`` do."""
    up = exp - acc_exp
    shift_acc = max(0, min(31, up))
    shift_val = max(0, min(31, -up))
    for i, v in enumerate(values):
        acc[i] = _wrap_i32((acc[i] >> shift_acc) + (v >> shift_val))
    return exp if up > 0 else acc_exp


# --- torch, vectorised: the same operations on whole gradients, one exponent per chunk. ----

def _pow2_f64(torch, k):
    """Exact 2^k (int tensor, -1022 <= k <= 1023) as float64, built from its bits."""
    return ((k.to(torch.int64) + 1023) << 52).view(torch.float64)


def _chunked(torch, flat, chunk_values):
    """``flat`` zero-padded to whole chunks, as a (chunks, chunk_values) view."""
    n = flat.numel()
    chunks = -(-n // chunk_values)
    pad = chunks * chunk_values - n
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    return flat.view(chunks, chunk_values)


def check_finite_tensor(t):
    """:func:`check_finite` for a tensor."""
    import torch

    bad = (~torch.isfinite(t.reshape(-1))).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise NotFiniteError(i, float(t.reshape(-1)[i]))


def quantize_tensor(flat, workers, chunk_values):
    """Every chunk of a flat float32 tensor at once: ``(exps, q)``, ``exps`` an int32 tensor
    of one exponent per chunk and ``q`` an int32 tensor of ``flat``'s length; each chunk equals
    :func:`quantize` of it, bit for bit."""
    import torch

    x = _chunked(torch, flat.detach().reshape(-1).to(torch.float32).to(torch.float64),
                 chunk_values)
    m = x.abs().amax(dim=1)
    _, e = torch.frexp(m)
    e = e.clamp(-127, 127)
    e = torch.where(m == 0, torch.full_like(e, EXP_ZERO), e)
    scale = _pow2_f64(torch, frac_bits(workers) - e)
    y = x * scale.unsqueeze(1)
    q = torch.sign(y) * torch.floor(y.abs() + 0.5)
    q = q.clamp(I32_MIN, I32_MAX).to(torch.int32)
    q = torch.where((m == 0).unsqueeze(1), torch.zeros_like(q), q)
    return e.to(torch.int32), q.reshape(-1)[: flat.numel()]


def dequantize_tensor(acc, exps, workers, chunk_values):
    """:func:`dequantize` of every chunk of a flat int32 tensor ``acc`` with one exponent per
    chunk (``exps``): a float32 tensor, bit for bit the same."""
    import torch

    n = acc.numel()
    a = _chunked(torch, acc.reshape(-1).to(torch.float64), chunk_values)
    scale = _pow2_f64(torch, exps.to(torch.int64) - frac_bits(workers))
    return (a * scale.unsqueeze(1)).to(torch.float32).reshape(-1)[:n]
