//! Turning a job's dumps into one [`Trace`] for the analyzer.

use super::read::rank_from_file_name;
use super::{read_dump, FrDump, FrEntry, STATE_COMPLETED};
use crate::event::{Coll, Dtype, Event, Group, Member, Op, PgName, Phase, Rank, Trace};
use crate::import::ImportError;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Reads every dump in `dir` (not recursing) into one trace whose job is named after the
/// directory. Hidden files, subdirectories and files that are clearly something else (no rank
/// digits at the end of the name and no `.json`/`.pkl`/`.pickle` extension, like a README) are
/// skipped; any other file must be a good dump, and a bad one is an error naming it.
pub fn read_dir(dir: &Path) -> Result<Trace, ImportError> {
    let read_err = |source| ImportError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut paths = Vec::new();
    for item in std::fs::read_dir(dir).map_err(read_err)? {
        let path = item.map_err(read_err)?.path();
        if looks_like_dump(&path) {
            paths.push(path);
        }
    }
    paths.sort();
    let mut seen: BTreeMap<Rank, PathBuf> = BTreeMap::new();
    let mut dumps = Vec::with_capacity(paths.len());
    for path in paths {
        let dump = read_dump(&path)?;
        if let Some(first) = seen.get(&dump.rank) {
            return Err(ImportError::DuplicateRank {
                rank: dump.rank,
                first: first.clone(),
                second: path,
            });
        }
        seen.insert(dump.rank, path);
        dumps.push(dump);
    }
    if dumps.is_empty() {
        return Err(ImportError::EmptyDir {
            path: dir.to_path_buf(),
        });
    }
    let mut trace = to_trace(&dumps);
    if let Some(name) = dir.file_name().and_then(|n| n.to_str()) {
        trace.job = name.to_string();
    }
    Ok(trace)
}

fn looks_like_dump(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    if name.starts_with('.') || !path.is_file() {
        return false;
    }
    let dump_ext = [".json", ".pkl", ".pickle"]
        .iter()
        .any(|ext| name.ends_with(ext));
    dump_ext || rank_from_file_name(path).is_some()
}

