//! `yard agg …`: aggregation jobs (create, join, list, show, delete) and a node's aggregator.

use std::net::SocketAddrV4;
use std::process::ExitCode;

use anyhow::bail;
use clap::Subcommand;
use serde_json::{json, Value};
use yard::client::AdminClient;
use yard::rpc::{AdminReply, AdminRequest, AggJobRow, AggRequest};
use yard_agg::wire::Dtype;
use yard_raft_store::aggregation::Grouping;

use super::output::Out;

#[derive(Debug, Subcommand)]
pub enum AggCmd {
    /// Aggregation jobs.
    Job {
        #[command(subcommand)]
        cmd: JobCmd,
    },
    /// The contacted node's aggregator: jobs served, memory, counters.
    Stats,
}

#[derive(Debug, Subcommand)]
pub enum JobCmd {
    /// Create a job; it runs once every worker has joined and the leader has placed it.
    Create {
        name: String,
        /// Workers (ranks 0..N): up to 64 on one aggregator (flat, ps), up to 4032 as a tree
        /// (auto: at most 64 members on each aggregator) or a ring.
        #[arg(long)]
        workers: u16,
        /// Bytes of one worker's gradient (4 per value).
        #[arg(long)]
        size: u64,
        #[arg(long, default_value = "f32")]
        dtype: Dtype,
        /// Go on without a worker that dies (otherwise the job fails, naming it).
        #[arg(long)]
        elastic: bool,
        /// The smallest IPv4 MTU between workers and aggregators (jumbo frames: 9000).
        #[arg(long, default_value_t = 1500)]
        mtu: u32,
        /// Allow the aggregator to be a worker's own host.
        #[arg(long)]
        colocate: bool,
        /// auto: a tree of aggregators sized to the measured bandwidths (ALEPH); flat: one
        /// aggregator chosen by CPU load; ps: one aggregator, the one the bandwidths favour;
        /// ring: no aggregator, the workers all-reduce among themselves.
        #[arg(long, default_value = "auto", value_parser = Grouping::parse)]
        grouping: Grouping,
    },
    /// Register a worker: rank RANK of NAME sends from ADDR (the worker's bound socket).
    Join {
        name: String,
        #[arg(long)]
        rank: u16,
        #[arg(long)]
        addr: SocketAddrV4,
    },
    /// Every job.
    List,
    /// One job: shape, epoch, members, aggregator.
    Show { name: String },
    /// Delete a job; its aggregator frees the memory.
    Delete { name: String },
}

