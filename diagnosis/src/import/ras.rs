//! NCCL RAS reports: what `ncclras` (or `echo verbose status | nc localhost 28028`) prints, in
//! its text form or its JSON form (`ncclras -f json`, NCCL ≥ 2.28.7).
//!
//! RAS knows, per communicator rank, how many collectives of each type the rank has *launched*,
//! and which ranks it could not reach. It knows no times. So a report reduces to:
//! - one `Group` per communicator, named by its hash as printed (`desc` is the text form's
//!   `#<group>-<index>` label); its ranks are global ranks where they can be told, see below;
//! - per reporting rank with `c` launches in total (summed over op types): a `Coll` `Enqueue`
//!   of seq `c` and an `End` of seq `c − 1`, all at the report's time. The op is the type whose
//!   counts differ between ranks, else the most launched type;
//! - missing ranks (unreachable, dead, or listed as missing) in `Trace::missing`.
//!
//! **Global ranks.** RAS prints communicator ranks only. The largest communicator (normally
//! the world) defines global ranks; a rank of another communicator is mapped through its
//! process (host, pid, device), which the JSON form always prints and the text form prints for
//! outliers. A rank that cannot be mapped keeps its communicator rank.
//!
//! **The text form's counts.** The text form prints counts only for op types whose counts
//! disagree, and lists ranks only for small (outlier) groups; the unlisted ranks take the one
//! unlisted group's count. Seqs from text are thus offsets that are only comparable between
//! ranks of one communicator, which is all the analyzer compares.
//!
//! **Stuck.** One RAS snapshot cannot tell slow progress from a hang: counts that disagree are
//! normal while collectives run, and only counts frozen across repeated queries mean a hang.
//! RAS is queried when a job is suspected stuck, so the trace is marked `stuck`, and the
//! importer adds nothing beyond what the report says. (A file holding several JSON snapshots
//! is read as its last one.)

use crate::event::{Coll, Dtype, Event, Group, Member, Op, Phase, Rank, Trace};
use crate::import::ImportError;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

