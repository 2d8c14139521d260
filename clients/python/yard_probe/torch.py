"""Reports ``torch.distributed`` collectives without touching the training code.

``wrap(probe)`` replaces the collectives and point-to-point calls of ``torch.distributed``
(``all_reduce``, ``all_gather``, ``all_gather_into_tensor``, ``reduce_scatter``,
``reduce_scatter_tensor``, ``broadcast``, ``reduce``, ``gather``, ``scatter``, ``all_to_all``,
``all_to_all_single``, ``barrier``, ``send``, ``recv``, ``isend``, ``irecv``) with versions that
report enqueue/start/end around the original call. torch is imported only when ``wrap`` runs,
so importing ``yard_probe`` never needs it. Only the names in the ``torch.distributed``
namespace are replaced: torch's own internal calls (``all_gather_object`` calling
``all_gather``) go on unreported, so nothing is counted twice.

Tested against PyTorch 1.13 (Debian's ``python3-torch``, gloo) and written to keep working on
newer versions: every private helper is looked up when used and has a fallback, because the
private API moved between versions (``_get_process_group_name`` and ``_world`` appeared in 2.0,
``ProcessGroup.group_desc`` in 2.4).

Numbering follows Flight Recorder: one ``collective_seq_id`` per process group and rank for
collectives, a separate ``p2p_seq_id`` for send/recv, both from 1, so the node can match the
same op across ranks. Groups are announced lazily, the first time a collective uses them, with
the pg name PyTorch itself uses (the same on every rank) and the members from
``get_process_group_ranks``. A rank that is not a member of the group it passes (torch then
only warns and returns) reports nothing, so its counters stay in step with the members'.

``count`` and ``bytes`` are what this rank contributes (for the ``_into_tensor``/``_tensor``
variants, the input), which is the same on every member of a healthy op: the analyzer compares
them across ranks to spot mismatches.

End: for a synchronous call, when it returned; for ``async_op=True`` (given by keyword or by
position) and ``isend``/``irecv``, when the work's future completes, or, where the backend's
work has no future (gloo's send/recv in 1.13), when ``wait()`` returns. The work object is returned unchanged where a future exists, so
``isinstance`` and every method keep working. An op whose call raised, or whose future failed,
ends then too: it is over on this rank, and only an op that never returns is a hang. That covers
ops a backend refuses up front (gloo in 1.13 raises "not supported" for
``all_gather_into_tensor``, ``reduce_scatter_tensor`` and ``reduce_scatter`` before moving a
byte, and jobs catch that and fall back to another call); a real failure ends the op as well,
and the job's exit or death is what the analyzer then sees.

Caveat: a synchronous NCCL call returns once the op is *enqueued* on the GPU stream, so "end"
there means the host call returned. A rank blocked in an op still shows it as started and not
ended, which is what a hang needs; for device-accurate completion times use the NCCL profiler
plugin (``clients/nccl-profiler``).
"""

import collections
import threading

from . import wire

# How one function is reported. `size`: (position, keyword) of the tensor (or tensor list)
# that sizes the op, or None; `group`: position of `group`; `async_at`: position of
# `async_op`, None for a call that is always synchronous, ALWAYS for isend/irecv; `peer`:
# (keyword, position) of the peer's global rank for send/recv.
_Spec = collections.namedtuple("_Spec", "op size group async_at peer")
ALWAYS = "always"

# Positions are those of torch 1.13 and every later version (checked against 1.13's
# signatures by the real-torch test).
_WRAPPED = {
    "all_reduce": _Spec("all_reduce", (0, "tensor"), 2, 3, None),
    "all_gather": _Spec("all_gather", (1, "tensor"), 2, 3, None),
    "all_gather_into_tensor": _Spec("all_gather", (1, "input_tensor"), 2, 3, None),
    "reduce_scatter": _Spec("reduce_scatter", (1, "input_list"), 3, 4, None),
    "reduce_scatter_tensor": _Spec("reduce_scatter", (1, "input"), 3, 4, None),
    "broadcast": _Spec("broadcast", (0, "tensor"), 2, 3, None),
    "reduce": _Spec("reduce", (0, "tensor"), 3, 4, None),
    "gather": _Spec("gather", (0, "tensor"), 3, 4, None),
    "scatter": _Spec("scatter", (0, "tensor"), 3, 4, None),
    "all_to_all": _Spec("all_to_all", (1, "input_tensor_list"), 2, 3, None),
    "all_to_all_single": _Spec("all_to_all", (1, "input"), 4, 5, None),
    "barrier": _Spec("barrier", None, 0, 1, None),
    "send": _Spec("send", (0, "tensor"), 2, None, ("dst", 1)),
    "recv": _Spec("recv", (0, "tensor"), 2, None, ("src", 1)),
    "isend": _Spec("send", (0, "tensor"), 2, ALWAYS, ("dst", 1)),
    "irecv": _Spec("recv", (0, "tensor"), 2, ALWAYS, ("src", 1)),
}

