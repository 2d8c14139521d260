//! The Flight Recorder dumps a simulated job's ranks would write on a watchdog timeout: each
//! rank's ring buffer of ops (host clock), the groups it belongs to and its per-group progress
//! counters, in the shape `import::fr` reads and writes.
//!
//! The recorder lives inside the training process, so it sees every op of its rank whatever the
//! probe lost on the way to the analyzer: the dumps are rebuilt from a noise-free run of the same
//! seed. A frozen rank's buffer stops at its freeze; a crashed rank leaves no dump; the noise
//! setting `missing_dumps` removes that many more, chosen by seed.

use super::faults::Fault;
use super::topology::Topology;
use super::{simulate_into, DumpTrigger, JobKind, SimError, SimSpec, Simulation};
use crate::event::{Coll, Dtype, Event, Op, Phase, Rank};
use crate::import::fr::{
    FrDump, FrEntry, FrPg, FrPgStatus, FR_VERSION, STATE_COMPLETED, STATE_SCHEDULED, STATE_STARTED,
};
use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::SeedableRng;
use std::collections::{BTreeSet, HashMap};

/// `TORCH_NCCL_TIMEOUT`'s usual default, written into every entry.
const TIMEOUT_MS: u64 = 600_000;

/// Salt of the RNG that picks the ranks with missing dumps.
const MISSING_SEED_SALT: u64 = 0x6a09_e667_f3bc_c908;

/// Per-rank dumps of a simulation, ordered by rank.
pub fn fr_dumps(sim: &Simulation, spec: &SimSpec) -> Result<Vec<FrDump>, SimError> {
    let topo = Topology::new(spec)?;
    let mut book = Recorder::new(&topo);
    if spec.noise.dropped_events == 0.0 {
        for (_, ev) in &sim.events {
            book.record(ev);
        }
    } else {
        let mut clean = spec.clone();
        clean.noise.dropped_events = 0.0;
        simulate_into(&clean, &mut |_, ev| book.record(ev))?;
    }
    let missing = missing_dumps(spec, topo.world);
    Ok(book.into_dumps(&topo, spec, &missing))
}

/// Ranks whose dump does not exist: a crashed rank and `missing_dumps` more chosen by seed.
pub fn missing_dumps(spec: &SimSpec, world: u32) -> BTreeSet<Rank> {
    let mut missing = BTreeSet::new();
    if let Some(Fault::ProcessCrash { rank, .. }) = &spec.fault {
        missing.insert(*rank);
    }
    let extra = (spec.noise.missing_dumps as usize).min(world as usize);
    let mut rng = StdRng::seed_from_u64(spec.seed ^ MISSING_SEED_SALT);
    for r in sample(&mut rng, world as usize, extra) {
        missing.insert(r as Rank);
    }
    missing
}

/// One op on one rank as the recorder saw it.
struct Seen {
    first: Coll,
    started: Option<u64>,
    ended: Option<u64>,
}

/// Collects each rank's ops from the event stream.
struct Recorder {
    ops: Vec<Vec<Seen>>,
    open: HashMap<(Rank, usize, u64), usize>,
    group_index: HashMap<String, usize>,
}

impl Recorder {
    fn new(topo: &Topology) -> Recorder {
        Recorder {
            ops: (0..topo.world).map(|_| Vec::new()).collect(),
            open: HashMap::new(),
            group_index: topo
                .groups
                .iter()
                .enumerate()
                .map(|(i, g)| (g.name.to_string(), i))
                .collect(),
        }
    }

    /// Restamps each op's start as Flight Recorder sees it. The simulator's `Start` is when the
    /// transfer began (every participant arrived); FR's start event is recorded on the process
    /// group's stream before the NCCL call, so it fires once this rank's stream reaches the op:
    /// when the rank enqueued it, or when its previous op in the group ended. A rank waiting
    /// inside a collective for a late peer, or a receive waiting for its sender, is therefore
    /// `started` in a dump; an op queued behind one that never ended stays `scheduled`.
    fn start_on_own_stream(&mut self) {
        for ops in &mut self.ops {
            // Per group: when the stream is free again (None: blocked for good).
            let mut free_at: HashMap<crate::event::PgName, Option<u64>> = HashMap::new();
            for s in ops.iter_mut() {
                let free = free_at.get(&s.first.pg).copied().unwrap_or(Some(0));
                s.started = free.map(|f| f.max(s.first.t_ns));
                free_at.insert(s.first.pg.clone(), s.ended);
            }
        }
    }

