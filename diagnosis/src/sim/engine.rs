//! The discrete-event core: per-rank clocks, the semantics of a collective and of a send/recv,
//! fault effects, and the ordered hand-over of events to the sink.
//!
//! Each rank has a `ready` time (true clock): when it is free for its next op. A collective
//! takes every member's `ready` as its arrival, starts at the latest arrival, and frees every
//! member at `start + transfer`. A rank that can never arrive has `ready = NEVER`; an op waiting
//! for it never starts, and its members become `NEVER` too, so a hang spreads along the
//! dependencies exactly as far as it would in a real job.
//!
//! Events are buffered in a heap keyed by delivery time and released once no later-generated
//! event can be delivered earlier (the watermark is the earliest `ready` of a live rank), which
//! keeps memory to about one step's worth of events at any scale.

use super::counters::HostCounters;
use super::faults::{Fault, Label, MismatchKind};
use super::topology::Topology;
use super::{workload, Algo, SimError, SimSpec, SimSummary};
use crate::event::{Coll, Dir, Dtype, Event, LinkCounters, Op, PeerProgress, PgName, Phase, Rank};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

/// `ready` of a rank that will never be free again.
pub(super) const NEVER: u64 = u64::MAX;

/// Network delay from a probe client to the analyzer.
const NET_DELAY_NS: u64 = 1_000_000;

/// How often a hung data-plane op's per-peer progress is re-reported.
const STALL_REPORT_NS: u64 = 1_000_000_000;

/// Offset of the noise RNG's seed, so noise draws never shift the timeline's draws.
const NOISE_SEED_SALT: u64 = 0x9e37_79b9_7f4a_7c15;

/// An event waiting for its delivery time.
struct Pending {
    key: Reverse<(u64, u64)>,
    event: Event,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key.cmp(&other.key)
    }
}

/// What one op looks like on one rank.
#[derive(Clone)]
struct OpRec {
    pg: PgName,
    seq: u64,
    op: Op,
    dtype: Dtype,
    count: u64,
    bytes: u64,
    peer: Option<Rank>,
}

/// An op-tied fault that hits the op being issued.
enum Hit {
    None,
    Mismatch(Rank, MismatchKind),
    KernelHang(Rank),
    Extra(Rank),
}

/// One directed transfer inside an op: sender, receiver, bytes, time the pair was busy.
struct PairLoad {
    from: Rank,
    to: Rank,
    bytes: u64,
    busy_ns: u64,
}

pub(super) struct Engine<'a> {
    spec: &'a SimSpec,
    pub(super) topo: Topology,
    rng: StdRng,
    noise: StdRng,
    pub(super) ready: Vec<u64>,
    /// Clock offset of each node's host.
    skew: Vec<i64>,
    /// Each rank's phase within the summary interval (when its batches leave).
    phase: Vec<u64>,
    hb_next: Vec<u64>,
    hb_stop: Vec<u64>,
    group_seq: Vec<u64>,
    p2p_seq: Vec<u64>,
    heap: BinaryHeap<Pending>,
    order: u64,
    /// Index of the group an op-tied fault names.
    fault_group: Option<usize>,
    /// Absolute onset of a time-triggered fault.
    fault_at: Option<u64>,
    /// When an op-tied fault actually fired.
    fired_at: Option<u64>,
    /// A frozen or crashed rank and the time from which it is silent.
    silent_from: Option<(Rank, u64)>,
    /// The rank slowed this step by the random-imbalance control.
    random_slow: Option<Rank>,
    /// Latest true time at which an op made progress.
    last_progress: u64,
    delivered: u64,
    last_delivery: u64,
    peak_buffered: usize,
    /// Everything delivered at or before this has been handed over.
    flushed_to: u64,
    counters: HostCounters,
    /// True time of the next host-counter reading.
    next_reading: u64,
}