/// Reduces dumps to events: a `Member` per dumped rank, a `Group` per process group, and per
/// entry a `Coll` `Enqueue` (at `time_created_ns`), `Start` (at `time_discovered_started_ns`, if
/// discovered) and `End` (if `completed`, see [`end_time`]). Collective events are ordered by
/// time, as the ranks lived them, so that the analyzer sees each seq completed while all its
/// members' records of it are still in its window, however long the buffers are.
///
/// **Groups are a name and a rank set.** `torch.distributed.split_group` and `new_group` give
/// every DP group the same name ("1"), every TP group another ("2"), and so on: `pg_config` is
/// keyed by name *within one dump*, and across dumps the same name stands for as many groups as
/// there are rank sets (FR's analyzer, `build_groups_memberships`, keys them by name plus
/// ranks for this reason). So a `Group` is emitted per distinct (name, ranks), and an entry's
/// group is found in its own rank's `pg_config`, never by name across ranks.
///
/// Ring-buffer wrap: each rank's buffer holds only its latest entries, and busy ranks lose
/// older ones sooner. So per process group (and separately for its point-to-point sequence) the
/// entries below the highest "oldest retained seq" of any rank are dropped: what remains is the
/// window every rank still remembers, and a rank is never judged missing an op it merely
/// forgot. This is FR's `align_trace_from_beginning`, on seq numbers instead of record ids
/// because record ids count every group's ops and do not line up across ranks.
///
/// `world` is every rank of every group plus the dumped ranks; `missing` the world's ranks
/// without a dump; `taken_ns` the latest time in any dump; `stuck` says the dump was taken at
/// a watchdog timeout, see [`taken_at_timeout`].
pub fn to_trace(dumps: &[FrDump]) -> Trace {
    // The first dump to describe a group wins; ranks agree on membership in a sane job.
    let mut groups: BTreeMap<(&str, &[Rank]), Group> = BTreeMap::new();
    for pg in dumps.iter().flat_map(|d| d.pg_config.values()) {
        groups
            .entry((pg.name.as_str(), pg.ranks.as_slice()))
            .or_insert_with(|| Group {
                name: Arc::from(pg.name.as_str()),
                desc: pg.desc.clone(),
                ranks: pg.ranks.clone(),
            });
    }
    let dumped: BTreeSet<Rank> = dumps.iter().map(|d| d.rank).collect();
    let world: BTreeSet<Rank> = groups
        .values()
        .flat_map(|g| g.ranks.iter().copied())
        .chain(dumped.iter().copied())
        .collect();
    // One past the highest global rank (not the count, in case a rank left no trace at all):
    // the analyzer refuses ranks at or above a declared world size.
    let world_size = world.last().map_or(0, |&r| r.saturating_add(1));

    let mut events: Vec<Event> = Vec::new();
    let mut by_rank: Vec<&FrDump> = dumps.iter().collect();
    by_rank.sort_by_key(|d| d.rank);
    events.extend(by_rank.iter().map(|d| {
        Event::Member(Member {
            rank: d.rank,
            world_size,
            host: String::new(),
            addr: String::new(),
            nic: String::new(),
            switch: String::new(),
            pid: 0,
        })
    }));
    events.extend(groups.values().cloned().map(Event::Group));
    let declarations = events.len();

    let floors = retained_floors(dumps);
    let mut names: HashMap<&str, PgName> = HashMap::new();
    let mut taken_ns = 0;
    let mut in_flight: Vec<(u64, u64)> = Vec::new();
    let mut shows_its_time = false;
    let mut timed = false;
    for dump in by_rank {
        let own = own_groups(dump);
        let batches = coalesced_batches(dump, &own);
        let shapes = batch_shapes(dump, &own, &batches);
        let mut batch_done: BTreeSet<SeqKey> = BTreeSet::new();
        for orig in &dump.entries {
            let group_ranks = own.get(orig.process_group.0.as_str()).copied();
            let key = seq_key(orig, group_ranks);
            let merged: FrEntry;
            let e = match batches.get(&key) {
                // The batch is one op at its seq: its first send or recv, in the state of
                // the entry that closed it. The closing entry and further ops of the batch
                // add nothing the analyzer can key apart (they share the seq).
                Some(_) if !batch_done.insert(key) => continue,
                // A closing entry whose batch's ops the ring buffer already lost stands for
                // the batch itself.
                Some(_) if is_batch_end(orig) => orig,
                Some(closing) => {
                    let (input_sizes, output_sizes) = shapes
                        .get(&key)
                        .cloned()
                        .unwrap_or_else(|| (orig.input_sizes.clone(), orig.output_sizes.clone()));
                    merged = FrEntry {
                        input_sizes,
                        output_sizes,
                        state: closing.state.clone(),
                        time_discovered_started_ns: closing.time_discovered_started_ns,
                        time_discovered_completed_ns: closing.time_discovered_completed_ns,
                        duration_ms: closing.duration_ms,
                        retired: closing.retired,
                        ..orig.clone()
                    };
                    &merged
                }
                _ => orig,
            };
            taken_ns = taken_ns
                .max(e.time_created_ns)
                .max(e.time_discovered_started_ns.unwrap_or(0))
                .max(e.time_discovered_completed_ns.unwrap_or(0));
            timed |= e.state == STATE_COMPLETED && e.duration_ms.is_some();
            if e.state != STATE_COMPLETED {
                in_flight.push((e.time_created_ns, e.timeout_ms));
                shows_its_time |= e.time_discovered_started_ns.is_some();
            }
            if floors.get(&key.0).is_some_and(|&floor| key.1 < floor) {
                continue;
            }
            let pg = names
                .entry(orig.process_group.0.as_str())
                .or_insert_with(|| Arc::from(e.process_group.0.as_str()))
                .clone();
            push_entry(&mut events, dump.rank, pg, group_ranks, e);
        }
    }
    events[declarations..].sort_by_key(|ev| match ev {
        Event::Coll(c) => c.t_ns,
        _ => 0,
    });

    Trace {
        job: "fr".to_string(),
        events,
        missing: world.difference(&dumped).copied().collect(),
        world: world.into_iter().collect(),
        taken_ns,
        stuck: taken_at_timeout(&in_flight, shows_its_time, taken_ns),
        timed,
    }
}