    fn record(&mut self, ev: &Event) {
        let Event::Coll(c) = ev else {
            return;
        };
        let Some(&g) = self.group_index.get(&*c.pg) else {
            return;
        };
        let Some(ops) = self.ops.get_mut(c.rank as usize) else {
            return;
        };
        let key = (c.rank, g, c.seq);
        match c.phase {
            Phase::Enqueue => {
                self.open.insert(key, ops.len());
                ops.push(Seen {
                    first: c.clone(),
                    started: None,
                    ended: None,
                });
            }
            Phase::Start | Phase::End => {
                let Some(&i) = self.open.get(&key) else {
                    return;
                };
                if c.phase == Phase::Start {
                    ops[i].started = Some(c.t_ns);
                } else {
                    ops[i].ended = Some(c.t_ns);
                    self.open.remove(&key);
                }
            }
        }
    }

    fn into_dumps(
        mut self,
        topo: &Topology,
        spec: &SimSpec,
        missing: &BTreeSet<Rank>,
    ) -> Vec<FrDump> {
        let buffer = spec.noise.fr_buffer;
        let coalesced_p2p = spec.kind == JobKind::Pipeline;
        let mut member_of: Vec<Vec<usize>> = vec![Vec::new(); topo.world as usize];
        for (g, group) in topo.groups.iter().enumerate() {
            for &r in &group.ranks {
                member_of[r as usize].push(g);
            }
        }
        // The watchdog dumps once the oldest op in flight has been so for the timeout; the
        // dump then marks every started op as discovered started (FR's `dump_entries` queries
        // the events of what is still in flight), so the dump's time shows in the record.
        // A dump on demand sees each rank as it was then (on its own clock): later ops are not
        // recorded yet, and an op that had not started or ended then shows as such.
        let dump_ns = match spec.dump {
            DumpTrigger::Timeout => self
                .ops
                .iter()
                .flatten()
                .filter(|s| s.ended.is_none())
                .map(|s| s.first.t_ns)
                .min()
                .map(|t| t.saturating_add(TIMEOUT_MS * 1_000_000)),
            DumpTrigger::OnDemand { at_ns } => {
                let at = spec.epoch_ns.saturating_add(at_ns);
                for ops in &mut self.ops {
                    ops.retain(|s| s.first.t_ns <= at);
                    for s in ops.iter_mut() {
                        s.started = s.started.filter(|&t| t <= at);
                        s.ended = s.ended.filter(|&t| t <= at);
                    }
                }
                Some(at)
            }
        };
        self.start_on_own_stream();
        let mut dumps = Vec::new();
        for (rank, ops) in self.ops.into_iter().enumerate() {
            let rank = rank as Rank;
            if missing.contains(&rank) {
                continue;
            }
            let mut dump = FrDump {
                rank,
                version: FR_VERSION.to_string(),
                ..FrDump::default()
            };
            for &g in &member_of[rank as usize] {
                let group = &topo.groups[g];
                dump.pg_config.insert(
                    group.name.to_string(),
                    FrPg {
                        name: group.name.to_string(),
                        desc: desc(topo, g),
                        ranks: group.ranks.clone(),
                    },
                );
                dump.pg_status.insert(
                    g.to_string(),
                    FrPgStatus {
                        last_enqueued_collective: -1,
                        last_started_collective: -1,
                        last_completed_collective: -1,
                    },
                );
            }
            let skip = if buffer == 0 {
                0
            } else {
                ops.len().saturating_sub(buffer)
            };
            let mut record_id = 0u64;
            for (i, seen) in ops.iter().enumerate() {
                let Some(&g) = self.group_index.get(&*seen.first.pg) else {
                    continue;
                };
                if let Some(status) = dump.pg_status.get_mut(&g.to_string()) {
                    let seq = i64::try_from(seen.first.seq).unwrap_or(i64::MAX);
                    status.last_enqueued_collective = status.last_enqueued_collective.max(seq);
                    if seen.started.is_some() {
                        status.last_started_collective = status.last_started_collective.max(seq);
                    }
                    if seen.ended.is_some() {
                        status.last_completed_collective =
                            status.last_completed_collective.max(seq);
                    }
                }
                if i < skip {
                    record_id += 1;
                    continue;
                }
                let mut e = entry(topo, g, record_id, seen, dump_ns);
                record_id += 1;
                if coalesced_p2p && e.is_p2p {
                    // `batch_isend_irecv`: the op itself is recorded without CUDA events, so it
                    // stays "scheduled" forever; the `nccl:coalesced` entry that closes the
                    // batch, under the same `p2p_seq_id`, carries the batch's real state.
                    let closing = FrEntry {
                        record_id,
                        profiling_name: "nccl:coalesced".into(),
                        ..e.clone()
                    };
                    record_id += 1;
                    e.state = STATE_SCHEDULED.into();
                    e.time_discovered_started_ns = None;
                    e.time_discovered_completed_ns = None;
                    e.duration_ms = None;
                    e.retired = closing.retired;
                    dump.entries.push(e);
                    dump.entries.push(closing);
                } else {
                    dump.entries.push(e);
                }
            }
            dumps.push(dump);
        }
        dumps
    }
}

