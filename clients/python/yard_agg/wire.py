"""The aggregation frame: a 32-byte little-endian header after UDP, then ``count`` int32
values (docs/aggregation-protocol.md; ``struct agg_hdr`` in ``ebpf/bpf/yard.h``). Written to
match ``clients/agg/src/wire.rs`` byte for byte: the cross-language test in
``clients/agg/tests/python.rs`` compares the two encoders' output.
"""

import struct
from array import array
from collections import namedtuple

PORT = 7481
MAGIC = struct.unpack("<I", b"YAGG")[0]
VERSION = 3  # 3: every frame carries a token (2 had a reserved field there)
HEADER_LEN = 32
VALUES_MAX = 768
WORKERS_MAX = 64  # members of one job at one aggregator (a tree spreads a larger job)
IP_UDP_LEN = 20 + 8

KIND_DATA = 1
KIND_RESULT = 2
KIND_FANOUT = 3
KINDS = (KIND_DATA, KIND_RESULT, KIND_FANOUT)

FLAG_RETX = 0x01
FLAG_REPLAY = 0x02

DTYPE_I32 = "i32"
DTYPE_F32 = "f32"
DTYPES = (DTYPE_I32, DTYPE_F32)

# magic, version, kind, flags, exp, job, epoch, round, chunk, worker, contributors, count,
# token
_HEADER = struct.Struct("<IBBBbIIIIBBHI")
assert _HEADER.size == HEADER_LEN

Header = namedtuple("Header",
                    "kind flags exp job epoch round chunk worker count contributors token",
                    defaults=(0, 0))
Header.__doc__ = """The header's fields (magic and version are implied).
``exp``: float32, the chunk's block exponent; int32, 0. ``worker``: DATA, the sender's index;
RESULT, 0. ``count``: values that follow. ``contributors``: RESULT, how many contributions the
sum holds (a count that may reach 64, so it is not carried in ``worker``, an index); DATA, 0.
``worker`` and ``contributors`` are one byte each on the wire (a larger value is written as
255, which no aggregator takes). ``token``: DATA, the sender's token at the aggregator;
RESULT, the aggregator's result token (the membership gives both)."""


_BIG_ENDIAN = struct.pack("=i", 1) != struct.pack("<i", 1)


class WireError(ValueError):
    """Bytes that are not an aggregation frame; the message says why."""


def _i32_array(values):
    """A copy of ``values`` as 32-bit ints (OverflowError for one out of range)."""
    a = array("i", values)
    if a.itemsize != 4:  # pragma: no cover - every platform CPython supports has 4-byte int
        raise RuntimeError("array('i') is not 32-bit here")
    return a


def write_header(h):
    """The 32 header bytes of ``h``."""
    return _HEADER.pack(MAGIC, VERSION, h.kind, h.flags, h.exp, h.job, h.epoch, h.round,
                        h.chunk, min(h.worker, 0xFF), min(h.contributors, 0xFF), h.count,
                        h.token)


def encode(h, values):
    """A whole UDP payload: ``h`` with its count set from ``values`` (int32s), then the values
    little-endian. A count that does not fit u16 is written as 65535, as the Rust encoder
    does (the receiver refuses it)."""
    body = _i32_array(values)
    if _BIG_ENDIAN:
        body.byteswap()
    return write_header(h._replace(count=min(len(body), 0xFFFF))) + body.tobytes()


def parse(buf):
    """Parses a UDP payload: ``(Header, body)`` where body is exactly ``count * 4`` bytes
    (trailing bytes, such as Ethernet padding, are ignored). Raises :class:`WireError`."""
    buf = memoryview(buf)
    if len(buf) < HEADER_LEN:
        raise WireError("an aggregation frame needs %d header bytes, got %d"
                        % (HEADER_LEN, len(buf)))
    (magic, version, kind, flags, exp, job, epoch, rnd, chunk, worker, contributors, count,
     token) = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise WireError("bad magic %#010x: not an aggregation frame" % magic)
    if version != VERSION:
        raise WireError("unsupported protocol version %d" % version)
    if kind not in KINDS:
        raise WireError("unknown frame kind %d" % kind)
    if count == 0 or count > VALUES_MAX:
        raise WireError("a frame carries 1 to %d values, this one says %d" % (VALUES_MAX, count))
    body = buf[HEADER_LEN:]
    need = count * 4
    if len(body) < need:
        raise WireError("the header announces %d values but %d bytes follow it"
                        % (count, len(body)))
    return (Header(kind, flags, exp, job, epoch, rnd, chunk, worker, count, contributors, token),
            bytes(body[:need]))


def values(body):
    """The int32 values of a parsed frame's body, as an ``array('i')``."""
    a = array("i")
    a.frombytes(bytes(body[: len(body) - len(body) % 4]))
    if _BIG_ENDIAN:
        a.byteswap()
    return a


class Geometry(namedtuple("Geometry", "values chunk_values")):
    """How a gradient of ``values`` elements is cut into chunks of ``chunk_values`` (the last
    one holds the rest)."""

    __slots__ = ()

    @staticmethod
    def chunk_values_for_mtu(mtu):
        """The largest chunk a link of ``mtu`` (IPv4 MTU) carries, at most VALUES_MAX; None if
        not even one value fits."""
        room = mtu - IP_UDP_LEN - HEADER_LEN
        if room < 0:
            return None
        v = min(room // 4, VALUES_MAX)
        return v if v > 0 else None

    def chunks(self):
        cv = max(self.chunk_values, 1)
        return -(-self.values // cv)

    def chunk_len(self, chunk):
        """Values in ``chunk``; 0 past the end."""
        cv = max(self.chunk_values, 1)
        return max(0, min(self.values - chunk * cv, cv))

    def chunk_start(self, chunk):
        return chunk * self.chunk_values

    def chunk_range(self, chunk):
        start = self.chunk_start(chunk)
        return start, start + self.chunk_len(chunk)
