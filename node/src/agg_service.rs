//! Operators' and workers' aggregation requests: jobs (replicated writes, checked by the tables
//! at apply time), listings (linearizable reads) and this node's aggregator (local).

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use yard_actors::aggregator::actor::AggSnapshot;
use yard_actors::aggregator::placement::{decide, ClusterView};
use yard_agg::model::Counter;
use yard_agg::wire::Geometry;
use yard_raft_store::aggregation::{AggCommand, AggTables};
use yard_raft_store::{Command, NodeId, StateMachineData};

use crate::metrics::Family;
use crate::rpc::{AdminReply, AdminRequest, AggJobRow, AggRequest, AggStats, Reply};
use crate::service::Node;

/// Each member's host address, from the replicated node metadata.
pub fn node_ips(d: &StateMachineData) -> BTreeMap<NodeId, Ipv4Addr> {
    d.nodes
        .iter()
        .filter_map(|(id, m)| Some((*id, node_ip(m)?)))
        .collect()
}

/// A node's host address, from its metadata (none if it advertises no IPv4 address).
pub fn node_ip(meta: &yard_raft_store::NodeMeta) -> Option<Ipv4Addr> {
    match meta.addr.parse::<SocketAddr>() {
        Ok(SocketAddr::V4(a)) => Some(*a.ip()),
        _ => None,
    }
}

/// What the rows of `yard agg job list` are made from, copied under the state machine's lock:
/// the tables and each member's host address.
fn rows_input(d: &StateMachineData) -> (AggTables, BTreeMap<NodeId, Ipv4Addr>) {
    (d.aggregation.clone(), node_ips(d))
}

/// The rows of `yard agg job list`: every job with its aggregator's address, and why a complete
/// job waits for one (the placement core's answer on the tables alone: its search is why this
/// runs on a copy, off the lock and the runtime, see [`Node::read_off_lock`]).
fn rows((t, ips): (AggTables, BTreeMap<NodeId, Ipv4Addr>), only: Option<&str>) -> Vec<AggJobRow> {
    let t = &t;
    let view = ClusterView {
        node_ips: ips.clone(),
        ..ClusterView::default()
    };
    let waiting: BTreeMap<String, String> = decide(t, &view).waiting.into_iter().collect();
    t.jobs
        .values()
        .filter(|j| only.is_none_or(|n| n == j.name))
        .map(|j| AggJobRow {
            job: j.clone(),
            aggregator: j
                .placement
                .and_then(|p| t.hosts.get(&p.node))
                .map(|h| SocketAddrV4::new(h.ip, yard_agg::wire::PORT)),
            waiting: waiting.get(&j.name).cloned(),
            aggregators: yard_actors::aggregator::core::aggregator_ips(t, j),
            bandwidth: member_bandwidth(t, j, &ips),
        })
        .collect()
}

/// Each member's measured bandwidth to its aggregator: from the node at its address.
fn member_bandwidth(
    t: &AggTables,
    j: &yard_raft_store::aggregation::AggJob,
    ips: &BTreeMap<NodeId, Ipv4Addr>,
) -> BTreeMap<u16, u64> {
    let seats = j.seat_index();
    j.members
        .iter()
        .filter_map(|(rank, addr)| {
            let (seat, _) = seats.get(rank)?;
            let from = ips.iter().find(|(_, ip)| **ip == *addr.ip())?.0;
            Some((*rank, *t.bandwidth.get(from)?.get(&seat.node)?))
        })
        .collect()
}

