//! The service planner on the live gateway: the I/O around `yard_actors::gateway::replan`.
//!
//! - On every gateway node, `crate::planner_report::report_rates` samples the per-VIP XDP
//!   counters pinned by the gateway program (`gw_vip_stats`), smooths them into rates and
//!   sends them to the leader (`Request::GatewayRates`), the way the probe sends its summaries.
//! - On the leader, [`PlannerLoop`] (owned by the gateway control loop, see
//!   `gateway_control`) keeps the latest report of each node, advances the nodes' liveness
//!   history from the lease verdicts and commits it under [`HEALTH_KEY`] (so every later leader
//!   starts from the same history), and re-plans on an interval and whenever the placeable
//!   nodes change. The re-plan itself runs on a blocking thread: an LP solve must not delay the
//!   lease decisions of the loop.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::Duration;

use yard_actors::gateway::replan::{
    merge_reports, observe, HealthPrior, NodeHealth, Rate, ReplanConfig,
};
use yard_actors::gateway::service_plan::{GatewayProfile, TargetConfig};
use yard_raft_store::NodeId;

use crate::config::PlannerSection;
use crate::rpc::PlanRecord;

/// The replicated key of the gateway nodes' liveness history (JSON: node → history).
pub const HEALTH_KEY: &str = "gateway/planner/health";

/// Reports older than this many report intervals are left out of a re-plan (their node stopped
/// reporting: it died, or its counters are unreadable).
const STALE_REPORTS: u32 = 4;

/// The planner's settings, from `[planner]`.
#[derive(Debug, Clone)]
pub struct PlannerSettings {
    pub interval: Duration,
    pub report_every: Duration,
    pub replan: ReplanConfig,
    pub capacity: (f64, f64),
    pub capacities: BTreeMap<NodeId, (f64, f64)>,
    pub tenants: BTreeMap<Ipv4Addr, String>,
    pub prior: HealthPrior,
}

impl PlannerSettings {
    pub fn from_config(p: &PlannerSection) -> Self {
        Self {
            interval: Duration::from_millis(p.interval_ms),
            report_every: Duration::from_millis(p.report_ms),
            replan: ReplanConfig {
                target: TargetConfig {
                    availability: p.availability,
                    replicas: p.replicas,
                    seed: p.seed,
                    max_moves: p.max_moves,
                },
                min_gain: p.min_gain,
            },
            capacity: (p.capacity_bps, p.capacity_pps),
            capacities: p
                .node_capacity
                .iter()
                .map(|c| (c.node, (c.bps, c.pps)))
                .collect(),
            tenants: p
                .tenants
                .iter()
                .flat_map(|t| t.vips.iter().map(|v| (*v, t.name.clone())))
                .collect(),
            prior: HealthPrior {
                ms: p.prior_ms as f64,
                fail_prob: p.prior_fail_prob,
            },
        }
    }

    /// `node`'s profile with failure estimate `fail_prob`.
    pub fn profile(&self, node: NodeId, fail_prob: f64) -> GatewayProfile {
        let (bps, pps) = self.capacities.get(&node).copied().unwrap_or(self.capacity);
        GatewayProfile {
            capacity_bps: bps,
            capacity_pps: pps,
            fail_prob,
        }
    }
}

/// The leader's planner state, owned by the gateway control loop.
#[derive(Debug)]
pub struct PlannerLoop {
    pub settings: PlannerSettings,
    /// Latest report per node: when it arrived (ms on the loop's clock) and its rates.
    reports: BTreeMap<NodeId, (u64, BTreeMap<Ipv4Addr, Rate>)>,
    pub health: BTreeMap<NodeId, NodeHealth>,
    last_observed: Option<u64>,
    next_at: u64,
    planned_on: Option<BTreeSet<NodeId>>,
    /// No re-plan before this (ms): a new leader's lease verdicts are not settled yet (nodes it
    /// has not heard from are not live), and a plan on part of the nodes would move VIPs twice.
    hold_until: u64,
    /// A re-plan is running on a blocking thread.
    pub busy: bool,
}

