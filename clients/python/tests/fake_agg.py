"""An in-process fake aggregator and fake node agent for the yard_agg tests.

``FakeAggregator`` is a UDP server thread on loopback with the XDP program's semantics that
the client depends on (docs/aggregation-protocol.md, "The aggregator"): contributions summed
once per worker (a duplicate is never added twice), a chunk completed exactly once and its sum
sent to every worker, a contribution to a completed chunk answered with the stored sum, a
REPLAY (a regrouped worker's stored result) taken as the sum of an incomplete chunk, frames of
another epoch or job dropped. Faults are seeded: loss of DATA and of RESULT frames,
duplicated and reordered frames. It decodes and encodes frames with its own ``struct`` code,
not ``yard_agg.wire``, so an encoder bug is not mirrored.

``FakeAgent`` is the node's agent: a Unix socket speaking the JSON lines of the protocol.
"""

import json
import os
import random
import socket
import struct
import tempfile
import threading
import time

# magic, version, kind, flags, exp, job, epoch, round, chunk, worker, contributors, count,
# token
HDR = struct.Struct("<IBBBbIIIIBBHI")
VERSION = 3
# The fake's result token, and worker w's token: TOKEN_BASE + w.
RESULT_TOKEN = 0x52455355
TOKEN_BASE = 0x544F4B00
MAGIC = struct.unpack("<I", b"YAGG")[0]


def frac_bits(workers):
    return 30 - (max(workers, 1) - 1).bit_length()