_MARK = "_yard_probe_original"
_TRACKER = "_yard_probe_groups"


def wrap(probe, dist=None):
    """Wraps ``torch.distributed`` (or ``dist``) to report to ``probe``. Returns False, and
    changes nothing, if torch is not importable. Wrapping twice is harmless: nothing is
    reported twice, and the same probe keeps its groups and counters."""
    if dist is None:
        try:
            import torch.distributed as dist  # noqa: PLC0415 (import only when asked)
        except ImportError:
            return False
    # One tracker per probe, kept across re-wraps: a new one would number groups and seqs
    # from the start again and put this rank out of step with the others.
    tracker = getattr(dist, _TRACKER, None)
    if tracker is None or tracker.probe is not probe or tracker.dist is not dist:
        tracker = _Groups(probe, dist)
        setattr(dist, _TRACKER, tracker)
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
    if hasattr(dist, _TRACKER):
        delattr(dist, _TRACKER)


class _Groups:
    """Process group objects -> registered probe groups (None: this rank is not a member)."""

    def __init__(self, probe, dist):
        self.probe = probe
        self.dist = dist
        self.c10d = getattr(dist, "distributed_c10d", None)
        self.by_id = {}
        self._lock = threading.Lock()

    def get(self, pg):
        """The probe group for ``pg`` (None: the default group), or None if this rank is not
        in it."""
        if pg is None:
            pg = self._default_group()
        if self._not_member(pg):
            return None
        with self._lock:
            entry = self.by_id.get(id(pg))
            if entry is None:
                ranks = self._ranks(pg)
                name = self._name(pg)
                # Keep `pg` alive so its id() is never reused by another group.
                entry = (pg, self.probe.group(name, ranks, desc=self._desc(pg)))
                self.by_id[id(pg)] = entry
            return entry[1]

    def global_rank(self, pg, group_rank):
        """The global rank of ``group_rank`` in ``pg`` (None: the default group), for the
        ``group_dst``/``group_src`` keywords of torch >= 2.6; None if torch cannot say."""
        getter = getattr(self.dist, "get_global_rank", None)
        try:
            return int(getter(pg if pg is not None else self._default_group(), group_rank))
        except Exception:
            return None

    def _default_group(self):
        if self.c10d is not None and hasattr(self.c10d, "_get_default_group"):
            return self.c10d._get_default_group()
        return self.dist.group.WORLD

    def _not_member(self, pg):
        # torch gives a non-member a sentinel (GroupMember.NON_GROUP_MEMBER) instead of a group.
        check = getattr(self.c10d, "_rank_not_in_group", None)
        if check is not None:
            try:
                return bool(check(pg))
            except Exception:  # a private helper changed its mind: use the public sentinel
                pass
        member = getattr(self.dist, "GroupMember", None)
        return member is not None and pg is getattr(member, "NON_GROUP_MEMBER", object())

    def _ranks(self, pg):
        getter = getattr(self.dist, "get_process_group_ranks", None)
        if getter is not None:
            return [int(r) for r in getter(pg)]
        table = getattr(self.c10d, "_pg_group_ranks", None)  # before get_process_group_ranks
        if table is not None and pg in table:
            by_group_rank = sorted(table[pg].items(), key=lambda kv: kv[1])
            return [int(g) for g, _ in by_group_rank]
        return list(range(pg.size()))

    def _name(self, pg):
        """The name torch gave the group ("0" for the default one, then "1", ...), which is
        what Flight Recorder dumps carry: 2.x has a getter, 1.13 only a dict."""
        getter = getattr(self.c10d, "_get_process_group_name", None)
        if getter is not None:
            try:
                name = getter(pg)
                # 2.x answers "None" for a group it does not know rather than raising.
                if name is not None and str(name) not in ("", "None"):
                    return str(name)
            except Exception:  # an unregistered group: try the tables, then our own numbering
                pass
        world = getattr(self.c10d, "_world", None)
        for table in (getattr(world, "pg_names", None), getattr(self.c10d, "_pg_names", None)):
            if isinstance(table, dict) and pg in table:
                return str(table[pg])
        return str(len(self.by_id))

    def _desc(self, pg):
        desc = getattr(pg, "group_desc", None)  # torch >= 2.4
        if desc:
            return str(desc)
        # What 2.4+ calls the default group, so that dumps and probes agree on older versions.
        try:
            return "default_pg" if pg is self._default_group() else ""
        except Exception:
            return ""


