"""Encoding of the probe wire format.

The format is specified once, in the module doc of ``diagnosis/src/wire.rs`` in the Switchyard
repository; this module only encodes it. Codes below mirror ``Op::code``, ``Dtype::code``,
``Phase`` and ``Dir`` in ``diagnosis/src/event.rs``.
"""

import struct

VERSION = 1
MAX_FRAME = 4096
MAX_STR = 255
MAX_GROUP_RANKS_PER_FRAME = 800
MAX_PORTS = 1000

HELLO, GROUP, COLL, PEER, HEARTBEAT, EXIT = 1, 2, 3, 4, 5, 6

ENQUEUE, START, END = 0, 1, 2
SEND, RECV = 0, 1

OPS = {
    "all_reduce": 0,
    "all_gather": 1,
    "reduce_scatter": 2,
    "broadcast": 3,
    "reduce": 4,
    "all_to_all": 5,
    "barrier": 6,
    "send": 7,
    "recv": 8,
    "gather": 9,
    "scatter": 10,
    "coalesced": 11,
}
OP_OTHER = 255

DTYPES = {
    "float32": 0,
    "float16": 1,
    "bfloat16": 2,
    "float64": 3,
    "int32": 4,
    "int64": 5,
    "int8": 6,
    "uint8": 7,
    "bool": 8,
    "float8": 9,
}
DTYPE_OTHER = 255

# torch's aliases for the names above (str(torch.float) is "torch.float32" already, but
# users write "float", "half", "long", ...).
_DTYPE_ALIASES = {
    "float": "float32",
    "half": "float16",
    "double": "float64",
    "int": "int32",
    "long": "int64",
    "short": "int16",
}

_COLL = struct.Struct("<IBIQBBBBIQQQ")
_PEER = struct.Struct("<IBIQIBQQQ")
_TIME = struct.Struct("<IBQ")


def op_code(op):
    """The wire code of an op name ("all_reduce", PyTorch's "_all_gather_base", ...)."""
    name = str(op).lower()
    if name.startswith("nccl:"):
        name = name[5:]
    if name.endswith("coalesced"):
        return OPS["coalesced"]
    name = name.lstrip("_")
    for suffix in ("_base", "_into_tensor", "_tensor", "_single"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return OPS.get(name, OP_OTHER)


def dtype_code(dtype):
    """The wire code of a dtype: a name, "torch.bfloat16", or a torch dtype object."""
    if dtype is None:
        return DTYPE_OTHER
    name = str(dtype)
    if name.startswith("torch."):
        name = name[6:]
    name = _DTYPE_ALIASES.get(name, name)
    if name.startswith("float8"):
        return DTYPES["float8"]
    return DTYPES.get(name, DTYPE_OTHER)


def _frame(body):
    return struct.pack("<I", len(body)) + body


def _str(s):
    raw = s.encode("utf-8")
    if len(raw) > MAX_STR:
        # Cut at a character boundary, like the Rust encoder.
        raw = raw[:MAX_STR].decode("utf-8", "ignore").encode("utf-8")
    return struct.pack("<H", len(raw)) + raw


def hello(rank, world_size, local_rank, pid, job, host="", nic="", switch="", ports=()):
    ports = list(ports)[:MAX_PORTS]
    body = struct.pack("<BHIIII", HELLO, VERSION, rank, world_size, local_rank, pid)
    body += _str(job) + _str(host) + _str(nic) + _str(switch)
    body += struct.pack("<H%dH" % len(ports), len(ports), *ports)
    return _frame(body)


def group(handle, name, desc, ranks):
    """The GROUP frames for one group (large groups span several frames)."""
    ranks = list(ranks)
    chunks = [
        ranks[i : i + MAX_GROUP_RANKS_PER_FRAME]
        for i in range(0, len(ranks), MAX_GROUP_RANKS_PER_FRAME)
    ] or [[]]
    out = b""
    for chunk in chunks:
        body = struct.pack("<BI", GROUP, handle) + _str(name) + _str(desc)
        body += struct.pack("<I%dI" % len(chunk), len(chunk), *chunk)
        out += _frame(body)
    return out


def coll(handle, seq, op, dtype, phase, peer, count, nbytes, t_ns):
    """A COLL frame; ``op`` and ``dtype`` are wire codes, ``peer`` a global rank or None."""
    flags = 0 if peer is None else 1
    return _COLL.pack(
        _COLL.size - 4, COLL, handle, seq, op, dtype, phase, flags,
        peer or 0, count, nbytes, t_ns,
    )


def peer(handle, seq, peer_rank, direction, nbytes, busy_ns, t_ns):
    return _PEER.pack(
        _PEER.size - 4, PEER, handle, seq, peer_rank, direction, nbytes, busy_ns, t_ns
    )


def heartbeat(t_ns):
    return _TIME.pack(_TIME.size - 4, HEARTBEAT, t_ns)


def exit_(t_ns):
    return _TIME.pack(_TIME.size - 4, EXIT, t_ns)