impl PlannerLoop {
    pub fn new(settings: PlannerSettings) -> Self {
        Self {
            settings,
            reports: BTreeMap::new(),
            health: BTreeMap::new(),
            last_observed: None,
            next_at: 0,
            planned_on: None,
            hold_until: 0,
            busy: false,
        }
    }

    /// `node` reported `rates` at `at_ms`.
    pub fn report(&mut self, node: NodeId, at_ms: u64, rates: Vec<(Ipv4Addr, Rate)>) {
        self.reports
            .insert(node, (at_ms, rates.into_iter().collect()));
    }

    /// A new leadership at `now_ms`: starts from the replicated history `committed` (JSON, if
    /// any) and re-plans from one interval on.
    pub fn gain(&mut self, now_ms: u64, committed: Option<&str>) {
        self.health = committed
            .and_then(|j| match serde_json::from_str(j) {
                Ok(h) => Some(h),
                Err(e) => {
                    tracing::warn!(error = %e, "planner: the committed node history is unreadable; starting afresh");
                    None
                }
            })
            .unwrap_or_default();
        self.last_observed = None;
        self.planned_on = None;
        self.next_at = 0;
        self.hold_until = now_ms + self.settings.interval.as_millis() as u64;
    }

    /// Whether a re-plan is due at `now_ms` with `placeable` nodes.
    pub fn due(&self, now_ms: u64, placeable: &BTreeSet<NodeId>) -> bool {
        !self.busy
            && now_ms >= self.hold_until
            && (now_ms >= self.next_at || self.planned_on.as_ref() != Some(placeable))
    }

    /// Advances the history to `now_ms` and starts a re-plan round: the merged rates and the
    /// node profiles to plan with.
    pub fn start(
        &mut self,
        now_ms: u64,
        known: &BTreeSet<NodeId>,
        live: &BTreeSet<NodeId>,
        placeable: &BTreeSet<NodeId>,
    ) -> (BTreeMap<Ipv4Addr, Rate>, BTreeMap<NodeId, GatewayProfile>) {
        if let Some(t) = self.last_observed {
            observe(&mut self.health, known, live, now_ms.saturating_sub(t));
        }
        self.last_observed = Some(now_ms);
        self.busy = true;
        self.planned_on = Some(placeable.clone());
        self.next_at = now_ms + self.settings.interval.as_millis() as u64;
        let stale = (self.settings.report_every * STALE_REPORTS).as_millis() as u64;
        let rates = merge_reports(&self.reports, now_ms.saturating_sub(stale));
        let nodes = placeable
            .iter()
            .map(|n| {
                let p = self
                    .health
                    .get(n)
                    .copied()
                    .unwrap_or_default()
                    .fail_prob(self.settings.prior);
                (*n, self.settings.profile(*n, p))
            })
            .collect();
        (rates, nodes)
    }

    /// The history as committed under [`HEALTH_KEY`].
    pub fn health_json(&self) -> String {
        serde_json::to_string(&self.health).unwrap_or_else(|_| "{}".into())
    }
}

/// The latest re-plans, for `yard plan show` and the metrics.
#[derive(Debug, Default, Clone)]
pub struct PlanRecords {
    pub latest: Option<PlanRecord>,
    pub last_moved: Option<PlanRecord>,
    pub moves_total: u64,
    pub replans_total: u64,
}

impl PlanRecords {
    /// Leadership lost: the records go (the move counter stays monotonic).
    pub fn forget(&mut self) {
        self.latest = None;
        self.last_moved = None;
    }