impl<'a> Engine<'a> {
    pub(super) fn new(spec: &'a SimSpec) -> Result<Engine<'a>, SimError> {
        let topo = Topology::new(spec)?;
        if spec.heartbeat_interval_ns == 0 || spec.summary_interval_ns == 0 {
            return Err(SimError::Param(
                "heartbeat and summary intervals must be positive".into(),
            ));
        }
        if !(0.0..=1.0).contains(&spec.noise.dropped_events) {
            return Err(SimError::Param(format!(
                "dropped_events {} is not a fraction",
                spec.noise.dropped_events
            )));
        }
        if !(spec.jitter.is_finite() && spec.jitter >= 0.0) {
            return Err(SimError::Param(format!(
                "jitter {} is not a σ",
                spec.jitter
            )));
        }
        if let Some(fault) = &spec.fault {
            fault.validate(&topo)?;
        }
        let world = topo.world as usize;
        let mut rng = StdRng::seed_from_u64(spec.seed);
        let mut noise = StdRng::seed_from_u64(spec.seed ^ NOISE_SEED_SALT);
        let phase: Vec<u64> = (0..world)
            .map(|_| rng.gen_range(0..spec.summary_interval_ns))
            .collect();
        let hb_next = (0..world)
            .map(|_| spec.epoch_ns + rng.gen_range(0..spec.heartbeat_interval_ns))
            .collect();
        let skew_max = i64::try_from(spec.clock_skew_ns).unwrap_or(i64::MAX / 2);
        let skew = (0..spec.nodes)
            .map(|_| {
                if skew_max == 0 {
                    0
                } else {
                    noise.gen_range(-skew_max..=skew_max)
                }
            })
            .collect();
        let fault_group = spec
            .fault
            .as_ref()
            .and_then(|f| f.pg())
            .and_then(|pg| topo.group(pg));
        let fault_at = spec
            .fault
            .as_ref()
            .and_then(Fault::onset_offset)
            .map(|off| spec.epoch_ns.saturating_add(off));
        let silent_from = match &spec.fault {
            Some(Fault::ProcessFreeze { rank, .. } | Fault::ProcessCrash { rank, .. }) => {
                fault_at.map(|at| (*rank, at))
            }
            _ => None,
        };
        let groups = topo.groups.len();
        Ok(Engine {
            spec,
            rng,
            noise,
            ready: vec![spec.epoch_ns; world],
            skew,
            phase,
            hb_next,
            hb_stop: vec![NEVER; world],
            group_seq: vec![0; groups],
            p2p_seq: vec![0; world],
            heap: BinaryHeap::new(),
            order: 0,
            fault_group,
            fault_at,
            fired_at: None,
            silent_from,
            random_slow: None,
            last_progress: spec.epoch_ns,
            delivered: 0,
            last_delivery: spec.epoch_ns,
            peak_buffered: 0,
            flushed_to: spec.epoch_ns,
            counters: HostCounters::default(),
            next_reading: spec.epoch_ns + spec.summary_interval_ns,
            topo,
        })
    }

    /// The spec being simulated (borrowed for the engine's whole life, not from it).
    pub(super) fn spec(&self) -> &'a SimSpec {
        self.spec
    }

    /// Runs the whole job and hands every event to `sink` in delivery order.
    pub(super) fn run(
        mut self,
        sink: &mut impl FnMut(u64, &Event),
    ) -> Result<SimSummary, SimError> {
        let epoch = self.spec.epoch_ns;
        for r in 0..self.topo.world {
            let ev = Event::Member(self.topo.member(r));
            self.hand_over(epoch, &ev, sink);
        }
        for g in 0..self.topo.groups.len() {
            let ev = Event::Group(self.topo.group_event(g));
            self.hand_over(epoch, &ev, sink);
        }
        workload::start(&mut self);
        for step in 0..self.spec.steps {
            if self.ready.iter().all(|&t| t == NEVER) {
                break;
            }
            if let Some(Fault::ImbalanceRandom { .. }) = self.spec.fault {
                self.random_slow = Some(self.rng.gen_range(0..self.topo.world));
            }
            workload::step(&mut self, step);
            let watermark = self.watermark();
            if watermark == NEVER {
                // Everyone is stuck; `finish` releases the rest in time order.
                break;
            }
            self.flush(watermark, sink);
        }
        self.finish(sink)
    }

    /// The earliest time a live rank can still produce an event.
    fn watermark(&self) -> u64 {
        self.ready
            .iter()
            .copied()
            .filter(|&t| t != NEVER)
            .min()
            .unwrap_or(NEVER)
    }