fn desc(topo: &Topology, g: usize) -> String {
    if topo.groups[g].name.as_ref() == "world" {
        "default_pg".into()
    } else {
        topo.group_event(g).desc
    }
}

/// The ring-buffer entry PyTorch would record for one op, in a dump taken at `dump_ns`.
fn entry(topo: &Topology, g: usize, record_id: u64, seen: &Seen, dump_ns: Option<u64>) -> FrEntry {
    let c = &seen.first;
    let group = &topo.groups[g];
    let group_rank = |r: Rank| group.ranks.iter().position(|&x| x == r).unwrap_or(0);
    let is_p2p = c.op.is_p2p();
    let profiling_name = match (c.op, c.peer) {
        (Op::Send, Some(peer)) => format!("nccl:send {}->{}", group_rank(c.rank), group_rank(peer)),
        (Op::Recv, Some(peer)) => format!("nccl:recv {}<-{}", group_rank(c.rank), group_rank(peer)),
        (op, _) => format!("nccl:{}", op.name()),
    };
    let count = i64::try_from(c.count).unwrap_or(i64::MAX);
    let out_count = match c.op {
        Op::AllGather => count.saturating_mul(group.ranks.len() as i64),
        _ => count,
    };
    let state = match (seen.started, seen.ended) {
        (_, Some(_)) => STATE_COMPLETED,
        (Some(_), None) => STATE_STARTED,
        (None, None) => STATE_SCHEDULED,
    };
    FrEntry {
        record_id,
        pg_id: g as u64,
        process_group: (group.name.to_string(), desc(topo, g)),
        collective_seq_id: if is_p2p { 0 } else { c.seq },
        p2p_seq_id: if is_p2p { c.seq } else { 0 },
        op_id: c.seq,
        profiling_name,
        time_created_ns: c.t_ns,
        time_discovered_started_ns: match (seen.started, seen.ended) {
            (Some(_), None) => dump_ns.or(seen.started),
            (started, _) => started,
        },
        time_discovered_completed_ns: seen.ended,
        input_sizes: vec![vec![count]],
        input_dtypes: vec![cpp_dtype(c.dtype).into()],
        output_sizes: vec![vec![out_count]],
        output_dtypes: vec![cpp_dtype(c.dtype).into()],
        state: state.into(),
        retired: seen.ended.is_some(),
        timeout_ms: TIMEOUT_MS,
        // GPU time from the start event, which fires when this rank's stream reaches the op
        // (its arrival), to the end: waiting for later peers included.
        duration_ms: seen.ended.map(|e| e.saturating_sub(c.t_ns) as f64 / 1e6),
        is_p2p,
    }
}

/// The C++ scalar-type name Flight Recorder writes for a dtype.
fn cpp_dtype(d: Dtype) -> &'static str {
    match d {
        Dtype::Float32 => "Float",
        Dtype::Float16 => "Half",
        Dtype::BFloat16 => "BFloat16",
        Dtype::Float64 => "Double",
        Dtype::Int32 => "Int",
        Dtype::Int64 => "Long",
        Dtype::Int8 => "Char",
        Dtype::UInt8 => "Byte",
        Dtype::Bool => "Bool",
        Dtype::Float8 => "Float8_e4m3fn",
        Dtype::Other => "Undefined",
    }
}