def wrap(v):
    return ((v + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


class FakeAggregator:
    def __init__(self, job, epoch, workers, values, chunk_values, dtype="i32", seed=0,
                 drop_data=0.0, drop_result=0.0, duplicate=0.0, reorder=0.0,
                 hold_results=False, mute_to=(), mute_from_round=0):
        self.job, self.epoch, self.workers = job, epoch, workers
        self.values, self.cv, self.dtype = values, chunk_values, dtype
        self.rng = random.Random(seed)
        self.drop_data, self.drop_result = drop_data, drop_result
        self.duplicate, self.reorder = duplicate, reorder
        self.hold_results = hold_results
        # Worker indices that get no results of rounds >= mute_from_round.
        self.mute_to = set(mute_to)
        self.mute_from_round = mute_from_round
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.01)
        self.addr = self.sock.getsockname()
        self.lock = threading.Lock()
        self.slots = {}  # (round, chunk) -> dict(bitmap, acc, exp, result)
        self.addrs = {}  # worker index -> address (learnt from its frames)
        self.completed = {}  # (round, chunk) -> times completed
        self.flags_seen = []  # (worker, round, chunk, flags) of every frame taken
        self.dropped = {"stale": 0, "bad": 0, "foreign": 0}
        self.seen = {}  # (worker, round) -> set of chunks received
        self.delivered = {}  # (worker, round) -> set of chunks whose result was sent
        self.max_outstanding = 0
        self.held = []
        self.stop_flag = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def chunks(self):
        return -(-self.values // self.cv)

    @staticmethod
    def token(worker):
        """The token worker ``worker``'s frames must carry."""
        return TOKEN_BASE + worker

    result_token = RESULT_TOKEN

    def chunk_len(self, c):
        return max(0, min(self.values - c * self.cv, self.cv))

    def close(self):
        self.stop_flag = True
        self.thread.join(5)
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def release(self):
        """Sends every held result (``hold_results``) and stops holding."""
        with self.lock:
            held, self.held = self.held, []
            self.hold_results = False
        for frame, to, w, key in held:
            self._send(frame, to, w, key)

    def _send(self, frame, to, w, key):
        muted = w in self.mute_to and key[1] >= self.mute_from_round
        if muted or self.rng.random() < self.drop_result:
            return
        self.delivered.setdefault(key, set()).add(HDR.unpack_from(frame)[8])
        self.sock.sendto(frame, to)

    def _result(self, rnd, chunk, slot):
        n = len(slot["acc"])
        h = HDR.pack(MAGIC, VERSION, 2, 0, slot["exp"], self.job, self.epoch, rnd, chunk, 0,
                     bin(slot["bitmap"]).count("1"), n, RESULT_TOKEN)
        return h + struct.pack("<%di" % n, *slot["acc"])

    def _run(self):
        pending = []  # reordered frames waiting
        while not self.stop_flag:
            try:
                data, src = self.sock.recvfrom(65536)
            except socket.timeout:
                data = None
            except OSError:
                return
            if data is not None:
                copies = 2 if self.rng.random() < self.duplicate else 1
                for _ in range(copies):
                    if self.rng.random() < self.reorder:
                        pending.append((data, src))
                    else:
                        self._take(data, src)
            if pending and (data is None or len(pending) > 8):
                self.rng.shuffle(pending)
                for d, s in pending:
                    self._take(d, s)
                pending = []

    def _take(self, data, src):
        if self.rng.random() < self.drop_data:
            return
        if len(data) < 32:
            self.dropped["bad"] += 1
            return
        (magic, ver, kind, flags, exp, job, epoch, rnd, chunk, worker, _contributors, count,
         token) = HDR.unpack_from(data)
        if (magic != MAGIC or ver != VERSION or kind != 1 or chunk >= self.chunks()
                or count != self.chunk_len(chunk) or len(data) < 32 + 4 * count
                or (self.dtype == "i32" and exp != 0)):
            self.dropped["bad"] += 1
            return
        if job != self.job or epoch != self.epoch:
            self.dropped["stale"] += 1
            return
        if worker >= self.workers or token != self.token(worker):
            self.dropped["foreign"] += 1
            return
        vals = list(struct.unpack_from("<%di" % count, data, 32))
        to_send = []
        with self.lock:
            self.addrs[worker] = src
            self.flags_seen.append((worker, rnd, chunk, flags))
            self.seen.setdefault((worker, rnd), set()).add(chunk)
            # An int32 sum's exponent is 0, a float32 one starts below any chunk's.
            slot = self.slots.setdefault((rnd, chunk), {
                "bitmap": 0, "acc": [0] * count, "exp": 0 if self.dtype == "i32" else -128,
                "done": False})
            if slot["done"]:
                to_send.append((self._result(rnd, chunk, slot), src, worker))
            elif flags & 0x02:
                # A REPLAY is a stored result: it is the chunk's sum, whatever was added.
                slot.update(acc=vals, exp=exp, bitmap=(1 << self.workers) - 1, done=True)
                key = (rnd, chunk)
                self.completed[key] = self.completed.get(key, 0) + 1
                frame = self._result(rnd, chunk, slot)
                to_send.extend((frame, self.addrs[w], w) for w in range(self.workers)
                               if w in self.addrs)
            elif not slot["bitmap"] & (1 << worker):
                if self.dtype == "i32":
                    slot["acc"] = [wrap(a + v) for a, v in zip(slot["acc"], vals)]
                else:
                    up = exp - slot["exp"]
                    sa, sv = max(0, min(31, up)), max(0, min(31, -up))
                    slot["acc"] = [wrap((a >> sa) + (v >> sv)) for a, v in zip(slot["acc"], vals)]
                    if up > 0:
                        slot["exp"] = exp
                slot["bitmap"] |= 1 << worker
                if slot["bitmap"] == (1 << self.workers) - 1:
                    slot["done"] = True
                    key = (rnd, chunk)
                    self.completed[key] = self.completed.get(key, 0) + 1
                    frame = self._result(rnd, chunk, slot)
                    to_send.extend((frame, self.addrs[w], w) for w in range(self.workers)
                                   if w in self.addrs)
            out = len(self.seen[(worker, rnd)] - self.delivered.get((worker, rnd), set()))
            self.max_outstanding = max(self.max_outstanding, out)
            hold = self.hold_results
            if hold:
                self.held.extend((f, to, w, (w, rnd)) for f, to, w in to_send)
        if not hold:
            for f, to, w in to_send:
                self._send(f, to, w, (w, rnd))


class FakeAgent:
    """A node's aggregation agent on a Unix socket: answers each join with the lines
    ``script(join)`` returns (a list of dicts, or callables returning one, or floats to sleep),
    then records leaves."""

    def __init__(self, script):
        self.script = script
        self.dir = tempfile.mkdtemp(prefix="yard-agg-agent-")
        self.path = os.path.join(self.dir, "agg.sock")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(16)
        self.server.settimeout(0.05)
        self.joins, self.leaves, self.closed = [], [], []
        self.conns = []
        self.lock = threading.Lock()
        self.stop_flag = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while not self.stop_flag:
            try:
                conn, _ = self.server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        f = conn.makefile("rwb")
        try:
            join = json.loads(f.readline())["join"]
            with self.lock:
                self.joins.append(join)
            for line in self.script(join):
                if isinstance(line, (int, float)):
                    time.sleep(line)
                    continue
                if callable(line):
                    line = line()
                f.write(json.dumps(line).encode() + b"\n")
                f.flush()
            while True:
                raw = f.readline()
                if not raw:
                    with self.lock:
                        self.closed.append(join["rank"])
                    return
                if json.loads(raw).get("leave"):
                    with self.lock:
                        self.leaves.append(join["rank"])
                    f.write(b'{"left": true}\n')
                    f.flush()
                    return
        except (OSError, ValueError):
            return
        finally:
            try:
                f.close()
                conn.close()
            except OSError:
                pass

    def close(self):
        self.stop_flag = True
        self.thread.join(5)
        self.server.close()
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass
        try:
            os.unlink(self.path)
            os.rmdir(self.dir)
        except OSError:
            pass