/// Reads a RAS report, text or JSON (told apart by a leading `{`), into a trace.
pub fn read_ras(path: &Path) -> Result<Trace, ImportError> {
    let bytes = std::fs::read(path).map_err(|source| ImportError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let text = String::from_utf8(bytes).map_err(|_| ImportError::UnknownFormat {
        path: path.to_path_buf(),
    })?;
    let report = if text.trim_start().starts_with('{') {
        parse_json(path, &text)?
    } else {
        parse_text(path, &text)?
    };
    Ok(report.into_trace(path))
}

/// What both forms reduce to before becoming events.
#[derive(Debug, Default)]
struct Report {
    comms: Vec<Comm>,
    /// Processes RAS reported dead or unreachable, as (host, pid).
    lost_processes: BTreeSet<(String, u32)>,
    taken_ns: u64,
}

#[derive(Debug, Default)]
struct Comm {
    name: String,
    desc: String,
    /// Communicator size; 0 if the report did not say.
    size: u32,
    ranks: BTreeMap<Rank, RankInfo>,
    missing: BTreeSet<Rank>,
    /// Op types whose counts disagree between ranks.
    mismatched: BTreeSet<String>,
}

#[derive(Debug, Default, Clone)]
struct RankInfo {
    /// (host, pid, device) when printed.
    process: Option<(String, u32, i64)>,
    /// Launches per NCCL op type name ("AllReduce", …).
    counts: BTreeMap<String, u64>,
}

impl Report {
    fn into_trace(self, path: &Path) -> Trace {
        let global = GlobalRanks::new(&self.comms);
        let mut events = Vec::new();
        let mut world = BTreeSet::new();
        let mut missing = BTreeSet::new();
        let mut members: BTreeMap<Rank, Member> = BTreeMap::new();
        let mut colls = Vec::new();
        for (idx, comm) in self.comms.iter().enumerate() {
            let to_global = |r: Rank| global.of(idx, comm, r);
            let size = comm.size.max(
                comm.ranks
                    .keys()
                    .chain(&comm.missing)
                    .map(|r| r + 1)
                    .max()
                    .unwrap_or(0),
            );
            let ranks: Vec<Rank> = (0..size).map(to_global).collect();
            world.extend(ranks.iter().copied());
            missing.extend(comm.missing.iter().map(|&r| to_global(r)));
            let pg: Arc<str> = Arc::from(comm.name.as_str());
            events.push(Event::Group(Group {
                name: pg.clone(),
                desc: comm.desc.clone(),
                ranks,
            }));
            let op = comm_op(comm);
            for (&r, info) in &comm.ranks {
                let rank = to_global(r);
                if let Some((host, pid, _)) = &info.process {
                    if self.lost_processes.contains(&(host.clone(), *pid)) {
                        missing.insert(rank);
                        continue;
                    }
                }
                members.entry(rank).or_insert_with(|| member(rank, info));
                let c: u64 = info.counts.values().sum();
                let coll = |seq, phase| {
                    Event::Coll(Coll {
                        rank,
                        pg: pg.clone(),
                        seq,
                        op,
                        dtype: Dtype::Other,
                        count: 0,
                        bytes: 0,
                        out_count: 0,
                        peer: None,
                        phase,
                        t_ns: self.taken_ns,
                    })
                };
                if c >= 2 {
                    colls.push(coll(c - 1, Phase::End));
                }
                if c >= 1 {
                    colls.push(coll(c, Phase::Enqueue));
                }
            }
        }
        // One past the highest global rank (not the count, in case a rank left no trace at all):
        // the analyzer refuses ranks at or above a declared world size.
        let world_size = world.last().map_or(0, |&r| r.saturating_add(1));
        let mut head: Vec<Event> = members
            .into_values()
            .filter(|m| !missing.contains(&m.rank))
            .map(|m| Event::Member(Member { world_size, ..m }))
            .collect();
        head.append(&mut events);
        head.append(&mut colls);
        Trace {
            job: path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("ras")
                .to_string(),
            events: head,
            world: world.into_iter().collect(),
            missing: missing.into_iter().collect(),
            taken_ns: self.taken_ns,
            stuck: true,
            timed: false,
        }
    }
}

fn member(rank: Rank, info: &RankInfo) -> Member {
    let (host, pid) = info
        .process
        .as_ref()
        .map_or((String::new(), 0), |(h, p, _)| (h.clone(), *p));
    Member {
        rank,
        world_size: 0,
        host,
        addr: String::new(),
        nic: String::new(),
        switch: String::new(),
        pid,
    }
}

/// The op type whose counts disagree, else the one launched most.
fn comm_op(comm: &Comm) -> Op {
    if let Some(name) = comm.mismatched.iter().next() {
        return nccl_op(name);
    }
    let mut totals: BTreeMap<&str, u64> = BTreeMap::new();
    for info in comm.ranks.values() {
        for (name, n) in &info.counts {
            *totals.entry(name).or_default() += n;
        }
    }
    totals
        .into_iter()
        .filter(|&(_, n)| n > 0)
        .max_by_key(|&(_, n)| n)
        .map_or(Op::Other, |(name, _)| nccl_op(name))
}

/// NCCL's op type names are CamelCase ("AllReduce"); ours are snake_case.
fn nccl_op(name: &str) -> Op {
    let mut snake = String::new();
    for (i, ch) in name.chars().enumerate() {
        if ch.is_ascii_uppercase() && i > 0 {
            snake.push('_');
        }
        snake.push(ch.to_ascii_lowercase());
    }
    Op::parse(&snake)
}

/// Communicator rank → global rank (see the module docs).
struct GlobalRanks {
    world_comm: Option<usize>,
    by_process: HashMap<(String, u32, i64), Rank>,
}

impl GlobalRanks {
    fn new(comms: &[Comm]) -> Self {
        let world_comm = comms
            .iter()
            .enumerate()
            .max_by_key(|(i, c)| (c.size.max(c.ranks.len() as u32), std::cmp::Reverse(*i)))
            .map(|(i, _)| i);
        let by_process = world_comm
            .map(|i| {
                comms[i]
                    .ranks
                    .iter()
                    .filter_map(|(&r, info)| info.process.clone().map(|p| (p, r)))
                    .collect()
            })
            .unwrap_or_default();
        GlobalRanks {
            world_comm,
            by_process,
        }
    }

    /// `comm` is the communicator at index `idx` of the report.
    fn of(&self, idx: usize, comm: &Comm, comm_rank: Rank) -> Rank {
        if self.world_comm == Some(idx) {
            return comm_rank;
        }
        comm.ranks
            .get(&comm_rank)
            .and_then(|info| info.process.as_ref())
            .and_then(|p| self.by_process.get(p).copied())
            .unwrap_or(comm_rank)
    }
}

// ---------------------------------------------------------------------------------------------
// JSON form

#[derive(Deserialize)]
struct JsonDoc {
    #[serde(default)]
    timestamp: String,
    #[serde(default)]
    communicators: Vec<JsonComm>,
}

#[derive(Deserialize)]
struct JsonComm {
    hash: String,
    #[serde(default)]
    size: u32,
    #[serde(default)]
    ranks: Vec<JsonRank>,
    #[serde(default)]
    missing_ranks: Vec<JsonRank>,
}

#[derive(Deserialize)]
struct JsonRank {
    rank: Rank,
    #[serde(default)]
    host: String,
    #[serde(default)]
    pid: u32,
    #[serde(default)]
    nvml_dev: i64,
    #[serde(default)]
    collective_counts: BTreeMap<String, u64>,
}

fn parse_json(path: &Path, text: &str) -> Result<Report, ImportError> {
    let json_err = |e: serde_json::Error| ImportError::Json {
        path: path.to_path_buf(),
        detail: e.to_string(),
    };
    let mut last = None;
    for doc in serde_json::Deserializer::from_str(text).into_iter::<JsonDoc>() {
        last = Some(doc.map_err(json_err)?);
    }
    let doc = last.ok_or_else(|| ImportError::Json {
        path: path.to_path_buf(),
        detail: "no document".into(),
    })?;
    let taken_ns = parse_timestamp(&doc.timestamp).unwrap_or(0);
    let comms = doc
        .communicators
        .into_iter()
        .map(|c| {
            let mut comm = Comm {
                desc: String::new(),
                size: c.size,
                ..Comm::default()
            };
            for r in c.ranks {
                comm.ranks.insert(
                    r.rank,
                    RankInfo {
                        process: Some((r.host, r.pid, r.nvml_dev)),
                        counts: r.collective_counts,
                    },
                );
            }
            comm.missing = c.missing_ranks.iter().map(|r| r.rank).collect();
            comm.mismatched = mismatched_ops(&comm.ranks);
            comm.name = c.hash;
            comm
        })
        .collect();
    Ok(Report {
        comms,
        lost_processes: BTreeSet::new(),
        taken_ns,
    })
}

fn mismatched_ops(ranks: &BTreeMap<Rank, RankInfo>) -> BTreeSet<String> {
    let mut seen: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
    for info in ranks.values() {
        for (name, &n) in &info.counts {
            seen.entry(name).or_default().insert(n);
        }
    }
    seen.into_iter()
        .filter(|(_, values)| values.len() > 1)
        .map(|(name, _)| name.to_string())
        .collect()
}

/// "2025-12-19 13:06:53" (the RAS host's clock, taken as UTC) → ns since the epoch.
fn parse_timestamp(s: &str) -> Option<u64> {
    let (date, time) = s.trim().split_once(' ')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.split(':').map(|x| x.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return None;
    }
    // Days from 1970-01-01 to y-m-d in the proleptic Gregorian calendar.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hh * 3600 + mm * 60 + ss;
    u64::try_from(secs).ok()?.checked_mul(1_000_000_000)
}

// ---------------------------------------------------------------------------------------------
// Text form

/// The count group a rank line belongs to, inside a "different … operation counts" section.
#[derive(Debug)]
struct CountGroup {
    value: u64,
    size: usize,
    listed: Vec<Rank>,
}

#[derive(Debug, Default)]
struct TextState {
    /// Ranks per communicator, by summary-table group number.
    comm_sizes: HashMap<u32, u32>,
    current: Option<usize>,
    /// The op type and count groups of the section being read.
    section: Option<(String, Vec<CountGroup>)>,
    in_incomplete: bool,
    /// Inside a job-level DEAD or INCOMPLETE block listing processes.
    in_lost_processes: bool,
}

fn parse_text(path: &Path, text: &str) -> Result<Report, ImportError> {
    let mut report = Report::default();
    let mut st = TextState::default();
    let mut saw_anything = false;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        let bad = |detail: &str| ImportError::RasLine {
            path: path.to_path_buf(),
            line: i + 1,
            detail: detail.to_string(),
        };
        if line.is_empty() {
            close_section(&mut report, &mut st);
            st.in_lost_processes = false;
            continue;
        }
        if let Some(row) = summary_row(line) {
            st.comm_sizes.insert(row.0, row.1);
            saw_anything = true;
            continue;
        }
        // A communicator label, "#0-1 (hash) KIND" (the table header's "#" is not one).
        if line.starts_with('#') && line[1..].starts_with(|c: char| c.is_ascii_digit()) {
            close_section(&mut report, &mut st);
            let (label, rest) = line
                .split_once(' ')
                .ok_or_else(|| bad("no hash after label"))?;
            let hash = rest
                .trim()
                .strip_prefix('(')
                .and_then(|r| r.split_once(')'))
                .map(|(h, _)| h.to_string())
                .ok_or_else(|| bad("no (hash) after the communicator label"))?;
            let group = label
                .trim_start_matches('#')
                .split('-')
                .next()
                .and_then(|g| g.parse::<u32>().ok())
                .ok_or_else(|| bad("the communicator label is not #<group>-<index>"))?;
            let idx = match report.comms.iter().position(|c| c.desc == label) {
                Some(idx) => idx,
                None => {
                    report.comms.push(Comm {
                        name: hash,
                        desc: label.to_string(),
                        size: st.comm_sizes.get(&group).copied().unwrap_or(0),
                        ..Comm::default()
                    });
                    report.comms.len() - 1
                }
            };
            st.current = Some(idx);
            st.in_incomplete = rest.contains("INCOMPLETE");
            saw_anything = true;
            continue;
        }
        if line == "DEAD" || line == "INCOMPLETE" {
            st.current = None;
            st.in_lost_processes = true;
            saw_anything = true;
            continue;
        }
        if st.in_lost_processes {
            if let Some((pid, host)) = process_on_node(line) {
                report.lost_processes.insert((host, pid));
            }
            continue;
        }
        let Some(ci) = st.current else { continue };
        if let Some(op) = line
            .strip_prefix("Communicator ranks have different ")
            .and_then(|r| r.strip_suffix(" operation counts"))
        {
            close_section(&mut report, &mut st);
            st.section = Some((op.to_string(), Vec::new()));
            continue;
        }
        if let Some(rest) = line.strip_prefix("The missing rank") {
            let list = rest.split_once(':').map_or("", |(_, l)| l);
            for r in list
                .split(',')
                .filter_map(|x| x.trim().parse::<Rank>().ok())
            {
                report.comms[ci].missing.insert(r);
            }
            continue;
        }
        if let Some((n, value)) = group_line(line) {
            if let Some((_, groups)) = st.section.as_mut() {
                groups.push(CountGroup {
                    value,
                    size: n,
                    listed: Vec::new(),
                });
            }
            continue;
        }
        if let Some(rank_line) = parse_rank_line(line) {
            let comm = &mut report.comms[ci];
            let info = comm.ranks.entry(rank_line.rank).or_default();
            if rank_line.process.is_some() {
                info.process = rank_line.process;
            }
            if st.in_incomplete && st.section.is_none() {
                comm.missing.insert(rank_line.rank);
                comm.ranks.remove(&rank_line.rank);
            } else if let Some((_, groups)) = st.section.as_mut() {
                match rank_line.value {
                    // A single outlier prints its own count.
                    Some(value) => groups.push(CountGroup {
                        value,
                        size: 1,
                        listed: vec![rank_line.rank],
                    }),
                    None => {
                        if let Some(g) = groups.last_mut() {
                            g.listed.push(rank_line.rank);
                        }
                    }
                }
            }
        }
    }
    close_section(&mut report, &mut st);
    if !saw_anything {
        return Err(ImportError::UnknownFormat {
            path: path.to_path_buf(),
        });
    }
    for comm in &mut report.comms {
        // A missing rank holds no counts.
        for r in &comm.missing {
            comm.ranks.remove(r);
        }
    }
    Ok(report)
}

