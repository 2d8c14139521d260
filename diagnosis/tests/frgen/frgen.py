#!/usr/bin/env python3
"""frgen: an independent generator of PyTorch Flight Recorder dumps for training jobs with
known faults, written to measure the analyzer on data it was not written against.

It was written from PyTorch's public source and tests (FlightRecorder.hpp /
FlightRecorderDetail.hpp `dump_dict`, ProcessGroupNCCL's coalescing and p2p records, the
`test_c10d_nccl.py` flight-recorder tests, `tools/flight_recorder/components/types.py`) and
from the frameworks' public call sequences (Megatron-LM's 1F1B pipeline schedule with
`batch_isend_irecv`, tensor-parallel all_reduce per layer, FSDP2 all_gather / reduce_scatter
per unit, MoE all_to_all with uneven splits, DiLoCo's async outer all_reduce), never from the
analyzer's rules.

What a dump holds, as PyTorch writes it (version "2.10"):
  {"version", "comm_lib_version", "pg_config": {name: {"name","desc","ranks": "[0, 1]"}},
   "pg_status": {"<pg_id>": {"last_enqueued_collective", "last_started_collective",
                             "last_completed_collective"}},
   "entries": [ {record_id, pg_id, process_group: (name, desc), thread_name, thread_id,
                 collective_seq_id, p2p_seq_id, op_id, profiling_name, time_created_ns,
                 [duration_ms], input_sizes, input_dtypes, output_sizes, output_dtypes,
                 state, time_discovered_started_ns, time_discovered_completed_ns, retired,
                 timeout_ms, is_p2p, frames} ]}
pickled with protocol 2, one file per rank named `nccl_trace_rank_<global rank>` (no rank key).

Behaviours of the real recorder this reproduces, because an analyzer meets them:
  * without TORCH_NCCL_ENABLE_TIMING a work has no start event: ops are only "scheduled" or
    "completed", never "started", and time_discovered_started_ns stays None;
  * a completed op's start and completion are *discovered* together by the watchdog (it polls
    every 100 ms and retires the work), so both times are the poll time; an op still running at
    dump time is discovered started at the dump itself;
  * `duration_ms` only with TORCH_NCCL_ENABLE_TIMING (some jobs have it, some not);
  * ops inside a coalescing group (`batch_isend_irecv`, coalesced collectives) keep state
    "scheduled" and no times; the closing "nccl:coalesced" entry carries the state;
  * p2p ops do not advance collective_seq_id; p2p_seq_id advances once per batch;
  * the CPU keeps enqueuing past a stuck op until the step's host sync (loss.item()), so a stuck
    rank's later ops are "scheduled";
  * the ring buffer keeps the newest TORCH_NCCL_TRACE_BUFFER_SIZE entries; record_id keeps
    counting;
  * groups made by `split_group` may share one name across disjoint rank sets;
  * a crashed rank leaves no dump.

A GPU that hangs inside a rank's own compute (tp_gpu_hang), as the recorder shows it. Read in
pytorch/pytorch: ProcessGroupNCCL.cpp (WorkNCCL's constructor allocates ncclStartEvent_ only
when timing is enabled; startedGPUExecutionInternal() returns false without timing; the
watchdog advances pg_status last_started_collective only when work.isStarted(), and
last_completed_collective only when the end event has fired; TORCH_NCCL_ENABLE_TIMING defaults
to off unless TORCH_NCCL_DESYNC_DEBUG or TORCH_DISTRIBUTED_DEBUG=DETAIL turn it on) and
FlightRecorderDetail.hpp (update_state sets time_discovered_started_ns only from a start event
and time_discovered_completed_ns only from the end event; the dump writes state "completed",
"started" or "scheduled" from those two times alone):
  * with timing, the hung rank's next collective stays "scheduled" while its peers' are
    "started" (their streams reached the kernel and it waits for the hung rank);
  * without timing, neither the hung rank's entry nor its peers' can ever be "started": all are
    "scheduled", with no discovery times, and pg_status says last_started -1 for everyone; the
    end events of earlier ops fired on all of them alike. Nothing in the dumps tells the hung
    GPU from its waiting peers, and this generator writes nothing that would;
  * the process is not hung (its CPU, watchdog and dump thread run; cudaEventQuery does not
    block on a busy stream), so it times out and dumps like its peers; its CPU goes on
    enqueuing to the step's host sync as theirs do.
This generator's CPU clock of a stuck rank runs on from where its GPU stopped, while a rank
whose GPU runs enqueues just ahead of it: the hung rank's later entries are created earlier
than its peers'. A real CPU runs ahead of its GPU by however much the launch queue allows,
hung or not, so time_created_ns is no evidence of which GPU hung.

Usage: frgen.py SEED OUTDIR   writes OUTDIR/<case>/nccl_trace_rank_N for every case and
OUTDIR/truth.json ({case: {"kind", "culprits", "link", "healthy", "dump", ...}}), "dump"
being "timeout" or "on_demand".
"""

import json
import os
import pickle
import random
import sys

MS = 1_000_000
S = 1_000_000_000
WATCHDOG_POLL_NS = 100 * MS
GPUS_PER_NODE = 8
NVLINK_BPS = 150e9
NIC_BPS = 25e9