    fn finish(mut self, sink: &mut impl FnMut(u64, &Event)) -> Result<SimSummary, SimError> {
        let hung = self.ready.contains(&NEVER);
        let end_true = if hung {
            self.last_progress.saturating_add(self.spec.tail_ns)
        } else {
            for r in 0..self.topo.world {
                let t = self.ready[r as usize];
                self.hb_stop[r as usize] = t;
                let ev = Event::Exit {
                    rank: r,
                    t_ns: self.host_time(r, t),
                };
                self.push(Some(r), t, ev, false);
            }
            self.ready
                .iter()
                .copied()
                .max()
                .unwrap_or(self.spec.epoch_ns)
        };
        let label = self.label(end_true)?;
        // No op is left to run: only heartbeats remain to be generated, so release them in
        // slices instead of queueing a whole tail's worth for every rank at once.
        let mut upto = self.flushed_to;
        while upto < end_true {
            upto = upto
                .saturating_add(self.spec.summary_interval_ns)
                .min(end_true);
            self.flush(upto, sink);
        }
        self.heartbeats_until(end_true.saturating_add(1));
        // One reading after the end, so the counters' totals include the last transfers.
        let last_reading = end_true.saturating_add(self.spec.summary_interval_ns);
        self.readings_until(last_reading.saturating_add(1));
        self.flush(NEVER, sink);
        Ok(SimSummary {
            label,
            end_ns: end_true.max(self.last_delivery),
            world: self.topo.world,
            events: self.delivered,
            peak_buffered: self.peak_buffered,
        })
    }

    /// The ground truth, or an error if the fault never took effect.
    fn label(&self, end_true: u64) -> Result<Label, SimError> {
        let Some(fault) = &self.spec.fault else {
            return Ok(Label::default());
        };
        if fault.is_control() {
            return Ok(fault.label(self.spec.epoch_ns));
        }
        let onset = match (self.fault_at, self.fired_at) {
            (_, Some(at)) => at,
            (Some(at), None) if at < self.last_progress.min(end_true) => at,
            _ => {
                return Err(SimError::NeverFired(format!(
                    "{} did not take effect before the job ended",
                    fault.name()
                )))
            }
        };
        Ok(fault.label(onset))
    }

    // ---- compute -------------------------------------------------------------------------

    /// Rank `r` computes for `base_ns`, jittered and slowed by any fault or control on it.
    pub(super) fn compute(&mut self, r: Rank, base_ns: u64) {
        let jitter = self.jitter();
        let t = self.ready[r as usize];
        if t == NEVER {
            return;
        }
        let mut factor = jitter;
        match &self.spec.fault {
            Some(Fault::SlowCompute {
                rank, factor: f, ..
            }) if *rank == r && self.fault_at.is_some_and(|at| t >= at) => factor *= f,
            Some(Fault::ImbalanceStage { stage, factor: f }) if self.topo.stage_of(r) == *stage => {
                factor *= f
            }
            Some(Fault::ImbalanceRandom { factor: f }) if self.random_slow == Some(r) => {
                factor *= f
            }
            _ => {}
        }
        self.ready[r as usize] = t.saturating_add((base_ns as f64 * factor) as u64);
    }

    /// A lognormal factor with median 1 (Box–Muller on the timeline RNG).
    fn jitter(&mut self) -> f64 {
        if self.spec.jitter == 0.0 {
            return 1.0;
        }
        let u1: f64 = self.rng.gen_range(f64::EPSILON..1.0);
        let u2: f64 = self.rng.gen();
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        (self.spec.jitter * z).exp()
    }

    // ---- arrivals and faults -------------------------------------------------------------

    /// When rank `r` arrives at op `seq` of group `g`, or `None` if it never does.
    fn arrive(&mut self, r: Rank, g: usize, seq: u64) -> Option<u64> {
        let t = self.ready[r as usize];
        if t == NEVER {
            return None;
        }
        if let Some((victim, from)) = self.silent_from {
            if victim == r && t >= from {
                self.ready[r as usize] = NEVER;
                return None;
            }
        }
        if let Some(Fault::SkipCollective { rank, seq: s, .. }) = &self.spec.fault {
            if *rank == r && *s == seq && self.fault_group == Some(g) {
                self.fire(t);
                self.ready[r as usize] = NEVER;
                return None;
            }
        }
        Some(t)
    }

    fn fire(&mut self, t: u64) {
        self.fired_at = Some(self.fired_at.map_or(t, |f| f.min(t)));
    }