    pub fn record(&mut self, r: PlanRecord) {
        self.replans_total += 1;
        self.moves_total += r.report.moves.len() as u64;
        if !r.report.moves.is_empty() {
            self.last_moved = Some(r.clone());
        }
        self.latest = Some(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> PlannerSettings {
        let mut p = PlannerSection {
            interval_ms: 1_000,
            report_ms: 100,
            ..PlannerSection::default()
        };
        p.node_capacity.push(crate::config::NodeCapacity {
            node: 2,
            bps: 5e8,
            pps: 1e5,
        });
        p.tenants.push(crate::config::TenantGroup {
            name: "blue".into(),
            vips: vec![Ipv4Addr::new(198, 19, 0, 1)],
        });
        PlannerSettings::from_config(&p)
    }

    #[test]
    fn records_keep_the_latest_and_the_last_that_moved() {
        use yard_actors::gateway::replan::{PlannedMove, ReplanReport};
        let record = |moves: usize| PlanRecord {
            at_unix_ms: moves as u64,
            term: 1,
            measured_vips: 0,
            report: ReplanReport {
                current_worst: 0.0,
                planned_worst: 0.0,
                moves: vec![
                    PlannedMove {
                        vip: Ipv4Addr::new(198, 19, 0, 1),
                        from: 1,
                        to: 2,
                        rate: Rate::default(),
                    };
                    moves
                ],
                deferred: 0,
                reason: String::new(),
                nodes: Vec::new(),
                tenants: Vec::new(),
            },
        };
        let mut r = PlanRecords::default();
        r.record(record(2));
        r.record(record(0));
        assert_eq!(r.latest.as_ref().map(|l| l.at_unix_ms), Some(0));
        assert_eq!(r.last_moved.as_ref().map(|l| l.at_unix_ms), Some(2));
        assert_eq!((r.replans_total, r.moves_total), (2, 2));
        r.forget();
        assert!(r.latest.is_none() && r.last_moved.is_none());
        assert_eq!(r.moves_total, 2, "the counter stays");
    }

    #[test]
    fn the_loop_replans_on_its_interval_and_when_the_nodes_change() {
        let mut pl = PlannerLoop::new(settings());
        assert_eq!(pl.settings.tenants[&Ipv4Addr::new(198, 19, 0, 1)], "blue");
        let all: BTreeSet<NodeId> = [1, 2, 3].into();
        assert!(pl.due(0, &all));
        let r = |bps: f64| Rate { bps, pps: 1.0 };
        pl.report(1, 0, vec![(Ipv4Addr::new(198, 19, 0, 1), r(10.0))]);
        pl.report(2, 0, vec![(Ipv4Addr::new(198, 19, 0, 1), r(5.0))]);
        let (rates, nodes) = pl.start(0, &all, &all, &all);
        assert_eq!(rates[&Ipv4Addr::new(198, 19, 0, 1)].bps, 15.0);
        assert_eq!(nodes[&2].capacity_bps, 5e8, "a per-node capacity");
        assert_eq!(nodes[&1].capacity_bps, 1.25e9, "the default");
        assert!(!pl.due(10, &all), "one round at a time");
        pl.busy = false;
        assert!(!pl.due(10, &all));
        let two: BTreeSet<NodeId> = [1, 2].into();
        assert!(pl.due(10, &two), "a node left the placeable set");
        assert!(pl.due(1_000, &all), "the interval");
        // Node 3 down for the next 600 ms: its history and estimate follow.
        let (_, nodes) = pl.start(600, &all, &two, &two);
        assert_eq!(nodes.len(), 2);
        assert_eq!(pl.health[&3].down_ms, 600);
        assert_eq!(pl.health[&3].lapses, 1);
        // Reports older than four report intervals are stale.
        pl.busy = false;
        let (rates, _) = pl.start(1_000, &all, &all, &all);
        assert!(rates.is_empty(), "{rates:?}");
        // The history survives a change of leader through its committed form.
        let json = pl.health_json();
        let mut next = PlannerLoop::new(settings());
        next.gain(5_000, Some(&json));
        assert_eq!(next.health, pl.health);
        assert!(
            !next.due(5_999, &all),
            "held for an interval after the gain"
        );
        assert!(next.due(6_000, &all));
        next.gain(7_000, Some("{"));
        assert!(next.health.is_empty(), "unreadable: afresh");
    }
}