/// The aggregator's metric families: per job (its id) frames and bytes by outcome, rounds
/// summed, kernel memory; and the host's frames by outcome over every job.
pub fn families(s: &AggSnapshot) -> Vec<Family> {
    let mut frames = Vec::new();
    let mut bytes = Vec::new();
    let mut rounds = Vec::new();
    let mut memory = Vec::new();
    for j in &s.jobs {
        for (name, packets, b) in &j.counters {
            let labels = format!("job=\"{}\",level=\"{}\",outcome=\"{name}\"", j.id, j.level);
            frames.push((labels.clone(), *packets as f64));
            bytes.push((labels, *b as f64));
        }
        // Each round completes every chunk once; the job holds two slots per chunk.
        let chunks = (j.slots / 2).max(1);
        let completed = j
            .counters
            .iter()
            .find(|c| c.0 == Counter::Completed.name())
            .map_or(0, |c| c.1);
        rounds.push((format!("job=\"{}\"", j.id), (completed / chunks) as f64));
        memory.push((format!("job=\"{}\"", j.id), j.bytes as f64));
    }
    let host = s
        .counters
        .iter()
        .map(|(name, packets, _)| (format!("outcome=\"{name}\""), *packets as f64))
        .collect();
    vec![
        Family {
            name: "yard_agg_job_frames_total",
            help: "frames the aggregator XDP program handled for a job, by this host's level in the job's tree (root, cluster) and outcome (added, completed, result_resent for retransmissions, duplicate, stale, foreign, ...)",
            kind: "counter",
            samples: frames,
        },
        Family {
            name: "yard_agg_job_bytes_total",
            help: "bytes of a job's frames by outcome (added: gradient bytes summed)",
            kind: "counter",
            samples: bytes,
        },
        Family {
            name: "yard_agg_job_rounds_total",
            help: "rounds a job completed on this host (completed chunks over chunks per round)",
            kind: "counter",
            samples: rounds,
        },
        Family {
            name: "yard_agg_job_memory_bytes",
            help: "kernel memory a job's slots take on this host",
            kind: "gauge",
            samples: memory,
        },
        Family {
            name: "yard_agg_xdp_packets_total",
            help: "frames the aggregator XDP program handled on this host, by outcome",
            kind: "counter",
            samples: host,
        },
        Family {
            name: "yard_agg_state",
            help: "the aggregator now: slots of its map, jobs served, table write errors",
            kind: "gauge",
            samples: vec![
                ("what=\"slots\"".into(), f64::from(s.slot_count)),
                ("what=\"jobs\"".into(), s.jobs.len() as f64),
                ("what=\"errors\"".into(), s.errors as f64),
            ],
        },
    ]
}

impl Node {
    pub(crate) async fn handle_agg(
        &self,
        forwarded: bool,
        req: &AdminRequest,
        a: &AggRequest,
    ) -> Reply {
        let cmd = match a {
            AggRequest::Create {
                name,
                workers,
                values,
                dtype,
                elastic,
                mtu,
                colocate,
                grouping,
            } => {
                let Some(chunk_values) = Geometry::chunk_values_for_mtu(*mtu) else {
                    return Reply::Error(format!(
                        "an mtu of {mtu} bytes carries no gradient value"
                    ));
                };
                AggCommand::Create {
                    name: name.clone(),
                    workers: *workers,
                    values: *values,
                    dtype: *dtype,
                    elastic: *elastic,
                    chunk_values,
                    colocate: *colocate,
                    quota: self.agg_quota(),
                    grouping: *grouping,
                    secret: job_secret(),
                }
            }
            AggRequest::Delete { name } => AggCommand::Delete { name: name.clone() },
            AggRequest::Join { name, rank, addr } => {
                if addr.ip().is_unspecified() || addr.port() == 0 {
                    return Reply::Error(format!(
                        "{addr} is not an address the aggregator can answer: bind the worker's socket to its host address and a port"
                    ));
                }
                AggCommand::Join {
                    name: name.clone(),
                    rank: *rank,
                    addr: *addr,
                }
            }
            AggRequest::List => {
                return self
                    .read_off_lock(forwarded, req, rows_input, |input| {
                        AdminReply::AggJobs(rows(input, None))
                    })
                    .await
            }
            AggRequest::Show { name } => {
                let name = name.clone();
                let only = name.clone();
                return match self
                    .read_off_lock(forwarded, req, rows_input, move |input| {
                        AdminReply::AggJobs(rows(input, Some(&only)))
                    })
                    .await
                {
                    Reply::Admin(AdminReply::AggJobs(rows)) if rows.is_empty() => {
                        Reply::Error(format!("no job named {name}"))
                    }
                    other => other,
                };
            }
            AggRequest::Stats => return Reply::Admin(AdminReply::AggStats(self.agg_stats())),
            AggRequest::Host {
                node,
                ip,
                slots,
                cpu_millis,
            } => AggCommand::Host {
                node: *node,
                ip: *ip,
                slots: *slots,
                cpu_millis: *cpu_millis,
            },
            AggRequest::Bandwidth {
                from,
                to,
                bytes_per_s,
            } => AggCommand::Bandwidth {
                from: *from,
                to: *to,
                bytes_per_s: *bytes_per_s,
            },
            AggRequest::Remeasure { from, to } => AggCommand::Remeasure {
                from: *from,
                to: *to,
            },
            AggRequest::WorkerGone { name, rank, reason } => AggCommand::WorkerGone {
                name: name.clone(),
                rank: *rank,
                reason: reason.clone(),
            },
        };
        self.write(forwarded, req, Command::Aggregation(cmd)).await
    }