    fn hit(&self, g: usize, seq: u64) -> Hit {
        if self.fault_group != Some(g) {
            return Hit::None;
        }
        match &self.spec.fault {
            Some(Fault::Mismatch {
                rank, seq: s, kind, ..
            }) if *s == seq => Hit::Mismatch(*rank, *kind),
            Some(Fault::GpuKernelHang { rank, seq: s, .. }) if *s == seq => Hit::KernelHang(*rank),
            Some(Fault::ExtraCollective {
                rank, after_seq, ..
            }) if *after_seq == seq => Hit::Extra(*rank),
            _ => Hit::None,
        }
    }

    /// How many times slower the path from `a` to `b` is at time `at`.
    fn slowdown(&self, a: Rank, b: Rank, at: u64) -> f64 {
        let (na, nb) = (self.topo.node_of(a), self.topo.node_of(b));
        if na == nb || self.fault_at.is_none_or(|onset| at < onset) {
            return 1.0;
        }
        match &self.spec.fault {
            Some(Fault::SlowLink {
                from_node,
                to_node,
                factor,
                ..
            }) if (na, nb) == (*from_node, *to_node) || (nb, na) == (*from_node, *to_node) => {
                *factor
            }
            Some(Fault::SlowNic { node, factor, .. }) if na == *node || nb == *node => *factor,
            Some(Fault::Congestion { tor, factor, .. })
                if self.topo.tor_of_node(na) == *tor || self.topo.tor_of_node(nb) == *tor =>
            {
                *factor
            }
            _ => 1.0,
        }
    }

    /// Effective bandwidth (bytes/ns) and latency of the path from `a` to `b` at `at`.
    fn link(&self, a: Rank, b: Rank, at: u64) -> (f64, u64) {
        let (bw, lat) = self.topo.base_link(a, b);
        let slow = self.slowdown(a, b, at);
        (bw / slow, (lat as f64 * slow) as u64)
    }

    // ---- ops -----------------------------------------------------------------------------

    /// A collective over group `g`: every member contributes `bytes`.
    pub(super) fn collective(&mut self, g: usize, op: Op, bytes: u64) {
        let seq = self.group_seq[g] + 1;
        self.group_seq[g] = seq;
        let members = self.topo.groups[g].ranks.clone();
        let dtype = Dtype::BFloat16;
        let rec = OpRec {
            pg: self.topo.groups[g].name.clone(),
            seq,
            op,
            dtype,
            count: bytes / dtype.size(),
            bytes,
            peer: None,
        };
        let hit = self.hit(g, seq);
        let arrivals: Vec<Option<u64>> = members.iter().map(|&r| self.arrive(r, g, seq)).collect();
        for (&r, arrival) in members.iter().zip(&arrivals) {
            if let Some(t) = *arrival {
                let mine = match hit {
                    Hit::Mismatch(victim, kind) if victim == r => mismatched(&rec, kind),
                    _ => rec.clone(),
                };
                self.coll(r, &mine, Phase::Enqueue, t);
            }
        }
        let Some(start) = arrivals.iter().copied().collect::<Option<Vec<u64>>>() else {
            self.stall(&members);
            return;
        };
        let start = start.into_iter().max().unwrap_or(self.spec.epoch_ns);
        let (duration, loads) = self.transfer(&members, bytes, start);
        match hit {
            Hit::Mismatch(victim, kind) => {
                let t = arrivals[members.iter().position(|&r| r == victim).unwrap_or(0)];
                self.fire(t.unwrap_or(start));
                for &r in &members {
                    let mine = if r == victim {
                        mismatched(&rec, kind)
                    } else {
                        rec.clone()
                    };
                    self.coll(r, &mine, Phase::Start, start);
                }
                self.stall(&members);
                return;
            }
            Hit::KernelHang(victim) => {
                self.fire(start);
                for &r in &members {
                    self.coll(r, &rec, Phase::Start, start);
                }
                self.report_stalled_transfer(&rec, &loads, victim, members.len() as u64, start);
                self.stall(&members);
                return;
            }
            Hit::None | Hit::Extra(_) => {}
        }
        let end = start.saturating_add(duration);
        for &r in &members {
            self.coll(r, &rec, Phase::Start, start);
            self.coll(r, &rec, Phase::End, end);
            self.ready[r as usize] = end;
        }
        self.report_long_transfer(&rec, &loads, start, duration);
        for load in &loads {
            self.traffic(load.from, load.to, load.bytes, end);
            self.peer(
                &rec,
                load.from,
                load.to,
                Dir::Send,
                load.bytes,
                load.busy_ns,
                end,
            );
            self.peer(
                &rec,
                load.to,
                load.from,
                Dir::Recv,
                load.bytes,
                load.busy_ns,
                end,
            );
        }
        self.last_progress = self.last_progress.max(end);
        if let Hit::Extra(victim) = hit {
            if self.ready[victim as usize] == end {
                self.fire(end);
                let extra = OpRec {
                    seq: seq + 1,
                    ..rec
                };
                self.coll(victim, &extra, Phase::Enqueue, end);
                self.ready[victim as usize] = NEVER;
            }
        }
    }

