"""Reports a training rank's collectives to the ``yard`` node on its host.

The wire format is specified in ``diagnosis/src/wire.rs`` of the Switchyard repository. The
training loop never waits for the node: each event is one non-blocking send, and if the node
is absent, restarting or not reading, the event is dropped and counted in ``Probe.dropped``.
A frame the socket took only in part is finished before anything else is sent, so the stream
never goes out of step. The probe reconnects on its own (re-sending HELLO and every group)
when the node comes back, and a daemon thread sends a heartbeat every 100 ms so the node can
tell a rank that is computing from one that is dead.
"""

import contextlib
import os
import socket as _socket
import threading
import time

from . import wire

__all__ = ["Probe", "Group", "DEFAULT_SOCKET", "socket_path"]

DEFAULT_SOCKET = "/var/lib/yard/probe.sock"
HEARTBEAT_INTERVAL_S = 0.1
RECONNECT_INTERVAL_S = 0.1


def socket_path():
    """``$YARD_PROBE_SOCKET`` if set and non-empty, else the default path."""
    return os.environ.get("YARD_PROBE_SOCKET") or DEFAULT_SOCKET


def now_ns():
    return time.time_ns()


class Group:
    """A registered process group: its wire handle and its per-rank sequence counters."""

    def __init__(self, handle, name, ranks, desc):
        self.handle = handle
        self.name = name
        self.ranks = list(ranks)
        self.desc = desc
        self._seq = 0
        self._p2p_seq = 0

    def next_seq(self):
        """The next collective number on this rank, from 1 (Flight Recorder's
        ``collective_seq_id``)."""
        self._seq += 1
        return self._seq

    def next_p2p_seq(self):
        """The next send/recv number on this rank (Flight Recorder's ``p2p_seq_id``)."""
        self._p2p_seq += 1
        return self._p2p_seq

    def __repr__(self):
        return "Group(%r, handle=%d, ranks=%d)" % (self.name, self.handle, len(self.ranks))


def _count_bytes_dtype(tensor_or_count, dtype):
    """(count, bytes, dtype) of a tensor-like object (``numel``, ``element_size``, ``dtype``)
    or of a plain element count."""
    if hasattr(tensor_or_count, "numel"):
        count = int(tensor_or_count.numel())
        size = int(tensor_or_count.element_size())
        return count, count * size, dtype if dtype is not None else tensor_or_count.dtype
    count = int(tensor_or_count)
    size = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "float16": 2, "bfloat16": 2}
    code = wire.dtype_code(dtype)
    name = next((n for n, c in wire.DTYPES.items() if c == code), "")
    return count, count * size.get(name, 1), dtype


class Probe:
    """One rank's connection to its node. Thread-safe."""

    def __init__(self, job, rank, world_size, socket=None, local_rank=None, host="",
                 nic="", switch="", ports=(), heartbeat=True):
        self.path = socket or socket_path()
        self.rank = rank
        self._hello = wire.hello(
            rank, world_size, rank if local_rank is None else local_rank, os.getpid(),
            job, host, nic, switch, ports,
        )
        self._lock = threading.Lock()
        self._sock = None
        self._backlog = b""
        self._group_frames = []
        self._groups = []
        self._last_attempt = None
        self._dropped = 0
        self._stop = threading.Event()
        self._exited = False
        with self._lock:
            self._ensure_connected()
        self._beat = None
        if heartbeat:
            self._beat = threading.Thread(
                target=self._heartbeat_loop, name="yard-probe-heartbeat", daemon=True
            )
            self._beat.start()

    # -- reporting -------------------------------------------------------------------------

    def group(self, name, ranks, desc=""):
        """Registers a process group (name as PyTorch's pg name, members' global ranks in
        group-rank order); announced now if connected and after every reconnect."""
        with self._lock:
            g = Group(len(self._groups), str(name), ranks, desc)
            self._groups.append(g)
            frames = wire.group(g.handle, g.name, desc, g.ranks)
            self._group_frames.append(frames)
            if self._sock is not None:
                self._backlog += frames
                self._flush_backlog()
            return g

    def coll(self, group, seq, op, dtype, count, nbytes, phase, peer=None, t_ns=None):
        """Reports one phase (``wire.ENQUEUE``/``START``/``END``) of one collective."""
        self._send(wire.coll(
            group.handle, seq, wire.op_code(op), wire.dtype_code(dtype), phase, peer,
            count, nbytes, now_ns() if t_ns is None else t_ns,
        ))

    @contextlib.contextmanager
    def collective(self, group, op, tensor_or_count, dtype=None, peer=None, seq=None):
        """Brackets one collective: enqueue and start when entered, end when left normally.
        An exception leaves the op without an end, which is the truth: it did not finish.
        Yields the seq used."""
        count, nbytes, dtype = _count_bytes_dtype(tensor_or_count, dtype)
        if seq is None:
            p2p = wire.op_code(op) in (wire.OPS["send"], wire.OPS["recv"])
            seq = group.next_p2p_seq() if p2p else group.next_seq()
        self.coll(group, seq, op, dtype, count, nbytes, wire.ENQUEUE, peer)
        self.coll(group, seq, op, dtype, count, nbytes, wire.START, peer)
        yield seq
        self.coll(group, seq, op, dtype, count, nbytes, wire.END, peer)

    def peer(self, group, seq, peer, direction, nbytes, busy_ns=0):
        """Reports cumulative progress with one peer (``wire.SEND``/``RECV``) in one op."""
        self._send(wire.peer(group.handle, seq, peer, direction, nbytes, busy_ns, now_ns()))

    def heartbeat(self):
        self._send(wire.heartbeat(now_ns()))

    def exit(self):
        """Says goodbye (silence afterwards is a clean exit) and stops the heartbeat."""
        self._stop.set()
        self._send(wire.exit_(now_ns()), last=True)

    def close(self):
        """Stops the heartbeat and closes the socket without saying goodbye."""
        self._stop.set()
        if self._beat is not None and self._beat is not threading.current_thread():
            self._beat.join(1.0)
        with self._lock:
            self._disconnect()

    @property
    def dropped(self):
        """Events dropped so far because the node was away or not reading."""
        return self._dropped

    @property
    def connected(self):
        return self._sock is not None

    # -- transport -------------------------------------------------------------------------

    def _heartbeat_loop(self):
        while not self._stop.wait(HEARTBEAT_INTERVAL_S):
            self.heartbeat()

    def _send(self, frame, last=False):
        # Nothing follows EXIT, not even a heartbeat the background thread was already sending:
        # the node would read the rank as alive again, and then as dead.
        with self._lock:
            if self._exited or not (
                self._ensure_connected() and self._flush_backlog() and self._write(frame)
            ):
                self._dropped += 1
            self._exited = self._exited or last

    def _ensure_connected(self):
        if self._sock is not None:
            return True
        now = time.monotonic()
        if self._last_attempt is not None and now - self._last_attempt < RECONNECT_INTERVAL_S:
            return False
        self._last_attempt = now
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
            sock.setblocking(False)
        except OSError:
            sock.close()
            return False
        self._sock = sock
        self._backlog = self._hello + b"".join(self._group_frames)
        return True

    def _flush_backlog(self):
        while self._backlog:
            if self._sock is None:
                return False
            try:
                n = self._sock.send(self._backlog)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:
                return self._disconnect()
            self._backlog = self._backlog[n:]
        return True

    def _write(self, frame):
        if self._sock is None:
            return False
        try:
            n = self._sock.send(frame)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return self._disconnect()
        self._backlog = frame[n:]
        return True

    def _disconnect(self):
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        self._sock = None
        self._backlog = b""
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
