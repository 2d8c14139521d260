"""Reports ``torch.distributed`` collectives without touching the training code.

``wrap(probe)`` replaces ``all_reduce``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``,
``broadcast``, ``barrier``, ``send`` and ``recv`` in ``torch.distributed`` with versions that
report enqueue/start/end around the original call. torch is imported only when ``wrap`` runs,
so importing ``yard_probe`` never needs it.

Numbering follows Flight Recorder: one ``collective_seq_id`` per process group and rank for
collectives, a separate ``p2p_seq_id`` for send/recv, both from 1, so the node can match the
same op across ranks. Groups are announced lazily, the first time a collective uses them, with
the pg name PyTorch itself uses (``_get_process_group_name``) and the members from
``get_process_group_ranks``.

Caveat: a synchronous NCCL call returns once the op is *enqueued* on the GPU stream, so "end"
here means the host call returned (for ``async_op=True``, that ``work.wait()`` returned). A
rank blocked in an op still shows it as started and not ended, which is what a hang needs;
for device-accurate completion times use the NCCL profiler plugin (``clients/nccl-profiler``).
"""

from . import wire

# name -> (op, index of the tensor that sizes the op, index of `group`, peer kwarg or None)
_WRAPPED = {
    "all_reduce": ("all_reduce", 0, 2, None),
    "all_gather_into_tensor": ("all_gather", 1, 2, None),
    "reduce_scatter_tensor": ("reduce_scatter", 1, 3, None),
    "broadcast": ("broadcast", 0, 2, None),
    "barrier": ("barrier", None, 0, None),
    "send": ("send", 0, 2, ("dst", 1)),
    "recv": ("recv", 0, 2, ("src", 1)),
}

_MARK = "_yard_probe_original"


def wrap(probe, dist=None):
    """Wraps ``torch.distributed`` (or ``dist``) to report to ``probe``. Returns False, and
    changes nothing, if torch is not importable. Wrapping twice is harmless."""
    if dist is None:
        try:
            import torch.distributed as dist  # noqa: PLC0415 (import only when asked)
        except ImportError:
            return False
    tracker = _Groups(probe, dist)
    for name, spec in _WRAPPED.items():
        original = getattr(dist, name, None)
        if original is None:
            continue
        original = getattr(original, _MARK, original)
        setattr(dist, name, _wrapper(probe, tracker, name, spec, original))
    return True


def unwrap(dist=None):
    """Restores the original functions."""
    if dist is None:
        try:
            import torch.distributed as dist  # noqa: PLC0415
        except ImportError:
            return
    for name in _WRAPPED:
        fn = getattr(dist, name, None)
        if fn is not None and hasattr(fn, _MARK):
            setattr(dist, name, getattr(fn, _MARK))


class _Groups:
    """Process group objects -> registered probe groups."""

    def __init__(self, probe, dist):
        self.probe = probe
        self.dist = dist
        self.by_id = {}

    def get(self, pg):
        if pg is None:
            pg = self._default_group()
        key = id(pg)
        entry = self.by_id.get(key)
        if entry is None:
            ranks = self.dist.get_process_group_ranks(pg)
            name = self._name(pg)
            desc = getattr(pg, "group_desc", "") or ""
            # Keep `pg` alive so its id() is never reused by another group.
            entry = (pg, self.probe.group(name, ranks, desc=desc))
            self.by_id[key] = entry
        return entry[1]

    def _default_group(self):
        c10d = getattr(self.dist, "distributed_c10d", None)
        if c10d is not None and hasattr(c10d, "_get_default_group"):
            return c10d._get_default_group()
        return self.dist.group.WORLD

    def _name(self, pg):
        c10d = getattr(self.dist, "distributed_c10d", None)
        getter = getattr(c10d, "_get_process_group_name", None)
        if getter is not None:
            try:
                return str(getter(pg))
            except Exception:  # an unregistered group: fall back to our own numbering
                pass
        return str(len(self.by_id))


def _arg(args, kwargs, index, name):
    if name in kwargs:
        return kwargs[name]
    if index is not None and index < len(args):
        return args[index]
    return None


def _wrapper(probe, groups, fn_name, spec, original):
    op, tensor_at, group_at, peer_spec = spec

    def reported(*args, **kwargs):
        group = groups.get(_arg(args, kwargs, group_at, "group"))
        tensor = _arg(args, kwargs, tensor_at, "tensor")
        if tensor_at == 1 and tensor is None:
            tensor = kwargs.get("input_tensor", kwargs.get("input"))
        peer = None
        if peer_spec is not None:
            peer = _arg(args, kwargs, peer_spec[1], peer_spec[0])
        if tensor is not None and hasattr(tensor, "numel"):
            count = int(tensor.numel())
            nbytes = count * int(tensor.element_size())
            dtype = tensor.dtype
        else:
            count, nbytes, dtype = 0, 0, None
        seq = group.next_p2p_seq() if peer_spec is not None else group.next_seq()
        emit = lambda phase: probe.coll(group, seq, op, dtype, count, nbytes, phase, peer)  # noqa: E731
        emit(wire.ENQUEUE)
        emit(wire.START)
        result = original(*args, **kwargs)
        if kwargs.get("async_op") and result is not None and hasattr(result, "wait"):
            return _ReportedWork(result, lambda: emit(wire.END))
        emit(wire.END)
        return result

    reported.__name__ = fn_name
    reported.__doc__ = getattr(original, "__doc__", None)
    setattr(reported, _MARK, original)
    return reported


class _ReportedWork:
    """An async op's Work handle that reports the end when waited on."""

    def __init__(self, work, on_end):
        self._work = work
        self._on_end = on_end

    def wait(self, *args, **kwargs):
        result = self._work.wait(*args, **kwargs)
        if self._on_end is not None:
            self._on_end()
            self._on_end = None
        return result

    def __getattr__(self, name):
        return getattr(self._work, name)