/// Ends a "different … operation counts" section: listed ranks take their group's count, the
/// unlisted ranks the one group whose members were not all listed.
fn close_section(report: &mut Report, st: &mut TextState) {
    let (Some((op, groups)), Some(ci)) = (st.section.take(), st.current) else {
        return;
    };
    let comm = &mut report.comms[ci];
    comm.mismatched.insert(op.clone());
    let listed: BTreeSet<Rank> = groups
        .iter()
        .flat_map(|g| g.listed.iter().copied())
        .collect();
    for g in &groups {
        for &r in &g.listed {
            comm.ranks
                .entry(r)
                .or_default()
                .counts
                .insert(op.clone(), g.value);
        }
    }
    let open: Vec<&CountGroup> = groups.iter().filter(|g| g.listed.len() < g.size).collect();
    if let [rest] = open[..] {
        for r in (0..comm.size).filter(|r| !listed.contains(r) && !comm.missing.contains(r)) {
            comm.ranks
                .entry(r)
                .or_default()
                .counts
                .insert(op.clone(), rest.value);
        }
    }
}

/// A summary table row: `group comms nodes ranks/node ranks/comm ranks/group status errors`.
fn summary_row(line: &str) -> Option<(u32, u32)> {
    let cols: Vec<&str> = line.split_whitespace().collect();
    if cols.len() != 8 || !cols[6].chars().all(|c| c.is_ascii_uppercase()) {
        return None;
    }
    Some((cols[0].parse().ok()?, cols[4].parse().ok()?))
}