/// Whether the dumps were taken at a watchdog timeout, from what they hold: `in_flight` is
/// (`time_created_ns`, `timeout_ms`) of every entry not completed, `shows_its_time` whether any
/// of them was discovered started, `taken_ns` the latest time in any dump.
///
/// The watchdog dumps once an op has been in flight for its `timeout_ms`, and the dump itself
/// marks each started op as discovered (`dump_entries` queries the events of what is still in
/// flight), so the latest time in a timeout dump lies a timeout past the oldest op in flight.
/// A dump taken on demand (`_dump_nccl_trace`, the control-plane handler) catches ops in flight
/// too, a pipeline's pending receives among them, but none that old: those are not stuck, and
/// the analyzer judges them by their idle time as it would live. When no op in flight was
/// discovered started, the dump does not show when it was taken, and it is read as a timeout
/// dump, which is why PyTorch writes one.
fn taken_at_timeout(in_flight: &[(u64, u64)], shows_its_time: bool, taken_ns: u64) -> bool {
    if in_flight.is_empty() {
        return false;
    }
    if !shows_its_time {
        return true;
    }
    // A tenth of slack for clocks: `taken_ns` may come from another rank's host.
    in_flight.iter().any(|&(created, timeout_ms)| {
        timeout_ms == 0 || taken_ns.saturating_sub(created) >= timeout_ms.saturating_mul(900_000)
    })
}

/// A rank's coalesced batches (`batch_isend_irecv`, `_coalescing_manager` around collectives
/// as FSDP and DDP use it): per sequence key, the `nccl:coalesced` entry that closed it.
/// `startCoalescing` bumps the sequence once, so PyTorch numbers a batch's ops and its closing
/// entry with one `p2p_seq_id` (a p2p batch) or `collective_seq_id` (a batch of collectives),
/// and records the ops themselves without CUDA events: they stay "scheduled" for good, and
/// only the closing entry's state says whether the batch ran. Read naively, every healthy
/// pipeline or FSDP job looks hung in every batch.
fn coalesced_batches<'a>(
    dump: &'a FrDump,
    own: &HashMap<&'a str, &'a [Rank]>,
) -> HashMap<SeqKey<'a>, &'a FrEntry> {
    dump.entries
        .iter()
        .filter(|e| is_batch_end(e))
        .map(|e| (seq_key(e, own.get(e.process_group.0.as_str()).copied()), e))
        .collect()
}

/// Per batch of collectives (not point-to-point), the input and output shapes of all its ops
/// in order. Every member of a coalesced reduce_scatter or all_gather must pass tensors of the
/// same shapes (NCCL does not check; a rank whose last tensor differs leaves the others
/// waiting), so the batch is compared on all of them, not on its first op alone. A
/// point-to-point batch's sends and receives differ by rank and are left as they are.
#[allow(clippy::type_complexity)]
fn batch_shapes<'a>(
    dump: &'a FrDump,
    own: &HashMap<&'a str, &'a [Rank]>,
    batches: &HashMap<SeqKey<'a>, &'a FrEntry>,
) -> HashMap<SeqKey<'a>, (Vec<Vec<i64>>, Vec<Vec<i64>>)> {
    let mut out: HashMap<SeqKey<'a>, (Vec<Vec<i64>>, Vec<Vec<i64>>)> = HashMap::new();
    for e in dump
        .entries
        .iter()
        .filter(|e| !is_batch_end(e) && !is_p2p(e))
    {
        let key = seq_key(e, own.get(e.process_group.0.as_str()).copied());
        if batches.contains_key(&key) {
            let s = out.entry(key).or_default();
            s.0.extend(e.input_sizes.iter().cloned());
            s.1.extend(e.output_sizes.iter().cloned());
        }
    }
    out
}

/// The entry `endCoalescing` records (`nccl:coalesced`), as opposed to a single op that works
/// on many tensors (`nccl:all_gather_into_tensor_coalesced`), which has events of its own.
fn is_batch_end(e: &FrEntry) -> bool {
    let name = e.profiling_name.as_str();
    name.split_once(':').map_or(name, |(_, op)| op) == "coalesced"
}

/// A rank's groups by the name its entries use (its `pg_config` is keyed by name).
fn own_groups(dump: &FrDump) -> HashMap<&str, &[Rank]> {
    dump.pg_config
        .values()
        .map(|pg| (pg.name.as_str(), pg.ranks.as_slice()))
        .collect()
}

