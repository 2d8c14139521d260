//! Raft's and the node's gauges, read at scrape time: openraft's metrics, the planner's and the
//! aggregator's families.

use openraft::ServerState;

use crate::metrics::GaugeSource;
use crate::service::Node;

/// Gauges read from openraft at scrape time.
pub struct RaftGauges(pub Node);

impl GaugeSource for RaftGauges {
    fn families(&self) -> Vec<crate::metrics::Family> {
        use crate::metrics::Family;
        let mut families = self.0.diagnosis().families(self.0.feed());
        families.extend(self.0.gateway().planner_families());
        if let Some(view) = self.0.agg_view() {
            families.extend(crate::agg_service::families(&view.snapshot()));
        }
        if let Some(probe) = self.0.probe_view() {
            let p = probe.snapshot();
            families.push(Family {
                name: "yard_probe_events_total",
                help:
                    "events from local ranks: accepted, dropped (buffer full), coalesced, reported",
                kind: "counter",
                samples: vec![
                    ("what=\"accepted\"".into(), p.stats.accepted as f64),
                    ("what=\"dropped\"".into(), p.stats.dropped as f64),
                    ("what=\"coalesced\"".into(), p.stats.coalesced as f64),
                    ("what=\"reported\"".into(), p.stats.reported as f64),
                ],
            });
            families.push(Family {
                name: "yard_probe_state",
                help: "the probe now: connected clients, jobs, pending events, refused connections",
                kind: "gauge",
                samples: vec![
                    ("what=\"connections\"".into(), p.connections as f64),
                    ("what=\"jobs\"".into(), p.jobs as f64),
                    ("what=\"pending\"".into(), p.stats.pending as f64),
                    ("what=\"protocol_errors\"".into(), p.protocol_errors as f64),
                ],
            });
        }
        let Some(view) = self.0.gateway_view() else {
            return families;
        };
        let s = view.snapshot();
        let per_reason = |pick: fn(&yard_actors::gateway::actor::CounterRow) -> u64| {
            s.counters
                .iter()
                .map(|c| (format!("reason=\"{}\"", c.0), pick(c) as f64))
                .collect()
        };
        let owned = s
            .vips
            .iter()
            .filter(|(_, m)| *m == yard_actors::gateway::core::Serve::Owned)
            .count();
        families.extend([
            Family {
                name: "yard_gateway_xdp_packets_total",
                help: "packets the gateway XDP program handled, by outcome",
                kind: "counter",
                samples: per_reason(|c| c.1),
            },
            Family {
                name: "yard_gateway_xdp_bytes_total",
                help: "bytes the gateway XDP program handled, by outcome",
                kind: "counter",
                samples: per_reason(|c| c.2),
            },
            Family {
                name: "yard_gateway_state",
                help: "gateway node state: lease_remaining_ms, vips_owned, vips_served, endpoints, errors",
                kind: "gauge",
                samples: vec![
                    ("what=\"lease_remaining_ms\"".into(), s.lease_remaining_ms as f64),
                    ("what=\"vips_owned\"".into(), owned as f64),
                    ("what=\"vips_served\"".into(), s.vips.len() as f64),
                    ("what=\"endpoints\"".into(), s.endpoints as f64),
                    ("what=\"errors\"".into(), s.errors as f64),
                ],
            },
        ]);
        families
    }

    fn gauges(&self) -> Vec<(&'static str, &'static str, f64)> {
        let m = self.0.inner.raft.metrics().borrow().clone();
        let reach = self.0.inner.reachability.snapshot();
        vec![
            ("yard_raft_term", "current raft term", m.current_term as f64),
            (
                "yard_raft_is_leader",
                "1 when this node leads",
                f64::from(u8::from(m.state == ServerState::Leader)),
            ),
            (
                "yard_raft_leader_id",
                "id of the current leader (on an agent, the one its watch names), 0 if none",
                self.0.known_leader().map_or(0, |(l, _)| l) as f64,
            ),
            (
                "yard_tables_applied_index",
                "log index this host's tables stand at (raft on members, the watch on agents)",
                self.0.inner.feed.applied_index() as f64,
            ),
            (
                "yard_host_is_agent",
                "1 when this host holds no raft membership and follows a watch",
                f64::from(u8::from(!self.0.is_member())),
            ),
            (
                "yard_raft_last_log_index",
                "index of the last log entry",
                m.last_log_index.unwrap_or(0) as f64,
            ),
            (
                "yard_raft_last_applied_index",
                "index of the last applied entry",
                m.last_applied.map_or(0, |l| l.index) as f64,
            ),
            (
                "yard_raft_snapshot_index",
                "index covered by the last snapshot",
                m.snapshot.map_or(0, |l| l.index) as f64,
            ),
            (
                "yard_raft_members",
                "nodes in the membership",
                m.membership_config.membership().nodes().count() as f64,
            ),
            (
                "yard_liveness_reachable_members",
                "members the leader can reach",
                reach.values().filter(|r| **r).count() as f64,
            ),
        ]
    }
}