class Group:
    def __init__(self, gid, name, desc, ranks):
        self.gid = gid
        self.name = name
        self.desc = desc
        self.ranks = sorted(ranks)

    def local(self, g):
        return self.ranks.index(g)

    def spans_nodes(self):
        return len({r // GPUS_PER_NODE for r in self.ranks}) > 1


class Job:
    """Ranks, groups and each rank's program: a list of instructions.

    ("compute", ns, tag)                  GPU work on the main stream
    ("coll", gid, name, ins, outs, dtype, handle, sizes_bytes)
                                          a collective; handle None = on the main stream,
                                          else async on a side stream, joined by ("wait", h)
    ("ccoll", gid, name, ins, outs, dtype, handle, bytes)  one coalesced-collective entry
    ("batch", gid, [(kind, peer_global, shape, dtype)], bytes)  batch_isend_irecv
    ("wait", handle)
    ("sync",)                             host sync (loss.item()): the CPU waits for the GPU
    ("step", k)                           marks the start of step k
    """

    def __init__(self, world, rng):
        self.world = world
        self.rng = rng
        self.groups = []
        self.member_of = {r: [] for r in range(world)}
        self.progs = {r: [] for r in range(world)}
        self.compute_factor = {}  # rank -> (onset_step, factor)
        self.nic_factor = {}  # rank -> factor
        self.link_factor = {}  # frozenset(a, b) -> factor
        self.frames = {}

    def group(self, name, desc, ranks):
        g = Group(len(self.groups), name, desc, ranks)
        self.groups.append(g)
        for r in g.ranks:
            self.member_of[r].append(g.gid)
        return g

    def emit(self, r, ins):
        self.progs[r].append(ins)


# ---------------------------------------------------------------------------------------------
# Simulation


class Work:
    __slots__ = ("rank", "gid", "kind", "name", "ins", "outs", "dtype", "created", "arrival",
                 "done", "ops", "ops_nth", "bytes", "is_p2p", "cseq", "pseq", "op_id", "handle", "step")


def xfer_ns(job, g, nbytes, kind, members, rng):
    """Transfer time of one op: NVLink inside a node, the NICs between nodes; a slow NIC on any
    member crossing nodes, or a slow pair, slows the whole op (a ring runs at its slowest hop)."""
    spans = len({r // GPUS_PER_NODE for r in members}) > 1
    bw = NIC_BPS if spans else NVLINK_BPS
    n = max(len(members), 2)
    if kind == "all_reduce":
        vol = 2 * (n - 1) / n * nbytes
    elif kind == "p2p":
        vol = nbytes
    else:
        vol = (n - 1) / n * nbytes
    factor = 1.0
    if spans:
        for r in members:
            factor = max(factor, job.nic_factor.get(r, 1.0))
    if kind == "p2p":
        factor = max(factor, job.link_factor.get(frozenset(members), 1.0))
    t = 15_000 + vol / bw * S * factor
    return int(t * rng.uniform(0.97, 1.06))


def simulate(job, horizon_ns):
    """Runs every rank's program: a collective starts on a rank when its stream reaches it and
    completes for all when the last member arrived plus the transfer; a p2p batch completes when
    every peer posted the matching op (NCCL's rendezvous). Returns per-rank work lists and the
    index of the instruction each rank's GPU stopped at (None if it ran to the end)."""
    rng = job.rng
    t0 = 1_750_000_000 * S + (job.seed * 7919 % 1000) * MS
    n = job.world
    pc = [0] * n
    t = [t0 + rng.randrange(2 * MS) for _ in range(n)]
    side = [t[r] for r in range(n)]
    cpu = list(t)
    step = [0] * n
    cseq = {}
    pseq = {}
    opid = {}
    works = {r: [] for r in range(n)}
    pending = {r: None for r in range(n)}  # work launched on the main stream, not yet done
    handles = {}  # (rank, handle) -> work
    arrivals = {}  # coll key -> {rank: work}
    p2p_posted = {}  # (gid, src, dst) -> list of (work, op index)
    p2p_taken = {}  # (rank, gid, src, dst) -> count of ops this rank has posted on that pair
    dead_at = getattr(job, "dead_at", {})
    gpu_hang = getattr(job, "gpu_hang", {})  # rank -> (step, instr index within step)
    stopped = [None] * n

    def coll_done(w):
        key = (w.gid, w.cseq)
        arr = arrivals.get(key, {})
        g = job.groups[w.gid]
        if len(arr) < len(g.ranks):
            return None
        if any(a.arrival is None for a in arr.values()):
            return None
        bad = getattr(job, "never_complete", set())
        if key in bad:
            return None
        # NCCL does not check that members agree: different collectives, dtypes or counts on one
        # communicator leave the kernels waiting for each other (all_to_all sizes legitimately
        # differ per rank)
        sigs = {(a.kind, a.dtype, None if a.kind == "all_to_all" else repr(a.ins))
                for a in arr.values()}
        if len(sigs) > 1:
            return None
        last = max(a.arrival for a in arr.values())
        d = last + xfer_ns(job, g, w.bytes, w.kind, g.ranks, random.Random(hash(key) ^ job.seed))
        for a in arr.values():
            a.done = d
        return d

    def batch_done(w):
        latest = w.arrival
        nbytes = 0
        crossing = []
        for i, (kind, peer, shape, dtype) in enumerate(w.ops):
            src, dst = (w.rank, peer) if kind == "send" else (peer, w.rank)
            nth = w.ops_nth[i]
            lst = p2p_posted.get((w.gid, src, dst, "recv" if kind == "send" else "send"), [])
            if len(lst) <= nth:
                return None
            other = lst[nth]
            if other.arrival is None:
                return None
            latest = max(latest, other.arrival)
            crossing.append(frozenset((src, dst)))
            nbytes = max(nbytes, numel(shape) * 2)
        g = job.groups[w.gid]
        d = latest
        for pair in crossing:
            d = max(d, latest + xfer_ns(job, g, nbytes, "p2p", sorted(pair),
                                        random.Random(hash((w.gid, w.pseq, tuple(pair))) ^ job.seed)))
        return d

    def resolve(w):
        if w.done is not None:
            return w.done
        if w.arrival is None:
            return None
        if w.kind == "batch":
            d = batch_done(w)
            if d is not None:
                w.done = d
            return d
        key = (w.gid, w.cseq)
        if key in getattr(job, "never_complete", set()):
            return None
        return coll_done(w)

    def launch(r, ins, when_gpu, on_side):
        kind = ins[0]
        w = Work()
        w.rank, w.gid = r, ins[1]
        w.step = step[r]
        w.handle = ins[6] if kind in ("coll", "ccoll") else None
        g = job.groups[w.gid]
        k = (r, w.gid)
        opid[k] = opid.get(k, 0)
        if kind == "batch":
            pseq[k] = pseq.get(k, 0) + 1
            w.kind, w.name, w.is_p2p = "batch", "coalesced", True
            w.ops = ins[2]
            w.ops_nth = []
            for (okind, peer, shape, dtype) in w.ops:
                src, dst = (r, peer) if okind == "send" else (peer, r)
                pk = (r, w.gid, src, dst, okind)
                nth = p2p_taken.get(pk, 0)
                p2p_taken[pk] = nth + 1
                w.ops_nth.append(nth)
                p2p_posted.setdefault((w.gid, src, dst, okind), []).append(w)
            w.bytes = ins[3]
            w.cseq, w.pseq = cseq.get(k, 0), pseq[k]
            w.op_id = opid[k] + len(w.ops)
            opid[k] = w.op_id
        else:
            cseq[k] = cseq.get(k, 0) + 1
            w.kind = ins[2]
            w.name = ins[2]
            w.ins, w.outs, w.dtype, w.bytes = ins[3], ins[4], ins[5], ins[7]
            w.is_p2p = False
            w.cseq, w.pseq = cseq[k], pseq.get(k, 0)
            opid[k] += 1
            w.op_id = opid[k]
            arrivals.setdefault((w.gid, w.cseq), {})[r] = w
        lead = rng.randrange(30_000, 1_500_000)
        w.created = max(cpu[r] + 5_000, (when_gpu - lead) if when_gpu is not None else cpu[r] + 40_000)
        cpu[r] = w.created
        w.arrival = when_gpu
        w.done = None
        works[r].append(w)
        return w

    def rank_stream_blocked(r):
        """GPU of r stopped (stuck op, dead, hung kernel): the CPU enqueues to the next sync."""
        p = pc[r]
        prog = job.progs[r]
        while p < len(prog):
            ins = prog[p]
            if ins[0] == "sync":
                break
            if ins[0] in ("coll", "ccoll", "batch"):
                cpu[r] += rng.randrange(20_000, 400_000)
                launch(r, ins, None, False)
            elif ins[0] == "compute":
                cpu[r] += rng.randrange(20_000, 200_000)
            elif ins[0] == "step":
                step[r] = ins[1]
            p += 1
        pc[r] = len(prog) + 1  # nothing more from this rank

    progress = True
    while progress:
        progress = False
        for r in range(n):
            prog = job.progs[r]
            if stopped[r] is not None:
                continue
            while pc[r] < len(prog):
                if t[r] > horizon_ns:
                    stopped[r] = "horizon"
                    break
                if r in dead_at and t[r] >= dead_at[r]:
                    stopped[r] = "dead"
                    break
                w = pending[r]
                if w is not None:
                    d = resolve(w)
                    if d is None:
                        break
                    t[r] = max(t[r], d)
                    pending[r] = None
                    progress = True
                    pc[r] += 1
                    continue
                ins = prog[pc[r]]
                op = ins[0]
                if op == "step":
                    step[r] = ins[1]
                    pc[r] += 1
                elif op == "compute":
                    if r in gpu_hang and gpu_hang[r] == (step[r], ins[2]):
                        # the kernel never finishes: nothing after it runs on this GPU
                        stopped[r] = "gpu_hang"
                        cpu[r] = max(cpu[r], t[r])
                        pc[r] += 1
                        rank_stream_blocked(r)
                        break
                    onset, f = job.compute_factor.get(r, (1 << 30, 1.0))
                    ns = ins[1] * (f if step[r] >= onset else 1.0)
                    t[r] += int(ns * rng.uniform(0.985, 1.03))
                    cpu[r] = max(cpu[r], t[r] - rng.randrange(0, 3 * MS))
                    pc[r] += 1
                elif op in ("coll", "ccoll", "batch"):
                    handle = ins[6] if op in ("coll", "ccoll") else None
                    if handle is not None:
                        side[r] = max(side[r], t[r])
                        w = launch(r, ins, side[r], True)
                        handles[(r, handle)] = w
                        pc[r] += 1
                    else:
                        w = launch(r, ins, t[r], False)
                        pending[r] = w
                    progress = True
                elif op == "wait":
                    w = handles.get((r, ins[1]))
                    if w is None:
                        pc[r] += 1
                        continue
                    d = resolve(w)
                    if d is None:
                        break
                    side[r] = max(side[r], d)
                    t[r] = max(t[r], d)
                    pc[r] += 1
                elif op == "sync":
                    cpu[r] = max(cpu[r], t[r])
                    pc[r] += 1
            # re-resolve async works so that later waits see them
        for r in range(n):
            for w in works[r][-8:]:
                if w.done is None and w.arrival is not None:
                    if resolve(w) is not None:
                        progress = True
    # ranks whose stream is blocked on an op that never completes: the CPU runs to the sync
    for r in range(n):
        if stopped[r] is None and pc[r] < len(job.progs[r]) and pending[r] is not None:
            cpu[r] = max(cpu[r], pending[r].created)
            pc[r] += 1
            rank_stream_blocked(r)
        elif stopped[r] is None and pc[r] < len(job.progs[r]):
            cpu[r] = max(cpu[r], t[r])
            rank_stream_blocked(r)
    return works, t


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


# ---------------------------------------------------------------------------------------------
# Dumps


def frames_for(job, name):
    """Stack frames like torch's symbolized tracebacks; frame dicts are shared between entries
    as torch's pickler shares them."""
    fr = job.frames.get(name)
    if fr is None:
        top = {"name": name.split(" ")[0], "filename": "torch/distributed/distributed_c10d.py",
               "line": 2800 + len(name)}
        mid = {"name": "train_step", "filename": "pretrain.py", "line": 412}
        job.frames[name] = fr = [top, mid]
    # a fresh list per entry holding shared frame dicts, as torch's pickler memoizes the
    # frames (one IValue referenced from many entries) but builds each entry's list anew
    return list(fr)


def entries_for(job, r, w, timing, dump_ns, local_pg, timeout_ms, tid):
    g = job.groups[w.gid]
    pg_id = local_pg[(r, w.gid)]
    proc = (g.name, g.desc)
    me = g.local(r)
    # without TORCH_NCCL_ENABLE_TIMING the work has no start event (ProcessGroupNCCL creates
    # ncclStartEvent_ only with timing), so the recorder can never say "started"
    started = timing and w.arrival is not None and w.arrival <= dump_ns
    completed = w.done is not None and w.done <= dump_ns
    poll_done = None
    if completed:
        # the watchdog notices at its next poll, and retires (discovers start and end) then
        poll_done = w.done + job.rng.randrange(0, WATCHDOG_POLL_NS)
        if poll_done > dump_ns:
            poll_done = dump_ns
    state = "completed" if completed else ("started" if started else "scheduled")
    base = {
        "pg_id": pg_id,
        "thread_name": "pt_main_thread",
        "thread_id": tid,
        "collective_seq_id": w.cseq,
        "p2p_seq_id": w.pseq,
        "timeout_ms": timeout_ms,
    }
    out = []
    if w.kind == "batch":
        op_id = w.op_id - len(w.ops)
        for (okind, peer, shape, dtype) in w.ops:
            op_id += 1
            pname = ("nccl:send %d->%d" % (me, g.local(peer)) if okind == "send"
                     else "nccl:recv %d<-%d" % (me, g.local(peer)))
            e = dict(base)
            e["process_group"] = (g.name, g.desc)
            e.update({"op_id": op_id, "profiling_name": pname, "time_created_ns": w.created,
                      "input_sizes": [list(shape)], "input_dtypes": [dtype],
                      "output_sizes": [list(shape)], "output_dtypes": [dtype],
                      "state": "scheduled", "time_discovered_started_ns": None,
                      "time_discovered_completed_ns": None, "retired": False, "is_p2p": True,
                      "frames": frames_for(job, pname)})
            out.append(e)
        e = dict(base)
        e.update({"op_id": w.op_id, "profiling_name": "nccl:coalesced",
                  "time_created_ns": w.created, "input_sizes": [], "input_dtypes": [],
                  "output_sizes": [], "output_dtypes": [], "is_p2p": True,
                  "frames": frames_for(job, "batch_isend_irecv")})
    else:
        e = dict(base)
        n_in = len(w.ins)
        e.update({"op_id": w.op_id, "profiling_name": "nccl:" + w.name,
                  "time_created_ns": w.created, "input_sizes": [list(s) for s in w.ins],
                  "input_dtypes": [w.dtype] * n_in, "output_sizes": [list(s) for s in w.outs],
                  "output_dtypes": [w.dtype] * len(w.outs), "is_p2p": False,
                  "frames": frames_for(job, w.name)})
    e["state"] = state
    if completed:
        e["time_discovered_started_ns"] = poll_done if timing else None
        e["time_discovered_completed_ns"] = poll_done
        e["retired"] = True
        if timing:
            e["duration_ms"] = (w.done - w.arrival) / MS
    else:
        e["time_discovered_started_ns"] = dump_ns if started else None
        e["time_discovered_completed_ns"] = None
        e["retired"] = False
    # torch converts the (name, desc) pair to a new tuple for every entry: never shared
    e["process_group"] = (g.name, g.desc)
    out.append(e)
    return out


def write_dumps(job, works, out_dir, dump_at, timing, buffer_size, timeout_ms, dead):
    os.makedirs(out_dir, exist_ok=True)
    rng = job.rng
    for r in range(job.world):
        if r in dead:
            continue
        dump_ns = dump_at[r]
        local_pg = {}
        pg_config = {}
        for i, gid in enumerate(job.member_of[r]):
            local_pg[(r, gid)] = i
            g = job.groups[gid]
            pg_config[g.name] = {"name": g.name, "desc": g.desc,
                                 "ranks": "[" + ", ".join(str(x) for x in g.ranks) + "]"}
        tid = str(139_800_000_000_000 + rng.randrange(10**9))
        entries = []
        status = {}
        for w in works[r]:
            if w.created > dump_ns:
                continue
            entries.extend(entries_for(job, r, w, timing, dump_ns, local_pg, timeout_ms, tid))
            st = status.setdefault(str(local_pg[(r, w.gid)]), {
                "last_enqueued_collective": -1, "last_started_collective": -1,
                "last_completed_collective": -1})
            seq = w.pseq if w.is_p2p else w.cseq
            st["last_enqueued_collective"] = seq
            if timing and w.arrival is not None and w.arrival <= dump_ns:
                st["last_started_collective"] = seq
            if w.done is not None and w.done <= dump_ns:
                st["last_completed_collective"] = seq
        for i, e in enumerate(entries):
            e["record_id"] = i
        entries = entries[-buffer_size:]
        doc = {"version": "2.10", "comm_lib_version": "2.21.5", "pg_config": pg_config,
               "pg_status": status, "entries": entries}
        with open(os.path.join(out_dir, "nccl_trace_rank_%d" % r), "wb") as f:
            pickle.dump(doc, f, protocol=2)


# ---------------------------------------------------------------------------------------------
# Job shapes, from the frameworks' call sequences


def megatron(rng, tp, pp, dp, m, layers, steps, shared_names, seq_parallel=False,
             microbatches_of=None, mid=None):
    """Megatron-LM: ranks ordered tp fastest, then dp, then pp; each step runs the 1F1B
    schedule (warm-up forwards, steady one-forward-one-backward, cool-down backwards) with
    batch_isend_irecv on the pipeline group, tensor-parallel all_reduce (or all_gather +
    reduce_scatter with sequence parallelism) twice per layer each way, then the data-parallel
    gradient all_reduce in buckets and the grad-norm all_reduce on the model-parallel group,
    followed by loss.item()."""
    world = tp * pp * dp
    job = Job(world, rng)
    job.mid = mid or {}

    def rank(t, d, p):
        return t + tp * (d + dp * p)

    job.group("0", "default_pg", range(world))
    names = iter(range(1, 10_000))
    tp_groups, dp_groups, pp_groups, mp_groups = {}, {}, {}, {}
    tp_name = str(next(names))
    for p in range(pp):
        for d in range(dp):
            name = tp_name if shared_names else str(next(names))
            g = job.group(name, "TENSOR_MODEL_PARALLEL_GROUP",
                          [rank(t, d, p) for t in range(tp)])
            for t in range(tp):
                tp_groups[rank(t, d, p)] = g
    dp_name = str(next(names))
    for p in range(pp):
        for t in range(tp):
            name = dp_name if shared_names else str(next(names))
            g = job.group(name, "DATA_PARALLEL_GROUP", [rank(t, d, p) for d in range(dp)])
            for d in range(dp):
                dp_groups[rank(t, d, p)] = g
    if pp > 1:
        pp_name = str(next(names))
        for d in range(dp):
            for t in range(tp):
                name = pp_name if shared_names else str(next(names))
                g = job.group(name, "PIPELINE_MODEL_PARALLEL_GROUP",
                              [rank(t, d, p) for p in range(pp)])
                for p in range(pp):
                    pp_groups[rank(t, d, p)] = g
    mp_name = str(next(names))
    for d in range(dp):
        name = mp_name if shared_names else str(next(names))
        ranks = [rank(t, d, p) for t in range(tp) for p in range(pp)]
        g = job.group(name, "MODEL_PARALLEL_GROUP", ranks)
        for x in ranks:
            mp_groups[x] = g

    hidden, seqlen = rng.choice([(4096, 2048), (5120, 4096), (8192, 2048)])
    act = (seqlen, hidden)
    act_bytes = numel(act) * 2
    layer_fwd = int(rng.uniform(1.5, 4.0) * MS)
    buckets = rng.randint(2, 4)
    grad_numel = hidden * hidden * 12 * layers // (tp * buckets)
    last_stage_extra = int(rng.uniform(0.5, 2.0) * MS)  # the loss head: a known imbalance

    for t in range(tp):
        for d in range(dp):
            for p in range(pp):
                r = rank(t, d, p)
                mb = (microbatches_of or {}).get(r, m)
                tpg = tp_groups[r]
                handle = [0]

                def tp_ops(r=r, tpg=tpg):
                    if tp == 1:
                        return
                    if seq_parallel:
                        shard = (act[0] // tp, act[1])
                        job.emit(r, ("coll", tpg.gid, "_all_gather_base", [shard], [act],
                                     "BFloat16", None, act_bytes))
                        job.emit(r, ("coll", tpg.gid, "_reduce_scatter_base", [act], [shard],
                                     "BFloat16", None, act_bytes))
                    else:
                        job.emit(r, ("coll", tpg.gid, "all_reduce", [act], [act], "BFloat16",
                                     None, act_bytes))

                def forward(r=r, p=p):
                    for layer in range(layers):
                        job.emit(r, ("compute", layer_fwd // 2, "fwd"))
                        tp_ops()
                        job.emit(r, ("compute", layer_fwd // 2, "fwd"))
                        tp_ops()
                    if p == pp - 1:
                        job.emit(r, ("compute", last_stage_extra, "loss"))

                def backward(r=r):
                    for layer in range(layers):
                        job.emit(r, ("compute", layer_fwd, "bwd"))
                        tp_ops()
                        job.emit(r, ("compute", layer_fwd, "bwd"))
                        tp_ops()

                def p2p(ops, r=r):
                    if not ops or pp == 1:
                        return
                    job.emit(r, ("batch", pp_groups[r].gid,
                                 [(k, peer, act, "BFloat16") for (k, peer) in ops],
                                 act_bytes))

                prev = rank(t, d, p - 1) if p > 0 else None
                nxt = rank(t, d, p + 1) if p < pp - 1 else None
                for s in range(steps):
                    job.emit(r, ("step", s))
                    warm = min(pp - p - 1, mb)
                    rem = mb - warm
                    for i in range(warm):
                        if prev is not None:
                            p2p([("recv", prev)])
                        forward()
                        if nxt is not None:
                            p2p([("send", nxt)])
                    if rem > 0 and prev is not None:
                        p2p([("recv", prev)])
                    for i in range(rem):
                        forward()
                        if nxt is not None:
                            p2p([("send", nxt), ("recv", nxt)])
                        backward()
                        if prev is not None:
                            if i == rem - 1:
                                p2p([("send", prev)])
                            else:
                                p2p([("send", prev), ("recv", prev)])
                    for i in range(warm):
                        if nxt is not None:
                            p2p([("recv", nxt)])
                        backward()
                        if prev is not None:
                            p2p([("send", prev)])
                    dpg = dp_groups[r]
                    gdtype = job.mid.get(("grad_dtype", r), "Float")
                    for b in range(buckets):
                        if dp > 1:
                            nb = grad_numel * (2 if gdtype == "BFloat16" else 4)
                            job.emit(r, ("coll", dpg.gid, "all_reduce", [[grad_numel]],
                                         [[grad_numel]], gdtype, None, nb))
                    job.emit(r, ("coll", mp_groups[r].gid, "all_reduce", [[1]], [[1]], "Float",
                                 None, 4))
                    job.emit(r, ("compute", int(rng.uniform(1, 3) * MS), "optimizer"))
                    job.emit(r, ("sync",))
    job.layout = dict(tp=tp, pp=pp, dp=dp, m=m, layers=layers)
    job.tp_groups, job.dp_groups, job.pp_groups = tp_groups, dp_groups, pp_groups
    job.rank_of = rank
    return job


def fsdp(rng, world, units, steps, coalesced=False, rs_sizes_of=None, shard_of=None):
    """FSDP2 (torchtitan-like): per unit forward all_gather_into_tensor of the flat parameter
    shard; backward in reverse: all_gather again (reshard after forward), then the gradient
    reduce_scatter on its own stream (async), all joined before the optimizer; then the
    grad-norm all_reduce and loss.item(). With `coalesced`, FSDP1-style per-parameter tensors go
    through the coalescing manager as one reduce_scatter_tensor_coalesced /
    all_gather_into_tensor_coalesced entry."""
    job = Job(world, rng)
    g = job.group("0", "default_pg", range(world))
    params = [rng.choice([4096 * 4096, 4096 * 11008, 4096]) for _ in range(3)]
    numel_unit = sum(params)
    compute = int(rng.uniform(2, 6) * MS)
    for r in range(world):
        for s in range(steps):
            job.emit(r, ("step", s))
            for u in range(units):
                if coalesced:
                    ins = [[p // world] for p in params]
                    outs = [[p] for p in params]
                    job.emit(r, ("ccoll", g.gid, "all_gather_into_tensor_coalesced", ins, outs,
                                 "BFloat16", None, numel_unit * 2))
                else:
                    job.emit(r, ("coll", g.gid, "_all_gather_base", [[numel_unit // world]],
                                 [[numel_unit]], "BFloat16", None, numel_unit * 2))
                job.emit(r, ("compute", compute, "fwd"))
            for u in reversed(range(units)):
                if coalesced:
                    ins = [[p // world] for p in params]
                    outs = [[p] for p in params]
                    job.emit(r, ("ccoll", g.gid, "all_gather_into_tensor_coalesced", ins, outs,
                                 "BFloat16", None, numel_unit * 2))
                else:
                    job.emit(r, ("coll", g.gid, "_all_gather_base", [[numel_unit // world]],
                                 [[numel_unit]], "BFloat16", None, numel_unit * 2))
                job.emit(r, ("compute", 2 * compute, "bwd"))
                h = ("rs", s, u)
                if coalesced:
                    sizes = (rs_sizes_of or {}).get((r, s, u), params)
                    job.emit(r, ("ccoll", g.gid, "reduce_scatter_tensor_coalesced",
                                 [[p] for p in sizes], [[p // world] for p in sizes], "Float",
                                 h, numel_unit * 4))
                else:
                    job.emit(r, ("coll", g.gid, "_reduce_scatter_base", [[numel_unit]],
                                 [[numel_unit // world]], "Float", h, numel_unit * 4))
            for u in range(units):
                job.emit(r, ("wait", ("rs", s, u)))
            job.emit(r, ("coll", g.gid, "all_reduce", [[1]], [[1]], "Float", None, 4))
            job.emit(r, ("compute", int(rng.uniform(1, 3) * MS), "optimizer"))
            job.emit(r, ("sync",))
    job.layout = dict(world=world, units=units)
    return job


def moe(rng, ep, dp, layers, steps, m, skip=None):
    """Megatron MoE with the all-to-all token dispatcher: per MoE layer and microbatch, the
    token counts are all-gathered on the expert-parallel group, then tokens go out with an
    all_to_all whose send and receive sizes differ per rank and per step (uneven routing),
    experts compute, and a second all_to_all brings them back; backward mirrors it. Gradients
    are all-reduced across the data-parallel replicas of each expert rank."""
    world = ep * dp
    job = Job(world, rng)
    job.group("0", "default_pg", range(world))
    ep_groups, dp_groups = {}, {}
    for d in range(dp):
        g = job.group(str(1 + d), "EXPERT_MODEL_PARALLEL_GROUP", [d * ep + e for e in range(ep)])
        for e in range(ep):
            ep_groups[d * ep + e] = g
    for e in range(ep):
        g = job.group(str(1 + dp + e), "EXPERT_DATA_PARALLEL_GROUP",
                      [d * ep + e for d in range(dp)])
        for d in range(dp):
            dp_groups[d * ep + e] = g
    hidden = 4096
    tokens = 4096
    compute = int(rng.uniform(1, 3) * MS)
    route = random.Random(rng.randrange(1 << 30))
    for d in range(dp):
        # routing is a property of the data: every rank of one EP group sees the same matrix
        plan = {}
        for s in range(steps):
            for mb in range(m):
                for layer in range(layers):
                    mat = [[max(0, int(tokens / ep * route.uniform(0.2, 1.8))) for _ in range(ep)]
                           for _ in range(ep)]
                    plan[(s, mb, layer)] = mat
        for e in range(ep):
            r = d * ep + e
            g = ep_groups[r]
            for s in range(steps):
                job.emit(r, ("step", s))
                for mb in range(m):
                    for phase in ("fwd", "bwd"):
                        order = range(layers) if phase == "fwd" else reversed(range(layers))
                        for layer in order:
                            mat = plan[(s, mb, layer)]
                            out_tok = sum(mat[e])
                            in_tok = sum(row[e] for row in mat)
                            job.emit(r, ("compute", compute, phase))
                            job.emit(r, ("coll", g.gid, "_all_gather_base", [[ep]], [[ep * ep]],
                                         "Long", None, ep * ep * 8))
                            a, b = (out_tok, in_tok) if phase == "fwd" else (in_tok, out_tok)
                            if skip != (r, s, mb, phase, layer):
                                job.emit(r, ("coll", g.gid, "all_to_all", [[a, hidden]],
                                             [[b, hidden]], "BFloat16", None,
                                             max(a, b) * hidden * 2 * ep))
                            job.emit(r, ("compute", compute, phase))
                            job.emit(r, ("coll", g.gid, "all_to_all", [[b, hidden]],
                                         [[a, hidden]], "BFloat16", None,
                                         max(a, b) * hidden * 2 * ep))
                if dp > 1:
                    n = 4096 * 14336 // ep
                    job.emit(r, ("coll", dp_groups[r].gid, "all_reduce", [[n]], [[n]], "Float",
                                 None, n * 4))
                job.emit(r, ("compute", int(rng.uniform(1, 3) * MS), "optimizer"))
                job.emit(r, ("sync",))
    job.layout = dict(ep=ep, dp=dp)
    return job


def diloco(rng, replicas, size, steps, h, never_outer=None):
    """DiLoCo (streaming): each replica trains with FSDP on its own group for H inner steps;
    then the outer pseudo-gradient all_reduce runs across replicas, one group per shard index,
    launched async and waited one inner step later so it overlaps compute."""
    world = replicas * size
    job = Job(world, rng)
    job.group("0", "default_pg", range(world))
    inner, outer = {}, {}
    for q in range(replicas):
        g = job.group(str(1 + q), "replica", [q * size + i for i in range(size)])
        for i in range(size):
            inner[q * size + i] = g
    for i in range(size):
        g = job.group(str(1 + replicas + i), "outer", [q * size + i for q in range(replicas)])
        for q in range(replicas):
            outer[q * size + i] = g
    numel = 4096 * 4096 * 2
    compute = int(rng.uniform(2, 5) * MS)
    for r in range(world):
        gi, go = inner[r], outer[r]
        waiting = None
        for s in range(steps):
            job.emit(r, ("step", s))
            for u in range(2):
                job.emit(r, ("coll", gi.gid, "_all_gather_base", [[numel // size]], [[numel]],
                             "BFloat16", None, numel * 2))
                job.emit(r, ("compute", compute, "fwd"))
            for u in range(2):
                job.emit(r, ("compute", 2 * compute, "bwd"))
                job.emit(r, ("coll", gi.gid, "_reduce_scatter_base", [[numel]],
                             [[numel // size]], "Float", None, numel * 4))
            job.emit(r, ("coll", gi.gid, "all_reduce", [[1]], [[1]], "Float", None, 4))
            if waiting is not None:
                job.emit(r, ("wait", waiting))
                waiting = None
            if (s + 1) % h == 0 and not (never_outer and never_outer[0] == r
                                         and s >= never_outer[1]):
                waiting = ("outer", s)
                job.emit(r, ("coll", go.gid, "all_reduce", [[numel // size]],
                             [[numel // size]], "Float", waiting, numel // size * 4))
            job.emit(r, ("sync",))
    job.layout = dict(replicas=replicas, size=size, h=h)
    return job


# ---------------------------------------------------------------------------------------------
# Cases


def nic_carriers(tp, pp, dp):
    """Ranks of a Megatron layout whose NIC carries the job's bytes over two or more paths.

    A slow NIC is drawn only on these, because elsewhere the fault it labels is not one the
    job lives: a NIC none of whose rank's groups leaves the node (a one-node job; a rank whose
    tensor-, data- and pipeline-parallel peers all share its node) moves nothing, and the job
    runs as if it were healthy (the model-parallel grad-norm all_reduce of 4 bytes is all it
    carries); a NIC whose rank has one inter-node path (one pipeline neighbour on another node,
    or only its data-parallel ring) slows exactly what a slow link on that path slows, so its
    dumps are those of a slow link, and labelling them a NIC fault would score the analyzer on
    a coin toss. Counted per rank: its tensor-parallel group if it spans nodes, its
    data-parallel group likewise, and each pipeline neighbour on another node."""
    def rank(t, d, p):
        return t + tp * (d + dp * p)

    def spans(ranks):
        return len({x // GPUS_PER_NODE for x in ranks}) > 1

    out = []
    for p in range(pp):
        for d in range(dp):
            for t in range(tp):
                r = rank(t, d, p)
                paths = int(spans([rank(x, d, p) for x in range(tp)]))
                paths += int(spans([rank(t, x, p) for x in range(dp)]))
                for q in (p - 1, p + 1):
                    if 0 <= q < pp and spans([r, rank(t, d, q)]):
                        paths += 1
                if paths >= 2:
                    out.append(r)
    return sorted(out)


def step_times(works, r, s):
    ts = [w.arrival for w in works[r] if w.step == s and w.arrival is not None]
    return (min(ts), max(ts)) if ts else (None, None)


def case(seed, name):
    rng = random.Random(hash((seed, name)) & 0xFFFFFFFF)
    rng.seed("%d/%s" % (seed, name))
    truth = {"kind": name, "healthy": False, "culprits": [], "link": None}
    timing = rng.random() < 0.5
    buffer_size = rng.choice([2000, 2000, 4000, 20000])
    timeout_ms = rng.choice([600_000, 600_000, 1_800_000, 300_000])
    hang = True
    dead = set()
    slow_dump_step = None
    if name.startswith("healthy_megatron") or name in ("pp_missing_recv", "tp_gpu_hang",
                                                        "dead_rank", "compute_straggler",
                                                        "slow_nic", "slow_link",
                                                        "dp_dtype_mismatch", "tp2_size_change"):
        tp = rng.choice([2, 4, 8])
        pp = rng.choice([2, 4])
        dp = rng.choice([2, 4])
        if name == "tp2_size_change":
            tp, pp = 2, rng.choice([1, 2])
        if name in ("slow_nic", "slow_link"):
            pp = max(pp, 2)
        while tp * pp * dp > 64:
            dp //= 2
        # a NIC only slows the job through traffic that leaves its node, and only traffic over
        # two or more paths tells a slow NIC from one slow link (see nic_carriers): a layout
        # where no rank's NIC does that is drawn again
        while name == "slow_nic" and not nic_carriers(tp, pp, dp):
            tp, pp, dp = rng.choice([2, 4, 8]), rng.choice([2, 4]), rng.choice([2, 4])
            while tp * pp * dp > 64:
                dp //= 2
        m = rng.choice([4, 6, 8])
        layers = rng.choice([1, 2])
        steps = 6
        shared = rng.random() < 0.5
        seqp = rng.random() < 0.3
        world = tp * pp * dp
        culprit = rng.randrange(world)
        kw = {}
        if name == "pp_missing_recv":
            # a stale config on one rank: one microbatch fewer, so its stage posts one
            # receive fewer than its neighbour sends
            while (culprit // (tp * dp)) == 0:
                culprit = rng.randrange(world)
            kw["microbatches_of"] = {culprit: m - 1}
        if name == "dp_dtype_mismatch":
            kw["mid"] = {("grad_dtype", culprit): "BFloat16"}
        job = megatron(rng, tp, pp, dp, m, layers, steps, shared, seqp, **kw)
        job.seed = seed
        onset = 0
        if name == "tp_gpu_hang":
            job.gpu_hang = {culprit: (rng.randrange(1, 4), rng.choice(["fwd", "bwd"]))}
            truth["culprits"] = [culprit]
        elif name == "dead_rank":
            dead = {culprit}
            truth["culprits"] = [culprit]
        elif name == "compute_straggler":
            onset = rng.choice([0, 0, 1, 2])
            job.compute_factor[culprit] = (onset, rng.uniform(1.5, 4.0))
            truth["culprits"] = [culprit]
            hang = False
        elif name == "slow_nic":
            onset = 0
            culprit = rng.choice(nic_carriers(tp, pp, dp))
            job.nic_factor[culprit] = rng.uniform(6, 20)
            truth["culprits"] = [culprit]
            hang = False
        elif name == "slow_link":
            p = rng.randrange(pp - 1)
            t = rng.randrange(tp)
            d = rng.randrange(dp)
            a, b = job.rank_of(t, d, p), job.rank_of(t, d, p + 1)
            job.link_factor[frozenset((a, b))] = rng.uniform(6, 20)
            truth["link"] = sorted([a, b])
            hang = False
        elif name in ("pp_missing_recv", "dp_dtype_mismatch"):
            truth["culprits"] = [culprit]
            if name == "dp_dtype_mismatch":
                # NCCL moves a different byte count on one rank: the all_reduce never completes
                g = job.dp_groups[culprit]
                job.never_complete = {(g.gid, 1)}
        elif name == "tp2_size_change":
            # one rank of a 2-way TP pair changes its activation shape mid-job (a bad batch
            # resize on that rank alone): the all_reduce sizes disagree 1 against 1
            g = [x for x in job.groups if culprit in x.ranks and x.desc ==
                 "TENSOR_MODEL_PARALLEL_GROUP"][0]
            victim_seq = rng.randrange(20, 60)
            count = 0
            for i, ins in enumerate(job.progs[culprit]):
                if ins[0] == "coll" and ins[1] == g.gid:
                    count += 1
                    if count == victim_seq:
                        shp = [ins[3][0][0] // 2, ins[3][0][1]]
                        job.progs[culprit][i] = ("coll", ins[1], ins[2], [shp], [shp], ins[5],
                                                 ins[6], ins[7] // 2)
                        break
            job.never_complete = {(g.gid, victim_seq)}
            truth["culprits"] = [culprit]
        else:
            truth["healthy"] = True
            hang = False
        if not hang:
            slow_dump_step = rng.randrange(max(onset, 1) + 2, steps)
    elif name in ("healthy_fsdp", "fsdp_coalesced_rs_size"):
        world = rng.choice([8, 16, 32])
        coalesced = name == "fsdp_coalesced_rs_size" or rng.random() < 0.5
        job = fsdp(rng, world, rng.randint(3, 6), 5, coalesced)
        job.seed = seed
        if name == "fsdp_coalesced_rs_size":
            culprit = rng.randrange(world)
            s, u = rng.randrange(1, 4), 0
            # one rank's parameters were built with a different shape (stale checkpoint): its
            # coalesced reduce_scatter of the last unit in step s carries one size unlike the
            # others'; the seq is that op's position among the rank's collectives
            seqn = 0
            for i, ins in enumerate(job.progs[culprit]):
                if ins[0] in ("coll", "ccoll"):
                    seqn += 1
                if ins[0] == "ccoll" and ins[6] == ("rs", s, job.layout["units"] - 1):
                    sizes = [list(x) for x in ins[3]]
                    sizes[-1] = [sizes[-1][0] + 2 * world]
                    job.progs[culprit][i] = (ins[0], ins[1], ins[2], sizes,
                                             [[x[0] // world] for x in sizes], ins[5], ins[6],
                                             ins[7])
                    break
            job.never_complete = {(0, seqn)}
            truth["culprits"] = [culprit]
        else:
            truth["healthy"] = True
            hang = False
            slow_dump_step = rng.randrange(2, 5)
    elif name in ("healthy_moe", "moe_a2a_skip"):
        ep = rng.choice([4, 8])
        dp = rng.choice([1, 2, 4])
        steps = 4
        skip = None
        culprit = None
        if name == "moe_a2a_skip":
            culprit = rng.randrange(ep * dp)
            skip = (culprit, rng.randrange(1, 3), rng.randrange(2), "fwd", 0)
            truth["culprits"] = [culprit]
        job = moe(rng, ep, dp, rng.choice([1, 2]), steps, rng.choice([2, 4]), skip)
        job.seed = seed
        if skip is None:
            truth["healthy"] = True
            hang = False
            slow_dump_step = rng.randrange(2, steps)
    elif name in ("healthy_diloco", "diloco_outer_skip"):
        replicas = rng.choice([2, 4])
        size = rng.choice([2, 4, 8])
        h = rng.choice([2, 3])
        steps = 12
        never = None
        if name == "diloco_outer_skip":
            culprit = rng.randrange(replicas * size)
            never = (culprit, rng.randrange(h, 2 * h))
            truth["culprits"] = [culprit]
            timeout_ms = rng.choice([60_000, 120_000])
            steps = 400
        job = diloco(rng, replicas, size, steps, h, never)
        job.seed = seed
        if never is None:
            truth["healthy"] = True
            hang = False
            slow_dump_step = rng.randrange(h + 1, steps)
    else:
        raise SystemExit("unknown case " + name)

    horizon = 1 << 62
    if dead:
        # the process dies partway through a step
        r = next(iter(dead))
        job.dead_at = {}
        works, t_end = simulate(job, horizon)
        a, b = step_times(works, r, rng.randrange(1, 3))
        job.dead_at = {r: a + int((b - a) * rng.uniform(0.1, 0.9))}
        job.rng = random.Random("%d/%s/again" % (seed, name))
        works, t_end = simulate(job, horizon)
    else:
        works, t_end = simulate(job, horizon)
    if hang:
        stuck = [w.created for ws in works.values() for w in ws if w.done is None]
        if not stuck:
            raise SystemExit("case %s seed %d: the fault did not stop the job" % (name, seed))
        trigger = min(stuck) + timeout_ms * MS
        dump_at = {r: trigger + rng.randrange(0, 3 * S) for r in range(job.world)}
    else:
        r0 = 0
        a, b = step_times(works, r0, slow_dump_step)
        t = a + int((b - a) * rng.uniform(0.0, 0.9))
        dump_at = {r: t + rng.randrange(0, 50 * MS) for r in range(job.world)}
    # why the dump exists: the watchdog wrote it at a timeout, or someone asked for it
    # (_dump_nccl_trace, the debug server) while the job ran; the person holding the files knows
    truth["dump"] = "timeout" if hang else "on_demand"
    truth["world"] = job.world
    truth["layout"] = job.layout
    truth["timing"] = timing
    truth["dead"] = sorted(dead)
    return job, works, dump_at, timing, buffer_size, timeout_ms, dead, truth


CASES = [
    "healthy_megatron", "healthy_fsdp", "healthy_moe", "healthy_diloco",
    "pp_missing_recv", "fsdp_coalesced_rs_size", "tp_gpu_hang", "moe_a2a_skip",
    "diloco_outer_skip", "dead_rank", "compute_straggler", "slow_nic", "slow_link",
    "dp_dtype_mismatch", "tp2_size_change",
]


def main():
    seed = int(sys.argv[1])
    out = sys.argv[2]
    only = sys.argv[3:] or CASES
    truths = {}
    for name in only:
        job, works, dump_at, timing, buf, timeout_ms, dead, truth = case(seed, name)
        write_dumps(job, works, os.path.join(out, name), dump_at, timing, buf, timeout_ms, dead)
        truths[name] = truth
    with open(os.path.join(out, "truth.json"), "w") as f:
        json.dump(truths, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