/// The sequence an entry belongs to, ((group name, group ranks if known, point-to-point)), and
/// its place in it.
type SeqKey<'a> = ((&'a str, Option<&'a [Rank]>, bool), u64);

fn seq_key<'a>(e: &'a FrEntry, group: Option<&'a [Rank]>) -> SeqKey<'a> {
    let p2p = is_p2p(e);
    let seq = if p2p {
        e.p2p_seq_id
    } else {
        e.collective_seq_id
    };
    ((e.process_group.0.as_str(), group, p2p), seq)
}

fn is_p2p(e: &FrEntry) -> bool {
    e.is_p2p || Op::parse(&e.profiling_name).is_p2p()
}

/// Per sequence: the highest over ranks of each rank's lowest retained seq.
fn retained_floors(dumps: &[FrDump]) -> HashMap<(&str, Option<&[Rank]>, bool), u64> {
    let mut floors: HashMap<(&str, Option<&[Rank]>, bool), u64> = HashMap::new();
    for dump in dumps {
        let own = own_groups(dump);
        let mut lowest: HashMap<(&str, Option<&[Rank]>, bool), u64> = HashMap::new();
        for e in &dump.entries {
            let (key, seq) = seq_key(e, own.get(e.process_group.0.as_str()).copied());
            let low = lowest.entry(key).or_insert(seq);
            *low = (*low).min(seq);
        }
        for (key, low) in lowest {
            let floor = floors.entry(key).or_insert(low);
            *floor = (*floor).max(low);
        }
    }
    floors
}

fn push_entry(
    events: &mut Vec<Event>,
    rank: Rank,
    pg: PgName,
    group: Option<&[Rank]>,
    e: &FrEntry,
) {
    let op = Op::parse(&e.profiling_name);
    let (_, seq) = seq_key(e, group);
    let peer = if is_p2p(e) {
        p2p_peer(&e.profiling_name).and_then(|g| to_global(group, g))
    } else {
        None
    };
    let dtype = entry_dtype(e);
    let count = numel(&e.input_sizes);
    let coll = |phase, t_ns| {
        Event::Coll(Coll {
            rank,
            pg: pg.clone(),
            seq,
            op,
            dtype,
            count,
            bytes: count.saturating_mul(dtype.size()),
            out_count: numel(&e.output_sizes),
            peer,
            phase,
            t_ns,
        })
    };
    events.push(coll(Phase::Enqueue, e.time_created_ns));
    if let Some(t) = e.time_discovered_started_ns {
        // An op still in flight was discovered started by the dump itself: its start lies
        // somewhere since its creation, and stamping it at the dump would read as progress
        // made just then.
        let t = if e.state == STATE_COMPLETED {
            t
        } else {
            e.time_created_ns.min(t)
        };
        events.push(coll(Phase::Start, t));
    }
    if e.state == STATE_COMPLETED {
        events.push(coll(Phase::End, end_time(e)));
    }
}

/// When a completed op ended on its rank. With `TORCH_NCCL_ENABLE_TIMING`, `duration_ms` is the
/// GPU time between the op's start event, which fires when the rank's stream reaches the op
/// (the rank arrives), and its end event: creation plus duration is then the end as the rank
/// lived it, waiting for late peers included. The watchdog's discovery time is only an upper
/// bound, late by up to a polling period (100 ms), which would drown a compute straggler's
/// lateness; it is used when there is no duration, and caps one that disagrees with it.
fn end_time(e: &FrEntry) -> u64 {
    let discovered = e
        .time_discovered_completed_ns
        .or(e.time_discovered_started_ns);
    let timed = e
        .duration_ms
        .filter(|d| d.is_finite() && *d >= 0.0)
        .map(|d| e.time_created_ns.saturating_add((d * 1e6).round() as u64));
    match (timed, discovered) {
        (Some(t), Some(d)) => t.min(d),
        (Some(t), None) => t,
        (None, Some(d)) => d,
        (None, None) => e.time_created_ns,
    }
}

