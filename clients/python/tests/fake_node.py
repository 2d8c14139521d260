"""A fake yard node for the tests: a Unix socket server thread that decodes frames with a
decoder written here, independently of yard_probe.wire (so an encoder bug is not mirrored)."""

import os
import queue
import socket
import struct
import tempfile
import threading
import time


class DecodeError(Exception):
    pass


def _str(body, at):
    (n,) = struct.unpack_from("<H", body, at)
    if n > 255:
        raise DecodeError("string of %d bytes" % n)
    raw = body[at + 2 : at + 2 + n]
    if len(raw) != n:
        raise DecodeError("truncated string")
    return raw.decode("utf-8"), at + 2 + n


def decode_body(body):
    """One frame body -> (kind, dict)."""
    kind = body[0]
    if kind == 1:
        version, rank, world, local, pid = struct.unpack_from("<HIIII", body, 1)
        at = 19
        job, at = _str(body, at)
        host, at = _str(body, at)
        nic, at = _str(body, at)
        switch, at = _str(body, at)
        (n,) = struct.unpack_from("<H", body, at)
        ports = list(struct.unpack_from("<%dH" % n, body, at + 2))
        end = at + 2 + 2 * n
        msg = dict(version=version, rank=rank, world_size=world, local_rank=local, pid=pid,
                   job=job, host=host, nic=nic, switch=switch, ports=ports)
        name = "hello"
    elif kind == 2:
        (handle,) = struct.unpack_from("<I", body, 1)
        name_, at = _str(body, 5)
        desc, at = _str(body, at)
        (n,) = struct.unpack_from("<I", body, at)
        ranks = list(struct.unpack_from("<%dI" % n, body, at + 4))
        end = at + 4 + 4 * n
        msg = dict(handle=handle, name=name_, desc=desc, ranks=ranks)
        name = "group"
    elif kind == 3:
        f = struct.unpack_from("<IQBBBBIQQQ", body, 1)
        end = 1 + struct.calcsize("<IQBBBBIQQQ")
        msg = dict(handle=f[0], seq=f[1], op=f[2], dtype=f[3], phase=f[4],
                   peer=f[6] if f[5] & 1 else None, count=f[7], bytes=f[8], t_ns=f[9])
        name = "coll"
    elif kind == 4:
        f = struct.unpack_from("<IQIBQQQ", body, 1)
        end = 1 + struct.calcsize("<IQIBQQQ")
        msg = dict(handle=f[0], seq=f[1], peer=f[2], dir=f[3], bytes=f[4], busy_ns=f[5],
                   t_ns=f[6])
        name = "peer"
    elif kind in (5, 6):
        (t_ns,) = struct.unpack_from("<Q", body, 1)
        end = 9
        msg = dict(t_ns=t_ns)
        name = "heartbeat" if kind == 5 else "exit"
    else:
        raise DecodeError("unknown message type %d" % kind)
    if end != len(body):
        raise DecodeError("%s frame has %d trailing bytes" % (name, len(body) - end))
    return name, msg


class FakeNode:
    """Listens on a socket in a fresh temp dir; every decoded frame lands in ``self.frames``
    as (connection number, kind, fields)."""

    def __init__(self, path=None):
        if path is None:
            self._dir = tempfile.TemporaryDirectory()
            path = os.path.join(self._dir.name, "probe.sock")
        self.path = path
        self.frames = queue.Queue()
        self.seen = []
        self._conns = []
        if os.path.exists(path):
            os.unlink(path)
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(path)
        self._server.listen(8)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        n = 0
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._read, args=(n, conn), daemon=True).start()
            n += 1

    def _read(self, n, conn):
        buf = b""
        while True:
            try:
                chunk = conn.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while len(buf) >= 4:
                (length,) = struct.unpack_from("<I", buf)
                if length == 0 or length > 4096:
                    self.frames.put((n, "error", "frame length %d" % length))
                    return
                if len(buf) < 4 + length:
                    break
                body, buf = buf[4 : 4 + length], buf[4 + length :]
                try:
                    kind, msg = decode_body(body)
                except (DecodeError, struct.error, UnicodeDecodeError) as e:
                    self.frames.put((n, "error", str(e)))
                    return
                self.frames.put((n, kind, msg))

    def wait_for(self, done, timeout=10.0):
        """Collects frames until ``done(self.seen)``; raises AssertionError on timeout or on a
        frame the decoder rejected."""
        deadline = time.monotonic() + timeout
        while not done(self.seen):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("timed out; the fake node saw %r" % self.seen)
            try:
                item = self.frames.get(timeout=left)
            except queue.Empty:
                continue
            if item[1] == "error":
                raise AssertionError("connection %d broke the protocol: %s" % (item[0], item[2]))
            self.seen.append(item)
        return self.seen

    def kinds(self, skip_heartbeats=True):
        return [k for _, k, _ in self.seen if not (skip_heartbeats and k == "heartbeat")]

    def of_kind(self, kind):
        return [m for _, k, m in self.seen if k == kind]

    def kill(self):
        """Dies like a crashed node: connections cut, socket file gone."""
        self._server.close()
        for c in self._conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
                c.close()
            except OSError:
                pass
        if os.path.exists(self.path):
            os.unlink(self.path)


def count(kind):
    return lambda seen: sum(1 for _, k, _ in seen if k == kind)