/// "26 ranks have launched up to operation 6650" / "6 ranks have not launched any operations".
fn group_line(line: &str) -> Option<(usize, u64)> {
    let (n, rest) = line.split_once(" ranks have ")?;
    let n = n.parse().ok()?;
    if rest.starts_with("not launched any operations") {
        return Some((n, 0));
    }
    let value = rest
        .strip_prefix("launched up to operation ")?
        .trim()
        .parse()
        .ok()?;
    Some((n, value))
}

struct RankLine {
    rank: Rank,
    /// The count of a single-rank group ("Rank 5 has launched up to operation 6649 -- …").
    value: Option<u64>,
    process: Option<(String, u32, i64)>,
}

/// "Rank 5 -- GPU 5 managed by process 483077 on node 172.16.64.210", optionally with
/// "has launched up to operation N" or "has not launched any operations" before the dashes.
fn parse_rank_line(line: &str) -> Option<RankLine> {
    let rest = line.strip_prefix("Rank ")?;
    let (head, tail) = rest.split_once(" -- ").unwrap_or((rest, ""));
    let (rank, what) = head.split_once(' ').unwrap_or((head, ""));
    let rank = rank.parse().ok()?;
    let value = if what.starts_with("has not launched") {
        Some(0)
    } else if let Some(v) = what.strip_prefix("has launched up to operation ") {
        Some(v.trim().parse().ok()?)
    } else if what.is_empty() {
        None
    } else {
        // "Rank 3 has status …" and other per-rank notes carry no count.
        return None;
    };
    Some(RankLine {
        rank,
        value,
        process: gpu_process(tail),
    })
}