    /// This node's aggregator as `yard agg stats` shows it.
    pub fn agg_stats(&self) -> AggStats {
        let Some(view) = self.agg_view() else {
            return AggStats {
                node: self.id(),
                enabled: false,
                slot_count: 0,
                jobs: Vec::new(),
                counters: Vec::new(),
                errors: 0,
                last_error: None,
            };
        };
        let s = view.snapshot();
        AggStats {
            node: self.id(),
            enabled: true,
            slot_count: s.slot_count,
            jobs: s.jobs,
            counters: s.counters,
            errors: s.errors,
            last_error: s.last_error,
        }
    }
}

/// A new job's secret (`AggJob::secret`): 16 random bytes from the thread's CSPRNG (seeded by
/// the OS), drawn here because the state machine must stay deterministic. All zeros, which the
/// tables refuse, is drawn again.
fn job_secret() -> [u8; 16] {
    loop {
        let secret: [u8; 16] = rand::random();
        if secret != [0; 16] {
            return secret;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use yard_actors::aggregator::actor::JobStats;

    #[test]
    fn metrics_count_a_job_s_rounds_and_frames_by_outcome() {
        let s = AggSnapshot {
            node: 2,
            slot_count: 100,
            jobs: vec![JobStats {
                id: 7,
                epoch: 3,
                workers: 4,
                slots: 20,
                bytes: 20 * yard_raft_store::aggregation::SLOT_BYTES,
                level: "cluster".into(),
                counters: vec![
                    ("added".into(), 90, 90 * 1500),
                    ("completed".into(), 30, 30 * 1500),
                    ("foreign".into(), 2, 3000),
                ],
                links: Vec::new(),
            }],
            counters: vec![("added".into(), 90, 0)],
            errors: 0,
            last_error: None,
        };
        let fams = families(&s);
        let get = |name: &str, labels: &str| {
            fams.iter()
                .find(|f| f.name == name)
                .and_then(|f| f.samples.iter().find(|x| x.0 == labels))
                .map(|x| x.1)
        };
        // 10 chunks a round, 30 completed chunks: 3 rounds.
        assert_eq!(get("yard_agg_job_rounds_total", "job=\"7\""), Some(3.0));
        assert_eq!(
            get(
                "yard_agg_job_frames_total",
                "job=\"7\",level=\"cluster\",outcome=\"foreign\""
            ),
            Some(2.0)
        );
        assert_eq!(
            get("yard_agg_job_memory_bytes", "job=\"7\""),
            Some((20 * yard_raft_store::aggregation::SLOT_BYTES) as f64)
        );
        for f in &fams {
            f.to_metric_families()
                .unwrap_or_else(|e| panic!("{}: {e}", f.name));
        }
    }
}