    /// A blocking send from `from` to `to` inside their pipeline group.
    pub(super) fn p2p(&mut self, from: Rank, to: Rank, bytes: u64) {
        let Some(g) = self.topo.pp_group_of(from) else {
            return;
        };
        let pg = self.topo.groups[g].name.clone();
        let mut recs = [(from, Op::Send, to), (to, Op::Recv, from)].map(|(rank, op, peer)| {
            self.p2p_seq[rank as usize] += 1;
            let dtype = Dtype::BFloat16;
            (
                rank,
                OpRec {
                    pg: pg.clone(),
                    seq: self.p2p_seq[rank as usize],
                    op,
                    dtype,
                    count: bytes / dtype.size(),
                    bytes,
                    peer: Some(peer),
                },
            )
        });
        let mut arrivals = [None; 2];
        for (i, (rank, rec)) in recs.iter_mut().enumerate() {
            arrivals[i] = self.arrive(*rank, g, rec.seq);
        }
        for ((rank, rec), arrival) in recs.iter().zip(arrivals) {
            if let Some(t) = arrival {
                self.coll(*rank, rec, Phase::Enqueue, t);
            }
        }
        let (Some(a), Some(b)) = (arrivals[0], arrivals[1]) else {
            self.stall(&[from, to]);
            return;
        };
        let start = a.max(b);
        let (bw, lat) = self.link(from, to, start);
        let busy = lat + (bytes as f64 / bw) as u64;
        let end = start.saturating_add(busy);
        for (rank, rec) in &recs {
            self.coll(*rank, rec, Phase::Start, start);
            self.coll(*rank, rec, Phase::End, end);
            self.ready[*rank as usize] = end;
        }
        self.peer(&recs[0].1, from, to, Dir::Send, bytes, busy, end);
        self.traffic(from, to, bytes, end);
        self.peer(&recs[1].1, to, from, Dir::Recv, bytes, busy, end);
        self.last_progress = self.last_progress.max(end);
    }

    /// Every member of a stuck op is stuck for good.
    fn stall(&mut self, members: &[Rank]) {
        for &r in members {
            self.ready[r as usize] = NEVER;
        }
    }

    /// How long an op's data movement takes once everyone has arrived, and the load on each
    /// directed pair.
    fn transfer(&self, members: &[Rank], bytes: u64, at: u64) -> (u64, Vec<PairLoad>) {
        let n = members.len() as u64;
        if n < 2 {
            return (0, Vec::new());
        }
        let mut edges = Vec::new();
        let (steps, per_pair_bytes) = match self.spec.algo {
            Algo::Ring => {
                for (i, &a) in members.iter().enumerate() {
                    edges.push((a, members[(i + 1) % members.len()]));
                }
                let per_rank = (u128::from(bytes) * 2 * u128::from(n - 1) / u128::from(n)) as u64;
                (2 * (n - 1), per_rank)
            }
            Algo::Tree => {
                for i in 1..members.len() {
                    let parent = members[(i - 1) / 2];
                    edges.push((members[i], parent));
                    edges.push((parent, members[i]));
                }
                let depth = u64::from(64 - (n - 1).leading_zeros());
                (2 * depth, bytes)
            }
        };
        let mut slowest_bw = f64::INFINITY;
        let mut slowest_lat = 0;
        let loads = edges
            .into_iter()
            .map(|(from, to)| {
                let (bw, lat) = self.link(from, to, at);
                slowest_bw = slowest_bw.min(bw);
                slowest_lat = slowest_lat.max(lat);
                PairLoad {
                    from,
                    to,
                    bytes: per_pair_bytes,
                    busy_ns: steps * lat + (per_pair_bytes as f64 / bw) as u64,
                }
            })
            .collect();
        let moved = match self.spec.algo {
            Algo::Ring => per_pair_bytes as f64,
            // Reduce up the tree, then broadcast down: the slowest edge carries S twice.
            Algo::Tree => 2.0 * per_pair_bytes as f64,
        };
        let duration = steps * slowest_lat + (moved / slowest_bw) as u64;
        (duration, loads)
    }