pub async fn run(client: &AdminClient, cmd: &AggCmd, out: Out) -> anyhow::Result<ExitCode> {
    let req = match cmd {
        AggCmd::Stats => AggRequest::Stats,
        AggCmd::Job { cmd } => match cmd {
            JobCmd::Create {
                name,
                workers,
                size,
                dtype,
                elastic,
                mtu,
                colocate,
                grouping,
            } => {
                if *size == 0 || size % 4 != 0 {
                    bail!("--size is the gradient's bytes, a positive multiple of 4, not {size}");
                }
                let Ok(values) = u32::try_from(size / 4) else {
                    bail!("--size {size} is more than a job can sum (2^32 values)");
                };
                AggRequest::Create {
                    name: name.clone(),
                    workers: *workers,
                    values,
                    dtype: *dtype as u8,
                    elastic: *elastic,
                    mtu: *mtu,
                    colocate: *colocate,
                    grouping: *grouping,
                }
            }
            JobCmd::Join { name, rank, addr } => AggRequest::Join {
                name: name.clone(),
                rank: *rank,
                addr: *addr,
            },
            JobCmd::List => AggRequest::List,
            JobCmd::Show { name } => AggRequest::Show { name: name.clone() },
            JobCmd::Delete { name } => AggRequest::Delete { name: name.clone() },
        },
    };
    let show = matches!(
        cmd,
        AggCmd::Job {
            cmd: JobCmd::Show { .. }
        }
    );
    match client.admin(AdminRequest::Agg(req)).await? {
        AdminReply::AggJobs(rows) if show => {
            let row = &rows[0];
            out.line(job_json(row), || job_text(row));
        }
        AdminReply::AggJobs(rows) => {
            out.line(Value::Array(rows.iter().map(job_json).collect()), || {
                let mut t = String::from(
                    "NAME             ID  WORKERS  JOINED  VALUES      DTYPE  EPOCH  AGGREGATOR",
                );
                for r in &rows {
                    let j = &r.job;
                    t.push_str(&format!(
                        "\n{:<16} {:<3} {:<8} {:<7} {:<11} {:<6} {:<6} {}",
                        j.name,
                        j.id,
                        j.workers,
                        j.members.len(),
                        j.values,
                        dtype_name(j.dtype),
                        j.epoch,
                        state(r)
                    ));
                }
                t
            });
        }
        AdminReply::AggStats(s) => {
            let counters = |c: &[(String, u64, u64)]| -> Value {
                c.iter()
                    .map(|(n, p, b)| (n.clone(), json!({"packets": p, "bytes": b})))
                    .collect::<serde_json::Map<String, Value>>()
                    .into()
            };
            let jobs: Vec<Value> = s
                .jobs
                .iter()
                .map(|j| {
                    let members: Vec<Value> = j
                        .links
                        .iter()
                        .map(|l| {
                            json!({"addr": l.addr.to_string(), "busy_ns": l.busy_ns,
                                   "bytes": l.bytes, "bytes_per_s": sending_rate(l)})
                        })
                        .collect();
                    json!({"id": j.id, "epoch": j.epoch, "level": j.level, "workers": j.workers, "slots": j.slots,
                                "map_bytes": j.bytes, "counters": counters(&j.counters),
                                "members": members})
                })
                .collect();
            out.line(
                json!({"node": s.node, "enabled": s.enabled, "slot_count": s.slot_count, "jobs": jobs,
                       "counters": counters(&s.counters), "errors": s.errors, "last_error": s.last_error}),
                || {
                    if !s.enabled {
                        return format!("node {}: the aggregator is not enabled here", s.node);
                    }
                    let mut t = format!("node {}  slots {}  jobs {}\n", s.node, s.slot_count, s.jobs.len());
                    for j in &s.jobs {
                        t.push_str(&format!(
                            "job {} epoch {} {} workers {} memory {} KiB\n",
                            j.id,
                            j.epoch,
                            j.level,
                            j.workers,
                            j.bytes / 1024
                        ));
                        for (n, p, b) in j.counters.iter().filter(|c| c.1 > 0) {
                            t.push_str(&format!("  {n:<14} {p:>12} frames {b:>14} bytes\n"));
                        }
                        for l in j.links.iter().filter(|l| l.busy_ns > 0) {
                            t.push_str(&format!(
                                "  from {:<21} {:>9.1} Mbit/s while sending\n",
                                l.addr.to_string(),
                                sending_rate(l) as f64 * 8.0 / 1e6
                            ));
                        }
                    }
                    for (n, p, b) in &s.counters {
                        t.push_str(&format!("{n:<16} {p:>12} frames {b:>14} bytes\n"));
                    }
                    t.trim_end().to_owned()
                },
            );
        }
        AdminReply::Written { revision } => out.line(json!({"revision": revision}), || {
            format!("revision {revision}")
        }),
        other => bail!("unexpected reply {other:?}"),
    }
    Ok(ExitCode::SUCCESS)
}

/// Bytes/s a member's frames arrived at while it was sending, since its timing began.
fn sending_rate(l: &yard_actors::aggregator::bandwidth::Reading) -> u64 {
    yard_actors::aggregator::bandwidth::bytes_per_s(l.bytes, l.busy_ns)
}

fn dtype_name(raw: u8) -> &'static str {
    Dtype::from_raw(raw).map_or("?", Dtype::name)
}

fn state(r: &AggJobRow) -> String {
    let j = &r.job;
    if let Some(why) = &j.failed {
        return format!("failed: {why}");
    }
    if j.running() && j.grouping == Grouping::Ring {
        return "running: all-reduced by its workers in a ring, no aggregator".into();
    }
    match (r.aggregator, &r.waiting) {
        (Some(a), _) if j.complete() => {
            format!("node {} at {a}", j.placement.map_or(0, |p| p.node))
        }
        (_, Some(why)) => format!("waiting: {why}"),
        _ if !j.complete() => format!(
            "waiting for {} workers",
            usize::from(j.workers) - j.gone.len() - j.members.len()
        ),
        _ => "waiting for the leader".into(),
    }
}