/// The entry's element type. A rank whose own input and output dtypes differ disagrees with
/// itself, which FR's matcher counts as a dtype mismatch: it is given [`Dtype::Other`], so it
/// stands apart from ranks whose tensors are all of one type.
fn entry_dtype(e: &FrEntry) -> Dtype {
    let first = e.input_dtypes.first().or(e.output_dtypes.first());
    let Some(first) = first else {
        return Dtype::Other;
    };
    let uniform = e
        .input_dtypes
        .iter()
        .chain(&e.output_dtypes)
        .all(|d| d == first);
    if uniform {
        Dtype::parse(first)
    } else {
        Dtype::Other
    }
}

/// Elements over all input tensors (a shape with no dims is a scalar: one element).
fn numel(sizes: &[Vec<i64>]) -> u64 {
    sizes
        .iter()
        .map(|dims| {
            dims.iter()
                .map(|&d| u64::try_from(d).unwrap_or(0))
                .fold(1u64, u64::saturating_mul)
        })
        .fold(0u64, u64::saturating_add)
}

/// The peer's group rank in `nccl:send 1->2` (self 1, peer 2) or `nccl:recv 3<-0` (self 3,
/// peer 0), as `ProcessGroupNCCL` names point-to-point ops.
pub(crate) fn p2p_peer(profiling_name: &str) -> Option<Rank> {
    let pair = profiling_name.split_whitespace().next_back()?;
    let (_, peer) = pair.split_once("->").or_else(|| pair.split_once("<-"))?;
    peer.trim().parse().ok()
}

/// A group rank's global rank; a group whose members are unknown is taken as the world.
fn to_global(group: Option<&[Rank]>, group_rank: Rank) -> Option<Rank> {
    match group {
        Some(ranks) if !ranks.is_empty() => ranks.get(usize::try_from(group_rank).ok()?).copied(),
        _ => Some(group_rank),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_is_the_second_rank_of_the_profiling_name() {
        assert_eq!(p2p_peer("nccl:send 1->2"), Some(2));
        assert_eq!(p2p_peer("nccl:recv 3<-0"), Some(0));
        assert_eq!(p2p_peer("nccl:all_reduce"), None);
        assert_eq!(p2p_peer("nccl:send x->y"), None);
    }

    #[test]
    fn numel_multiplies_dims_and_sums_tensors() {
        assert_eq!(numel(&[vec![2, 3], vec![4]]), 10);
        assert_eq!(numel(&[vec![]]), 1);
        assert_eq!(numel(&[]), 0);
        assert_eq!(numel(&[vec![-1, 5]]), 0);
    }

    fn timed(created: u64, duration_ms: Option<f64>, discovered: Option<u64>) -> FrEntry {
        FrEntry {
            time_created_ns: created,
            duration_ms,
            time_discovered_completed_ns: discovered,
            state: STATE_COMPLETED.into(),
            ..FrEntry::default()
        }
    }

    #[test]
    fn an_op_ends_at_its_creation_plus_its_gpu_duration_capped_by_its_discovery() {
        assert_eq!(end_time(&timed(1_000, Some(0.5), Some(900_000))), 501_000);
        assert_eq!(end_time(&timed(1_000, Some(5.0), Some(900_000))), 900_000);
        assert_eq!(end_time(&timed(1_000, None, Some(900_000))), 900_000);
        assert_eq!(end_time(&timed(1_000, Some(f64::NAN), None)), 1_000);
    }

    #[test]
    fn a_rank_whose_tensors_disagree_in_dtype_has_dtype_other() {
        let e = |inputs: &[&str], outputs: &[&str]| FrEntry {
            input_dtypes: inputs.iter().map(|d| d.to_string()).collect(),
            output_dtypes: outputs.iter().map(|d| d.to_string()).collect(),
            ..FrEntry::default()
        };
        assert_eq!(
            entry_dtype(&e(&["BFloat16"], &["BFloat16"])),
            Dtype::BFloat16
        );
        assert_eq!(entry_dtype(&e(&["Float"], &["BFloat16"])), Dtype::Other);
        assert_eq!(entry_dtype(&e(&[], &["Half"])), Dtype::Float16);
        assert_eq!(entry_dtype(&e(&[], &[])), Dtype::Other);
    }

    #[test]
    fn group_ranks_map_to_global_ranks() {
        assert_eq!(to_global(Some(&[4, 5, 6]), 2), Some(6));
        assert_eq!(to_global(Some(&[4, 5, 6]), 3), None);
        assert_eq!(to_global(None, 3), Some(3));
    }
}