    /// Per-peer progress of a transfer that runs longer than a report period (a DiLoCo outer
    /// all-reduce over a slow link): the probe reports the bytes moved so far every period, as
    /// NCCL's profiler reports proxy steps, so a long op that moves data is seen to progress.
    fn report_long_transfer(&mut self, rec: &OpRec, loads: &[PairLoad], start: u64, duration: u64) {
        let reports = duration / STALL_REPORT_NS;
        for k in 1..=reports {
            let done = k * STALL_REPORT_NS;
            let t = start.saturating_add(done);
            for load in loads {
                let bytes =
                    (u128::from(load.bytes) * u128::from(done) / u128::from(duration)) as u64;
                let busy = load.busy_ns.min(done);
                self.peer(rec, load.from, load.to, Dir::Send, bytes, busy, t);
                self.peer(rec, load.to, load.from, Dir::Recv, bytes, busy, t);
            }
        }
    }

    /// Per-peer progress of an op whose kernel hung on `victim`: the victim sends nothing, the
    /// others get one chunk out before the pipeline backs up. Everyone else stays blocked on a
    /// peer; the victim does not: it waits for its own GPU (NCCL's `SendGPUWait` and
    /// `RecvGPUWait`), so its own records show no time blocked on a peer. That, and not the
    /// silent pair alone, is what tells a hung kernel from a dead link.
    fn report_stalled_transfer(
        &mut self,
        rec: &OpRec,
        loads: &[PairLoad],
        victim: Rank,
        n: u64,
        start: u64,
    ) {
        let reports = self.spec.tail_ns / STALL_REPORT_NS;
        for k in 1..=reports {
            let t = start.saturating_add(k * STALL_REPORT_NS);
            let waited = k * STALL_REPORT_NS;
            for load in loads {
                let bytes = if load.from == victim {
                    0
                } else {
                    load.bytes.min(rec.bytes / n.max(1))
                };
                let blocked = |r: Rank| if r == victim { 0 } else { waited };
                self.peer(
                    rec,
                    load.from,
                    load.to,
                    Dir::Send,
                    bytes,
                    blocked(load.from),
                    t,
                );
                self.peer(
                    rec,
                    load.to,
                    load.from,
                    Dir::Recv,
                    bytes,
                    blocked(load.to),
                    t,
                );
            }
        }
    }

    // ---- emission ------------------------------------------------------------------------

    fn host_time(&self, r: Rank, t: u64) -> u64 {
        self.node_time(self.topo.node_of(r), t)
    }

    fn node_time(&self, node: u32, t: u64) -> u64 {
        t.saturating_add_signed(self.skew.get(node as usize).copied().unwrap_or(0))
    }

    /// Counts an inter-node transfer in both hosts' eBPF counters.
    fn traffic(&mut self, from: Rank, to: Rank, bytes: u64, end: u64) {
        let (a, b) = (self.topo.node_of(from), self.topo.node_of(to));
        self.counters.record(a, b, bytes, end);
    }

    /// Queues every host-counter reading due before `until`: each summary interval, one record
    /// per host and peer host that have exchanged data.
    fn readings_until(&mut self, until: u64) {
        while self.next_reading < until {
            let t = self.next_reading;
            for reading in self.counters.read(t) {
                let ev = Event::Counters(LinkCounters {
                    addr: Topology::addr(reading.node),
                    peer_addr: Topology::addr(reading.peer),
                    tx_bytes: reading.tx_bytes,
                    rx_bytes: reading.rx_bytes,
                    tx_packets: reading.tx_packets,
                    rx_packets: reading.rx_packets,
                    last_rx_ns: match reading.last_rx_ns {
                        0 => 0,
                        at => self.node_time(reading.node, at),
                    },
                    t_ns: self.node_time(reading.node, t),
                });
                self.push(None, t, ev, true);
            }
            self.next_reading = t.saturating_add(self.spec.summary_interval_ns);
        }
    }