/// "GPU 5 managed by process 483077 on node 172.16.64.210" → (host, pid, device).
fn gpu_process(s: &str) -> Option<(String, u32, i64)> {
    let rest = s.strip_prefix("GPU ")?;
    let (dev, rest) = rest.split_once(" managed by process ")?;
    let (pid, host) = rest.split_once(" on node ")?;
    let dev = dev.split_whitespace().next()?.parse().ok()?;
    Some((host.trim().to_string(), pid.trim().parse().ok()?, dev))
}

/// "Process 3487984 on node 172.16.64.213 managing GPU 5" → (pid, host).
fn process_on_node(line: &str) -> Option<(u32, String)> {
    let rest = line.strip_prefix("Process ")?;
    let (pid, rest) = rest.split_once(" on node ")?;
    let host = rest.split_whitespace().next()?;
    Some((pid.trim().parse().ok()?, host.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_op_names_map_to_ours() {
        assert_eq!(nccl_op("AllReduce"), Op::AllReduce);
        assert_eq!(nccl_op("ReduceScatter"), Op::ReduceScatter);
        assert_eq!(nccl_op("Broadcast"), Op::Broadcast);
        assert_eq!(nccl_op("SendRecv"), Op::Other);
    }

    #[test]
    fn timestamps_are_utc_nanoseconds() {
        assert_eq!(parse_timestamp("1970-01-01 00:00:01"), Some(1_000_000_000));
        assert_eq!(
            parse_timestamp("2025-12-19 13:06:53"),
            Some(1_766_149_613_000_000_000)
        );
        assert_eq!(parse_timestamp("yesterday"), None);
    }

    #[test]
    fn rank_lines_parse_in_all_printed_shapes() {
        let l =
            parse_rank_line("Rank 5 -- GPU 5 managed by process 483077 on node 10.0.0.1").unwrap();
        assert_eq!((l.rank, l.value), (5, None));
        assert_eq!(l.process, Some(("10.0.0.1".into(), 483077, 5)));
        let l = parse_rank_line(
            "Rank 7 has launched up to operation 6649 -- GPU 7 managed by process 9 on node h",
        )
        .unwrap();
        assert_eq!((l.rank, l.value), (7, Some(6649)));
        let l = parse_rank_line(
            "Rank 2 has not launched any operations -- [process information not found]",
        )
        .unwrap();
        assert_eq!((l.rank, l.value, l.process), (2, Some(0), None));
        assert!(parse_rank_line(
            "Rank 3 has status RUNNING -- GPU 3 managed by process 1 on node h"
        )
        .is_none());
    }
}