/// The job's aggregators as JSON: each with its role, address and members (ranks with their
/// worker index there and measured bandwidth; at the root, its clusters too).
fn tree_json(r: &AggJobRow) -> Vec<Value> {
    let j = &r.job;
    let addr = |n: u64| {
        r.aggregators
            .get(&n)
            .map(|ip| format!("{ip}:{}", yard_agg::wire::PORT))
    };
    j.seats()
        .iter()
        .map(|s| {
            let ranks: Vec<Value> = s
                .ranks
                .iter()
                .enumerate()
                .map(|(i, rank)| {
                    json!({"rank": rank, "worker": i,
                           "addr": j.members.get(rank).map(ToString::to_string),
                           "bandwidth_bytes_per_s": r.bandwidth.get(rank)})
                })
                .collect();
            json!({"node": s.placement.node, "addr": addr(s.placement.node),
                   "role": if s.up_index.is_some() { "cluster" } else { "root" },
                   "worker_at_root": s.up_index, "ranks": ranks, "clusters": s.children})
        })
        .collect()
}

/// A figure in bytes/s as MB/s, or a dash when not measured.
fn mbps(b: Option<&u64>) -> String {
    b.map_or("-".into(), |b| format!("{:.1} MB/s", *b as f64 / 1e6))
}

fn job_json(r: &AggJobRow) -> Value {
    let j = &r.job;
    let members: Vec<Value> = j
        .worker_order()
        .iter()
        .map(|(rank, addr)| {
            let seat = j.seat_of(*rank);
            let at = seat.and_then(|s| r.aggregators.get(&s.0.node));
            // An operator's worker (admin credentials) needs its tokens as an agent's gets them.
            let m = r.membership(*rank);
            json!({"rank": rank, "worker": seat.map(|s| s.1), "aggregator_node": seat.map(|s| s.0.node),
                   "aggregator": at.map(|ip| format!("{ip}:{}", yard_agg::wire::PORT)),
                   "addr": addr.to_string(), "bandwidth_bytes_per_s": r.bandwidth.get(rank),
                   "token": m.map(|m| m.token), "result_token": m.map(|m| m.result_token)})
        })
        .collect();
    json!({
        "name": j.name, "id": j.id, "workers": j.workers, "values": j.values,
        "size": u64::from(j.values) * 4, "dtype": dtype_name(j.dtype), "elastic": j.elastic,
        "chunk_values": j.chunk_values, "chunks": j.chunks(), "memory_bytes": j.bytes(),
        "epoch": j.epoch, "members": members, "gone": j.gone,
        "aggregator": r.aggregator.map(|a| a.to_string()),
        "aggregator_node": j.placement.map(|p| p.node),
        "running": j.running(), "failed": j.failed, "waiting": r.waiting,
        "state": state(r), "grouping": j.grouping.name(), "tree": tree_json(r),
    })
}

fn job_text(r: &AggJobRow) -> String {
    let j = &r.job;
    let mut t = format!(
        "job {} (id {})  {} x {} values ({} chunks of {})  epoch {}  {} MiB\n{}\n",
        j.name,
        j.id,
        j.workers,
        j.values,
        j.chunks(),
        j.chunk_values,
        j.epoch,
        j.bytes().div_ceil(1 << 20),
        state(r)
    );
    let seats = j.seats();
    if seats.is_empty() {
        t.push_str(&format!("grouping {}\n", j.grouping.name()));
        for (rank, addr) in j.worker_order() {
            let bw = mbps(r.bandwidth.get(&rank));
            t.push_str(&format!("rank {rank:<4} {addr:<22} {bw}\n"));
        }
        return t.trim_end().to_owned();
    }
    t.push_str(&format!(
        "grouping {}: {} aggregator{}\n",
        j.grouping.name(),
        seats.len(),
        if seats.len() == 1 { "" } else { "s" }
    ));
    let at = |n: u64| {
        r.aggregators
            .get(&n)
            .map_or("?".into(), ToString::to_string)
    };
    let ranks = |t: &mut String, s: &yard_raft_store::aggregation::Seat, indent: &str| {
        for (i, rank) in s.ranks.iter().enumerate() {
            let addr = j.members.get(rank).map_or("?".into(), ToString::to_string);
            let bw = mbps(r.bandwidth.get(rank));
            t.push_str(&format!(
                "{indent}rank {rank:<4} worker {i:<3} {addr:<22} {bw}\n"
            ));
        }
    };
    let root = &seats[0];
    t.push_str(&format!(
        "root: node {} at {}\n",
        root.placement.node,
        at(root.placement.node)
    ));
    ranks(&mut t, root, "  ");
    for s in &seats[1..] {
        t.push_str(&format!(
            "  cluster: node {} at {} (worker {} at the root)\n",
            s.placement.node,
            at(s.placement.node),
            s.up_index.unwrap_or(0)
        ));
        ranks(&mut t, s, "    ");
    }
    t.trim_end().to_owned()
}
