"""A worker's session with the aggregation agent of the ``yard`` node on its host
(docs/aggregation-protocol.md, "Workers"), as ``clients/agg/src/session.rs``: it joins the
job, then follows the membership the node pushes on a daemon thread. Closing the session
without :meth:`Session.leave` tells the node the worker is gone, exactly as the kernel closing
a crashed process's socket does.
"""

import json
import os
import socket
import threading
import time
from collections import namedtuple

from .wire import DTYPES, Geometry

DEFAULT_SOCKET = "/var/lib/yard/agg.sock"

Membership = namedtuple("Membership",
                        "job epoch worker workers aggregator geometry dtype token result_token")
Membership.__doc__ = """Where and as whom a worker aggregates: ``job`` id, ``epoch``, this
worker's index ``worker`` among ``workers``, ``aggregator`` as ``(ip, port)``, the gradient's
:class:`~yard_agg.wire.Geometry`, ``dtype`` ("i32" or "f32"), the ``token`` this worker's
frames carry (its proof to the aggregator that a frame from its address is its own) and the
``result_token`` the aggregator's results carry (a result without it is ignored)."""

RingMembership = namedtuple("RingMembership", "job epoch rank ranks")
RingMembership.__doc__ = """A job created with ``--grouping ring``: no aggregator; the workers
all-reduce among themselves (``ranks``, ascending) with their framework's own collective."""

WAITING = "waiting"
RUNNING = "running"
RING = "ring"
FAILED = "failed"
CLOSED = "closed"


class JobState(namedtuple("JobState", "kind membership why")):
    """Where the job stands, as the node last said: ``kind`` is WAITING, RUNNING (with
    ``membership``), RING (with a :class:`RingMembership`), FAILED (the job failed or this
    worker was removed: ``why``) or CLOSED (the session ended: ``why``)."""

    __slots__ = ()


class SessionError(Exception):
    """A session could not be opened or used; the message says why."""


def socket_path():
    """``$YARD_AGG_SOCKET`` if set and non-empty, else the default path."""
    return os.environ.get("YARD_AGG_SOCKET") or DEFAULT_SOCKET


def _u(m, key, bits):
    v = m.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < (1 << bits):
        raise ValueError(key)
    return v


def parse_membership(m):
    """A node's ``membership`` object as a :class:`Membership`, or None if malformed."""
    try:
        host, _, port = m["aggregator"].rpartition(":")
        socket.inet_aton(host)
        dtype = m["dtype"]
        if dtype not in DTYPES:
            return None
        return Membership(
            job=_u(m, "job", 32), epoch=_u(m, "epoch", 32), worker=_u(m, "worker", 16),
            workers=_u(m, "workers", 16), aggregator=(host, int(port)),
            geometry=Geometry(_u(m, "values", 32), _u(m, "chunk_values", 16)), dtype=dtype,
            token=_u(m, "token", 32), result_token=_u(m, "result_token", 32))
    except (KeyError, TypeError, ValueError, AttributeError, OSError):
        return None


def parse_line(line):
    """The :class:`JobState` a node's line announces, or None."""
    try:
        v = json.loads(line)
    except ValueError:
        return None
    if not isinstance(v, dict):
        return None
    if "membership" in v:
        m = parse_membership(v["membership"]) if isinstance(v["membership"], dict) else None
        return JobState(RUNNING, m, None) if m else None
    if "waiting" in v:
        return JobState(WAITING, None, None)
    if "ring" in v:
        r = v["ring"]
        try:
            ranks = r["ranks"]
            if not isinstance(ranks, list) or not all(
                    isinstance(x, int) and not isinstance(x, bool) for x in ranks):
                return None
            m = RingMembership(job=_u(r, "job", 32), epoch=_u(r, "epoch", 32),
                               rank=_u(r, "rank", 16), ranks=ranks)
        except (KeyError, TypeError, ValueError):
            return None
        return JobState(RING, m, None)
    for key in ("failed", "gone", "error"):
        if key in v:
            why = v[key] if isinstance(v[key], str) else "the job ended"
            return JobState(FAILED, None, why)
    return None


class Session:
    """A joined worker's session. Use :meth:`join`."""

    def __init__(self, sock, reader, initial, name):
        self._sock = sock
        self._state = initial
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._follow, args=(reader,), name=name,
                                        daemon=True)
        self._thread.start()

    @classmethod
    def join(cls, job, rank, addr, path=None, timeout=30.0):
        """Joins ``job`` (its name) as ``rank``, sending from ``addr`` (``(ip, port)``, the
        worker's bound UDP socket), through the agent at ``path`` (default
        :func:`socket_path`). Raises :class:`SessionError` if the node refuses."""
        path = path or socket_path()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(path)
        except OSError as e:
            sock.close()
            raise SessionError("cannot reach the yard node's aggregation agent at %s: %s"
                               % (path, e)) from None
        try:
            line = json.dumps({"join": {"job": job, "rank": int(rank),
                                        "addr": "%s:%d" % (addr[0], addr[1])}})
            sock.sendall(line.encode() + b"\n")
            reader = sock.makefile("rb")
            first = reader.readline().decode("utf-8", "replace").strip()
        except OSError as e:
            sock.close()
            raise SessionError("aggregation agent i/o failed: %s" % e) from None
        try:
            v = json.loads(first)
        except ValueError:
            v = None
        if isinstance(v, dict) and "error" in v:
            sock.close()
            why = v["error"] if isinstance(v["error"], str) else "no reason given"
            raise SessionError("the node refused the join: %s" % why)
        initial = parse_line(first)
        if initial is None:
            sock.close()
            raise SessionError("the node closed the session at once")
        sock.settimeout(None)
        return cls(sock, reader, initial, "yard-agg-%s-%d" % (job, rank))

    def _follow(self, reader):
        why = None
        while why is None:
            try:
                raw = reader.readline()
            except (OSError, ValueError) as e:
                why = "the aggregation session failed: %s" % e
                break
            if not raw:
                why = "the yard node closed the aggregation session"
                break
            line = raw.decode("utf-8", "replace").strip()
            if '"left"' in line:
                why = "left the job"
                break
            state = parse_line(line)
            if state is not None:
                with self._changed:
                    self._state = state
                    self._changed.notify_all()
        with self._changed:
            if self._state.kind != FAILED:
                self._state = JobState(CLOSED, None, why)
            self._changed.notify_all()

    def state(self):
        """The job's state as the node last said."""
        with self._changed:
            return self._state

    def wait_running(self, timeout):
        """Waits until the job runs, for at most ``timeout`` seconds: this worker's
        :class:`Membership`. Raises :class:`SessionError` if the job ended or timed out."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                s = self._state
                if s.kind in (RUNNING, RING):
                    return s.membership
                if s.kind in (FAILED, CLOSED):
                    raise SessionError(s.why)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SessionError("job not running after %.1f s" % timeout)
                self._changed.wait(left)

    def leave(self, timeout=5.0):
        """Leaves the job cleanly: the node does not report this worker gone."""
        try:
            self._sock.sendall(b'{"leave": true}\n')
        except OSError as e:
            raise SessionError("aggregation agent i/o failed: %s" % e) from None
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._state.kind != CLOSED and time.monotonic() < deadline:
                self._changed.wait(max(deadline - time.monotonic(), 0.001))
        self.close()

    def close(self):
        """Ends the session for both halves (without a leave: the node reports this worker
        gone). The follower thread's reader holds the socket too, so a plain close would not
        end it."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
