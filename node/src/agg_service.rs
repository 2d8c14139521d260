//! Operators' and workers' aggregation requests: jobs (replicated writes, checked by the tables
//! at apply time), listings (linearizable reads) and this node's aggregator (local).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use yard_actors::aggregator::placement::{decide, ClusterView};
use yard_agg::wire::Geometry;
use yard_raft_store::aggregation::{AggCommand, AggTables};
use yard_raft_store::{Command, NodeId, StateMachineData};

use crate::rpc::{AdminReply, AdminRequest, AggJobRow, AggRequest, AggStats, Reply};
use crate::service::Node;

/// Each member's host address, from the replicated node metadata.
pub fn node_ips(d: &StateMachineData) -> BTreeMap<NodeId, Ipv4Addr> {
    d.nodes
        .iter()
        .filter_map(|(id, m)| match m.addr.parse::<SocketAddr>() {
            Ok(SocketAddr::V4(a)) => Some((*id, *a.ip())),
            _ => None,
        })
        .collect()
}

/// The rows of `yard agg job list`: every job with its aggregator's address, and why a complete
/// job waits for one (the placement core's answer on the tables alone).
fn rows(d: &StateMachineData, only: Option<&str>) -> Vec<AggJobRow> {
    let t: &AggTables = &d.aggregation;
    let view = ClusterView {
        unreachable: BTreeSet::new(),
        node_ips: node_ips(d),
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
        })
        .collect()
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
                    .read(forwarded, req, |d| AdminReply::AggJobs(rows(d, None)))
                    .await
            }
            AggRequest::Show { name } => {
                let name = name.clone();
                return match self
                    .read(forwarded, req, |d| {
                        AdminReply::AggJobs(rows(d, Some(&name)))
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
            AggRequest::Host { node, ip, slots } => AggCommand::Host {
                node: *node,
                ip: *ip,
                slots: *slots,
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