    fn coll(&mut self, r: Rank, rec: &OpRec, phase: Phase, t: u64) {
        let ev = Event::Coll(Coll {
            rank: r,
            pg: rec.pg.clone(),
            seq: rec.seq,
            op: rec.op,
            dtype: rec.dtype,
            count: rec.count,
            bytes: rec.bytes,
            out_count: 0,
            peer: rec.peer,
            phase,
            t_ns: self.host_time(r, t),
        });
        self.push(Some(r), t, ev, true);
    }

    #[allow(clippy::too_many_arguments)]
    fn peer(&mut self, rec: &OpRec, r: Rank, peer: Rank, dir: Dir, bytes: u64, busy: u64, t: u64) {
        let ev = Event::Peer(PeerProgress {
            rank: r,
            pg: rec.pg.clone(),
            seq: rec.seq,
            peer,
            dir,
            bytes,
            busy_ns: busy,
            t_ns: self.host_time(r, t),
        });
        self.push(Some(r), t, ev, true);
    }

    /// Queues an event that happened at true time `t` on rank `rank`'s host.
    fn push(&mut self, rank: Option<Rank>, t: u64, event: Event, droppable: bool) {
        if let (Some(r), Some((victim, from))) = (rank, self.silent_from) {
            if r == victim && t >= from {
                return;
            }
        }
        if droppable
            && self.spec.noise.dropped_events > 0.0
            && self.noise.gen::<f64>() < self.spec.noise.dropped_events
        {
            return;
        }
        let delivery = match (&event, rank) {
            (Event::Heartbeat { .. }, _) | (_, None) => t.saturating_add(NET_DELAY_NS),
            (_, Some(r)) => self.batch_delivery(r, t),
        };
        self.order += 1;
        self.heap.push(Pending {
            key: Reverse((delivery, self.order)),
            event,
        });
        self.peak_buffered = self.peak_buffered.max(self.heap.len());
    }

    /// When the batch holding an event from rank `r` at true time `t` reaches the analyzer:
    /// the rank's next summary tick after `t`, plus the network delay.
    fn batch_delivery(&self, r: Rank, t: u64) -> u64 {
        let interval = self.spec.summary_interval_ns;
        let phase = self.phase[r as usize];
        let rel = t.saturating_sub(self.spec.epoch_ns);
        let ticks = (rel + interval - phase) / interval;
        self.spec.epoch_ns + ticks * interval + phase + NET_DELAY_NS
    }

    /// Queues every heartbeat due before `until`.
    fn heartbeats_until(&mut self, until: u64) {
        let interval = self.spec.heartbeat_interval_ns;
        for r in 0..self.topo.world {
            let i = r as usize;
            while self.hb_next[i] < until && self.hb_next[i] < self.hb_stop[i] {
                let t = self.hb_next[i];
                let ev = Event::Heartbeat {
                    rank: r,
                    t_ns: self.host_time(r, t),
                };
                self.push(Some(r), t, ev, true);
                self.hb_next[i] = t.saturating_add(interval);
            }
        }
    }

    /// Hands over every queued event delivered at or before `watermark`.
    fn flush(&mut self, watermark: u64, sink: &mut impl FnMut(u64, &Event)) {
        if watermark != NEVER {
            self.heartbeats_until(watermark);
            self.readings_until(watermark);
            self.flushed_to = self.flushed_to.max(watermark);
        }
        while self.heap.peek().is_some_and(|p| p.key.0 .0 <= watermark) {
            if let Some(p) = self.heap.pop() {
                self.hand_over(p.key.0 .0, &p.event, sink);
            }
        }
    }

    fn hand_over(&mut self, delivery: u64, event: &Event, sink: &mut impl FnMut(u64, &Event)) {
        self.delivered += 1;
        self.last_delivery = self.last_delivery.max(delivery);
        sink(delivery, event);
    }
}

/// The op as a mismatching rank issues it.
fn mismatched(rec: &OpRec, kind: MismatchKind) -> OpRec {
    let mut bad = rec.clone();
    match kind {
        MismatchKind::Type => {
            bad.op = if rec.op == Op::AllGather {
                Op::AllReduce
            } else {
                Op::AllGather
            }
        }
        MismatchKind::Size => {
            bad.count = rec.count * 2;
            bad.bytes = rec.bytes * 2;
        }
        MismatchKind::Dtype => {
            bad.dtype = Dtype::Float32;
            bad.bytes = rec.count * Dtype::Float32.size();
        }
    }
    bad
}