def _arg(args, kwargs, index, name):
    """An argument given by keyword or by position: real code passes ``group`` and
    ``async_op`` both ways."""
    if name in kwargs:
        return kwargs[name]
    if index is not None and index < len(args):
        return args[index]
    return None


def _size(sized_by):
    """(count, bytes, dtype) of a tensor or a list of tensors (summed; dtype of the first)."""
    tensors = sized_by if isinstance(sized_by, (list, tuple)) else [sized_by]
    count = nbytes = 0
    dtype = None
    for t in tensors:
        if t is None or not hasattr(t, "numel"):
            continue
        n = int(t.numel())
        count += n
        nbytes += n * int(t.element_size())
        if dtype is None:
            dtype = t.dtype
    return count, nbytes, dtype


def _wrapper(probe, groups, fn_name, spec, original):
    def reported(*args, **kwargs):
        """The original call between enqueue/start and end reports."""
        pg = _arg(args, kwargs, spec.group, "group")
        group = groups.get(pg)
        if group is None:  # not a member: torch does nothing, and neither do we
            return original(*args, **kwargs)
        sized_by = None
        if spec.size is not None:
            sized_by = _arg(args, kwargs, spec.size[0], spec.size[1])
        count, nbytes, dtype = _size(sized_by)
        peer = None
        if spec.peer is not None:
            peer = _arg(args, kwargs, spec.peer[1], spec.peer[0])
            if peer is not None:
                peer = int(peer)
            elif kwargs.get("group_" + spec.peer[0]) is not None:
                peer = groups.global_rank(pg, int(kwargs["group_" + spec.peer[0]]))
        if spec.async_at == ALWAYS:
            is_async = True
        elif spec.async_at is None:
            is_async = False
        else:
            is_async = bool(_arg(args, kwargs, spec.async_at, "async_op"))
        seq = group.next_p2p_seq() if spec.peer is not None else group.next_seq()

        def emit(phase):
            probe.coll(group, seq, spec.op, dtype, count, nbytes, phase, peer)

        emit(wire.ENQUEUE)
        emit(wire.START)
        try:
            result = original(*args, **kwargs)
        except Exception:
            emit(wire.END)
            raise
        if is_async and result is not None and hasattr(result, "wait"):
            return _on_completion(result, lambda: emit(wire.END))
        emit(wire.END)
        return result

    reported.__name__ = fn_name
    reported.__qualname__ = fn_name
    reported.__doc__ = getattr(original, "__doc__", None)
    reported.__wrapped__ = original
    setattr(reported, _MARK, original)
    return reported


class _Once:
    """Calls ``fn`` the first time it is called, from whichever thread, never again."""

    def __init__(self, fn):
        self._fn = fn
        self._lock = threading.Lock()

    def __call__(self):
        with self._lock:
            fn, self._fn = self._fn, None
        if fn is not None:
            fn()


def _on_completion(work, on_end):
    """Arranges ``on_end`` for when the async ``work`` completes. With a future (gloo's and
    NCCL's collectives), a done-callback reports it, whoever waits and however, and the work
    goes back unchanged; without one (``get_future`` raises, as for gloo's send/recv in
    1.13), the work is wrapped so that ``wait`` reports it."""
    once = _Once(on_end)
    future = None
    get_future = getattr(work, "get_future", None)
    if get_future is not None:
        try:
            future = get_future()
        except Exception:  # "Work::getFuture not implemented" for this backend and op
            future = None
    if future is not None and hasattr(future, "add_done_callback"):

        def done(fut):
            # Completed or failed alike, the op is over on this rank.
            once()

        try:
            future.add_done_callback(done)
            return work
        except Exception:
            pass
    return _ReportedWork(work, once)


class _ReportedWork:
    """An async op's Work handle, for works without a future: reports the end when ``wait()``
    returns; everything else goes to the real work. Not on ``is_completed()``: it is true
    for a failed op as well, and what tells failure apart (``is_success``, ``exception``)
    is deprecated and warns. (gloo's p2p works complete only in ``wait()`` anyway.)"""

    def __init__(self, work, on_end):
        self._work = work
        self._on_end = on_end

    def wait(self, *args, **kwargs):
        try:
            result = self._work.wait(*args, **kwargs)
        except Exception:
            self._on_end()
            raise
        self._on_end()
        return result

    def __getattr__(self, name):
        return getattr(self._work, name)
