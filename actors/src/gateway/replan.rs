//! The leader's re-plan of where VIPs live, free of I/O and clocks: from what each VIP carries
//! and how reliable each gateway node has been to a capped [`Planned`] target for placement's
//! rule 5.
//!
//! Three pure pieces, each fed by the shell (`node/src/gateway_control.rs`):
//! - [`RateSmoother`]: on every gateway node, per-VIP XDP counters sampled on an interval become
//!   smoothed byte and packet rates (an EWMA of the rate between samples), which the node
//!   reports to the leader; [`merge_reports`] sums the fresh reports per VIP (a VIP that just
//!   moved is counted on both nodes until the old one's rate decays).
//! - [`NodeHealth`]: each node's liveness history as the leaders observed it (time watched,
//!   time down, lapses), replicated so every leader starts from the same history, and its
//!   failure probability: the down fraction smoothed by a prior (a Beta prior worth
//!   [`HealthPrior::ms`] of history at [`HealthPrior::fail_prob`]), so a node watched for a
//!   minute is neither perfect nor condemned by one lapse.
//! - [`replan`]: the service planner's placement on the placeable nodes (or the greedy
//!   least-loaded one when that is better: with too few nodes for the failure reserve the
//!   planner's schedule says little about the nominal load), cut to at most `max_moves` moves
//!   from where the VIPs are (heaviest first, each kept only if it makes the placement strictly
//!   better, VIPs that carry nothing never) and adopted only when it lowers the worst load
//!   after any single failure, or failing that the nominal peak, by at least `min_gain`, so
//!   that measurement noise does not churn VIPs. The report says what moved and why, for
//!   `yard plan show`.
//!
//! A node's death is not handled here: placement's rules 1-4 move its VIPs at once by counts,
//! and the next re-plan (the shell re-plans when the placeable set changes) improves on that.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};
use yard_planner::baseline::least_loaded;
use yard_planner::eval::{loads_after, Failover, Placement};
use yard_planner::PlanError;
use yard_raft_store::gateway::VipRecord;

use super::placement::{NodeId, Planned};
use super::service_plan::{instance, target, GatewayProfile, TargetConfig, VipTraffic};

/// One step of an exponentially weighted moving average with weight `alpha` on the new sample;
/// the first sample is taken as it is.
pub fn ewma(prev: Option<f64>, sample: f64, alpha: f64) -> f64 {
    match prev {
        Some(p) => p + alpha * (sample - p),
        None => sample,
    }
}

/// A VIP's traffic: bytes and packets per second.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Rate {
    pub bps: f64,
    pub pps: f64,
}

/// A VIP's cumulative counters on one node (summed over CPUs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VipCount {
    pub packets: u64,
    pub bytes: u64,
}

/// Per-VIP counters sampled on an interval, smoothed into rates.
#[derive(Debug, Clone)]
pub struct RateSmoother {
    alpha: f64,
    last: BTreeMap<Ipv4Addr, (u64, VipCount)>,
    rates: BTreeMap<Ipv4Addr, Rate>,
}

impl RateSmoother {
    /// `alpha` in (0, 1] is the weight of the newest interval (1: no smoothing).
    pub fn new(alpha: f64) -> Self {
        Self {
            alpha: if alpha.is_finite() {
                alpha.clamp(f64::EPSILON, 1.0)
            } else {
                1.0
            },
            last: BTreeMap::new(),
            rates: BTreeMap::new(),
        }
    }

    /// The counters read at `at_ms`. A VIP seen for the first time, or whose counters went
    /// backwards (its map was recreated), starts a new baseline and has no rate yet; a VIP no
    /// longer counted is forgotten.
    pub fn sample(&mut self, at_ms: u64, counts: &BTreeMap<Ipv4Addr, VipCount>) {
        self.last.retain(|v, _| counts.contains_key(v));
        self.rates.retain(|v, _| counts.contains_key(v));
        for (vip, c) in counts {
            if let Some((t, prev)) = self.last.get(vip) {
                if at_ms <= *t {
                    continue;
                }
                if c.packets >= prev.packets && c.bytes >= prev.bytes {
                    let secs = (at_ms - t) as f64 / 1000.0;
                    let bps = (c.bytes - prev.bytes) as f64 / secs;
                    let pps = (c.packets - prev.packets) as f64 / secs;
                    let old = self.rates.get(vip).copied();
                    self.rates.insert(
                        *vip,
                        Rate {
                            bps: ewma(old.map(|r| r.bps), bps, self.alpha),
                            pps: ewma(old.map(|r| r.pps), pps, self.alpha),
                        },
                    );
                } else {
                    self.rates.remove(vip);
                }
            }
            self.last.insert(*vip, (at_ms, *c));
        }
    }

    /// The smoothed rate of every VIP with at least two samples.
    pub fn rates(&self) -> &BTreeMap<Ipv4Addr, Rate> {
        &self.rates
    }
}

/// The per-VIP rates of the nodes' reports received at or after `since_ms`, summed per VIP.
pub fn merge_reports(
    reports: &BTreeMap<NodeId, (u64, BTreeMap<Ipv4Addr, Rate>)>,
    since_ms: u64,
) -> BTreeMap<Ipv4Addr, Rate> {
    let mut out: BTreeMap<Ipv4Addr, Rate> = BTreeMap::new();
    for (at, rates) in reports.values() {
        if *at < since_ms {
            continue;
        }
        for (vip, r) in rates {
            let e = out.entry(*vip).or_default();
            e.bps += r.bps;
            e.pps += r.pps;
        }
    }
    out
}

/// One gateway node's liveness history as the leaders observed it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeHealth {
    /// Time it was watched, and of that the time it was not live.
    pub observed_ms: u64,
    pub down_ms: u64,
    /// Times it went from live to not live.
    pub lapses: u64,
    /// Whether it was live at the last observation.
    pub up: bool,
}

/// The prior of the failure estimate: as if every node had already been watched for `ms` and
/// found down `fail_prob` of that time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HealthPrior {
    pub ms: f64,
    pub fail_prob: f64,
}

/// Failure probabilities are kept in this range: never certain up (the planner's availability
/// cover would be infinite) and never so likely down that a node is useless.
pub const FAIL_PROB_RANGE: (f64, f64) = (1e-6, 0.5);

impl NodeHealth {
    /// The smoothed down fraction: `(down + p·m) / (observed + m)` for prior `p` worth `m` ms.
    pub fn fail_prob(&self, prior: HealthPrior) -> f64 {
        let m = prior.ms.max(0.0);
        let p = (self.down_ms as f64 + prior.fail_prob * m) / (self.observed_ms as f64 + m);
        if p.is_finite() {
            p.clamp(FAIL_PROB_RANGE.0, FAIL_PROB_RANGE.1)
        } else {
            prior.fail_prob.clamp(FAIL_PROB_RANGE.0, FAIL_PROB_RANGE.1)
        }
    }
}

/// Advances the history by `dt_ms` of watching: every node in `known` was watched, those not in
/// `live` were down; a node that was live (or is new) and is not counts a lapse.
pub fn observe(
    history: &mut BTreeMap<NodeId, NodeHealth>,
    known: &BTreeSet<NodeId>,
    live: &BTreeSet<NodeId>,
    dt_ms: u64,
) {
    for n in known {
        // A node seen for the first time counts as having been live.
        let h = history.entry(*n).or_insert(NodeHealth {
            up: true,
            ..NodeHealth::default()
        });
        let up = live.contains(n);
        h.observed_ms = h.observed_ms.saturating_add(dt_ms);
        if !up {
            h.down_ms = h.down_ms.saturating_add(dt_ms);
            if h.up {
                h.lapses += 1;
            }
        }
        h.up = up;
    }
}

/// A target that keeps every VIP where it is (or is going): what a new leader follows until its
/// first re-plan, so that placement's count balance does not move VIPs in between.
pub fn stay(vips: &BTreeMap<Ipv4Addr, VipRecord>, max_moves: usize) -> Planned {
    Planned {
        target: vips
            .iter()
            .filter_map(|(v, r)| r.handoff_to.or(r.owner).map(|n| (*v, n)))
            .collect(),
        max_moves,
    }
}

/// The knobs of a re-plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplanConfig {
    pub target: TargetConfig,
    /// The least drop of the worst load after a single failure (a fraction of capacity) worth
    /// moving VIPs for.
    pub min_gain: f64,
}

/// What a re-plan looks at.
#[derive(Debug, Clone, Copy)]
pub struct ReplanInput<'a> {
    /// The applied replicated VIP table.
    pub vips: &'a BTreeMap<Ipv4Addr, VipRecord>,
    /// Measured rates per VIP (a VIP with none carries nothing).
    pub rates: &'a BTreeMap<Ipv4Addr, Rate>,
    /// The tenant of each named VIP; the others belong to [`DEFAULT_TENANT`].
    pub tenants: &'a BTreeMap<Ipv4Addr, String>,
    /// The nodes VIPs may be placed on, with their capacity and failure estimate.
    pub nodes: &'a BTreeMap<NodeId, GatewayProfile>,
}

/// The tenant of VIPs no tenant names.
pub const DEFAULT_TENANT: &str = "default";

/// One VIP the re-plan moves.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PlannedMove {
    pub vip: Ipv4Addr,
    pub from: NodeId,
    pub to: NodeId,
    /// What the VIP carries.
    pub rate: Rate,
}

/// One node in a re-plan.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct NodeView {
    pub node: NodeId,
    pub fail_prob: f64,
    /// Load (the larger of bytes/s and packets/s over capacity) where the VIPs are now, and
    /// where the re-plan puts them.
    pub measured: f64,
    pub predicted: f64,
    /// The highest predicted load after any single other node fails.
    pub after_failure: f64,
}

/// One tenant in a re-plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantView {
    pub tenant: String,
    pub vips: usize,
    /// The nodes its VIPs are planned on, and the probability that at least one is up.
    pub nodes: Vec<NodeId>,
    pub availability: f64,
    pub target: f64,
}

/// What a re-plan decided and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplanReport {
    /// The worst load, nominal or after any single failure, where the VIPs are and where the
    /// re-plan puts them (the load factor).
    pub current_worst: f64,
    pub planned_worst: f64,
    pub moves: Vec<PlannedMove>,
    /// Moves toward the plan this re-plan did not start (beyond the cap, or no better alone),
    /// left for the next one.
    pub deferred: usize,
    pub reason: String,
    pub nodes: Vec<NodeView>,
    pub tenants: Vec<TenantView>,
}

/// A re-plan: the target for placement (`None`: nothing to plan on, so the leader balances VIP
/// counts as it does without a planner) and its report.
#[derive(Debug, Clone, PartialEq)]
pub struct Replan {
    pub planned: Option<Planned>,
    pub report: ReplanReport,
}

/// Loads of a placement `owner` (VIP → node): nominal per node, the worst after each single
/// failure per node, and the worst of all.
struct Loads {
    nominal: BTreeMap<NodeId, f64>,
    after_failure: BTreeMap<NodeId, f64>,
    worst: f64,
}

fn loads(
    inst: &yard_planner::Instance,
    order: &[Vec<Ipv4Addr>],
    ids: &[NodeId],
    owner: &BTreeMap<Ipv4Addr, NodeId>,
) -> Loads {
    let index: BTreeMap<NodeId, usize> = ids.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let all: Vec<usize> = (0..ids.len()).collect();
    // A failed node's VIPs go to the least-loaded survivor: what the next re-plan does.
    let p = Placement {
        sets: vec![all; order.len()],
        owner: order
            .iter()
            .map(|vips| vips.iter().map(|v| index[&owner[v]]).collect())
            .collect(),
        failover: Failover::WithinSet,
    };
    let nn = ids.len();
    let (nominal, _) = loads_after(inst, &p, &vec![false; nn]);
    let mut after = vec![0.0f64; nn];
    if nn > 1 {
        for dead in 0..nn {
            let mut failed = vec![false; nn];
            failed[dead] = true;
            let (l, _) = loads_after(inst, &p, &failed);
            for (a, x) in after.iter_mut().zip(l) {
                *a = a.max(x);
            }
        }
    }
    let worst = nominal.iter().chain(&after).copied().fold(0.0, f64::max);
    Loads {
        nominal: ids.iter().copied().zip(nominal).collect(),
        after_failure: ids.iter().copied().zip(after).collect(),
        worst,
    }
}

impl Loads {
    fn nominal_max(&self) -> f64 {
        self.nominal.values().copied().fold(0.0, f64::max)
    }
}

/// One candidate of a re-plan: the moves it starts, those it defers, the placement after them
/// and its loads.
type Candidate = (Vec<Ipv4Addr>, usize, BTreeMap<Ipv4Addr, NodeId>, Loads);

/// Candidate moves a re-plan evaluates per move it may start.
const TRIES_PER_MOVE: usize = 4;

/// Loads within this are equal (floating-point noise of the evaluation).
const TOLERANCE: f64 = 1e-9;

/// Whether `a` is a better placement than `b`: a lower worst case, then a lower nominal peak.
fn better(a: &Loads, b: &Loads) -> bool {
    if (a.worst - b.worst).abs() > TOLERANCE {
        return a.worst < b.worst;
    }
    a.nominal_max() < b.nominal_max() - TOLERANCE
}

fn empty(reason: &str) -> Replan {
    Replan {
        planned: None,
        report: ReplanReport {
            current_worst: 0.0,
            planned_worst: 0.0,
            moves: Vec::new(),
            deferred: 0,
            reason: reason.to_owned(),
            nodes: Vec::new(),
            tenants: Vec::new(),
        },
    }
}

/// Plans the VIPs of `input` on its nodes (see the module doc).
pub fn replan(input: &ReplanInput, cfg: &ReplanConfig) -> Result<Replan, PlanError> {
    if input.nodes.is_empty() {
        return Ok(empty("no gateway node can take vips"));
    }
    if input.vips.is_empty() {
        return Ok(empty("there are no vips"));
    }
    let zero = Rate::default();
    let traffic: BTreeMap<Ipv4Addr, VipTraffic> = input
        .vips
        .keys()
        .map(|v| {
            let r = input.rates.get(v).unwrap_or(&zero);
            let tenant = input
                .tenants
                .get(v)
                .cloned()
                .unwrap_or_else(|| DEFAULT_TENANT.to_owned());
            (
                *v,
                VipTraffic {
                    tenant,
                    bps: r.bps.max(0.0),
                    pps: r.pps.max(0.0),
                },
            )
        })
        .collect();
    if traffic.values().all(|t| t.bps == 0.0 && t.pps == 0.0) {
        return Ok(empty("no traffic measured yet"));
    }
    let mut tcfg = cfg.target;
    tcfg.replicas = tcfg.replicas.clamp(1, input.nodes.len());
    let (inst, order) = instance(&traffic, input.nodes, &tcfg)?;
    let ids: Vec<NodeId> = input.nodes.keys().copied().collect();
    let planned = target(&traffic, input.nodes, &tcfg)?;
    // Where each VIP is (or is going); a VIP on no placeable node is taken where the plan puts
    // it, since rules 1-4 place it and only then can it move.
    let now: BTreeMap<Ipv4Addr, NodeId> = input
        .vips
        .iter()
        .map(|(v, rec)| {
            let at = rec
                .handoff_to
                .or(rec.owner)
                .filter(|n| input.nodes.contains_key(n));
            (*v, at.unwrap_or(planned.target[v]))
        })
        .collect();
    let sizes: BTreeMap<Ipv4Addr, f64> = order
        .iter()
        .enumerate()
        .flat_map(|(t, vs)| vs.iter().enumerate().map(move |(u, v)| (*v, (t, u))))
        .map(|(v, (t, u))| (v, inst.size[t][u]))
        .collect();
    let size = |v: &Ipv4Addr| sizes[v];
    // Candidates: the planner's placement, and the greedy least-loaded one, which wins when
    // the planner's failure reserve cannot be met (too few nodes for the traffic) and its
    // schedule then says little about the nominal load.
    let greedy = least_loaded(&inst);
    let mut greedy_target = BTreeMap::new();
    for (t, vips) in order.iter().enumerate() {
        for (u, vip) in vips.iter().enumerate() {
            greedy_target.insert(*vip, ids[greedy.owner[t][u]]);
        }
    }
    let cap = cfg.target.max_moves;
    let before = loads(&inst, &order, &ids, &now);
    let mut best: Option<Candidate> = None;
    for goal in [&planned.target, &greedy_target] {
        // Moves toward the goal, heaviest first; a VIP that carries nothing is left where it
        // is (moving it changes no load). Each move is kept only if it makes the placement
        // strictly better, so a re-plan never takes a step back and, with fixed rates,
        // repeated re-plans stop.
        let mut wanted: Vec<Ipv4Addr> = now
            .iter()
            .filter(|(v, n)| goal[v] != **n && size(v) > 0.0)
            .map(|(v, _)| *v)
            .collect();
        wanted.sort_by(|a, b| size(b).total_cmp(&size(a)).then(a.cmp(b)));
        let mut capped = now.clone();
        let mut current = loads(&inst, &order, &ids, &capped);
        let mut taken = Vec::new();
        for v in wanted.iter().take(cap.saturating_mul(TRIES_PER_MOVE)) {
            if taken.len() >= cap {
                break;
            }
            capped.insert(*v, goal[v]);
            let l = loads(&inst, &order, &ids, &capped);
            if better(&l, &current) {
                current = l;
                taken.push(*v);
            } else {
                capped.insert(*v, now[v]);
            }
        }
        let deferred = wanted.len() - taken.len();
        if best.as_ref().is_none_or(|b| better(&current, &b.3)) {
            best = Some((taken, deferred, capped, current));
        }
    }
    let (wanted, deferred, capped, after) = best.expect("two candidates");
    // Worth moving for: a lower worst case, or the same worst case and a lower nominal peak.
    let gain = if after.worst < before.worst - TOLERANCE {
        before.worst - after.worst
    } else if after.worst <= before.worst + TOLERANCE {
        before.nominal_max() - after.nominal_max()
    } else {
        0.0
    };
    let (adopted, moves, deferred, reason) = if wanted.is_empty() {
        (
            false,
            Vec::new(),
            0,
            format!(
                "the vips are where the plan puts them (worst load {:.2} after a failure)",
                before.worst
            ),
        )
    } else if gain < cfg.min_gain {
        (
            false,
            Vec::new(),
            0,
            format!(
                "moving {} vips would lower the load only from {:.2} to {:.2} (less than {:.2})",
                wanted.len(),
                before.worst.max(before.nominal_max()),
                after.worst.max(after.nominal_max()),
                cfg.min_gain
            ),
        )
    } else {
        let moves: Vec<PlannedMove> = wanted
            .iter()
            .map(|v| PlannedMove {
                vip: *v,
                from: now[v],
                to: capped[v],
                rate: input.rates.get(v).copied().unwrap_or_default(),
            })
            .collect();
        let reason = format!(
            "the worst load after a single failure goes from {:.2} to {:.2}, the nominal peak from {:.2} to {:.2}",
            before.worst,
            after.worst,
            before.nominal_max(),
            after.nominal_max()
        );
        (true, moves, deferred, reason)
    };
    let (chosen, result) = if adopted {
        (&capped, &after)
    } else {
        (&now, &before)
    };
    let nodes = ids
        .iter()
        .map(|n| NodeView {
            node: *n,
            fail_prob: input.nodes[n].fail_prob,
            measured: before.nominal[n],
            predicted: result.nominal[n],
            after_failure: result.after_failure[n],
        })
        .collect();
    let mut by_tenant: BTreeMap<&str, (usize, BTreeSet<NodeId>)> = BTreeMap::new();
    for (v, n) in chosen {
        let e = by_tenant.entry(traffic[v].tenant.as_str()).or_default();
        e.0 += 1;
        e.1.insert(*n);
    }
    let tenants = by_tenant
        .into_iter()
        .map(|(t, (count, set))| TenantView {
            tenant: t.to_owned(),
            vips: count,
            availability: 1.0
                - set
                    .iter()
                    .map(|n| input.nodes[n].fail_prob)
                    .product::<f64>(),
            nodes: set.into_iter().collect(),
            target: cfg.target.availability,
        })
        .collect();
    Ok(Replan {
        planned: Some(Planned {
            target: chosen.clone(),
            max_moves: cap,
        }),
        report: ReplanReport {
            current_worst: before.worst,
            planned_worst: result.worst,
            moves,
            deferred,
            reason,
            nodes,
            tenants,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vip(i: u8) -> Ipv4Addr {
        Ipv4Addr::new(198, 19, 0, i)
    }

    fn count(packets: u64, bytes: u64) -> VipCount {
        VipCount { packets, bytes }
    }

    #[test]
    fn ewma_moves_a_fraction_toward_each_sample() {
        assert_eq!(ewma(None, 10.0, 0.5), 10.0);
        assert_eq!(ewma(Some(10.0), 20.0, 0.5), 15.0);
        assert_eq!(ewma(Some(10.0), 20.0, 1.0), 20.0);
        assert_eq!(ewma(Some(10.0), 0.0, 0.25), 7.5);
    }

    #[test]
    fn counters_become_smoothed_rates() {
        let mut s = RateSmoother::new(0.5);
        s.sample(1_000, &[(vip(1), count(100, 10_000))].into());
        assert!(s.rates().is_empty(), "one sample has no rate");
        s.sample(2_000, &[(vip(1), count(1_100, 110_000))].into());
        assert_eq!(
            s.rates()[&vip(1)],
            Rate {
                bps: 100_000.0,
                pps: 1_000.0
            }
        );
        // Half a second with 300 more packets: 600 pps, smoothed half-way.
        s.sample(2_500, &[(vip(1), count(1_400, 140_000))].into());
        assert_eq!(
            s.rates()[&vip(1)],
            Rate {
                bps: 80_000.0,
                pps: 800.0
            }
        );
        // Idle: decays toward zero.
        s.sample(3_500, &[(vip(1), count(1_400, 140_000))].into());
        assert_eq!(s.rates()[&vip(1)].pps, 400.0);
        // The same instant again changes nothing.
        s.sample(3_500, &[(vip(1), count(9_999, 999_999))].into());
        assert_eq!(s.rates()[&vip(1)].pps, 400.0);
        // A reset is a new baseline, not a negative rate.
        s.sample(4_500, &[(vip(1), count(10, 1_000))].into());
        assert!(s.rates().is_empty());
        s.sample(5_500, &[(vip(1), count(20, 2_000))].into());
        assert_eq!(s.rates()[&vip(1)].pps, 10.0);
        // A VIP no longer counted is forgotten.
        s.sample(6_500, &BTreeMap::new());
        assert!(s.rates().is_empty());
    }

    #[test]
    fn fresh_reports_are_summed_per_vip() {
        let r = |bps: f64| Rate {
            bps,
            pps: bps / 100.0,
        };
        let reports: BTreeMap<NodeId, (u64, BTreeMap<Ipv4Addr, Rate>)> = [
            (1, (900, [(vip(1), r(100.0)), (vip(2), r(50.0))].into())),
            (2, (950, [(vip(1), r(20.0))].into())),
            (3, (100, [(vip(3), r(1e9))].into())),
        ]
        .into();
        let m = merge_reports(&reports, 500);
        assert_eq!(m.len(), 2, "node 3's report is stale");
        assert_eq!(m[&vip(1)], r(120.0));
        assert_eq!(m[&vip(2)], r(50.0));
    }

    const PRIOR: HealthPrior = HealthPrior {
        ms: 60_000.0,
        fail_prob: 0.01,
    };

    #[test]
    fn failure_estimate_follows_the_down_fraction_from_the_prior() {
        let mut h: BTreeMap<NodeId, NodeHealth> = BTreeMap::new();
        let known: BTreeSet<NodeId> = [1, 2].into();
        // Unwatched: the prior.
        assert!((NodeHealth::default().fail_prob(PRIOR) - 0.01).abs() < 1e-12);
        for step in 0..600 {
            // Node 2 is down one step in ten.
            let live: BTreeSet<NodeId> = if step % 10 == 9 {
                [1].into()
            } else {
                [1, 2].into()
            };
            observe(&mut h, &known, &live, 1_000);
        }
        assert_eq!(h[&1].observed_ms, 600_000);
        assert_eq!(h[&1].down_ms, 0);
        assert_eq!(h[&1].lapses, 0);
        assert_eq!(h[&2].down_ms, 60_000);
        assert_eq!(h[&2].lapses, 60);
        let p1 = h[&1].fail_prob(PRIOR);
        let p2 = h[&2].fail_prob(PRIOR);
        // (0 + 600) / 660000 and (60000 + 600) / 660000.
        assert!((p1 - 600.0 / 660_000.0).abs() < 1e-12, "{p1}");
        assert!((p2 - 60_600.0 / 660_000.0).abs() < 1e-12, "{p2}");
        // Never certain, never beyond the cap.
        let dead = NodeHealth {
            observed_ms: 1_000_000,
            down_ms: 1_000_000,
            lapses: 1,
            up: false,
        };
        assert_eq!(dead.fail_prob(PRIOR), FAIL_PROB_RANGE.1);
        let zero = HealthPrior {
            ms: 0.0,
            fail_prob: 0.0,
        };
        assert_eq!(NodeHealth::default().fail_prob(zero), FAIL_PROB_RANGE.0);
    }

    fn profiles(ids: &[NodeId]) -> BTreeMap<NodeId, GatewayProfile> {
        ids.iter()
            .map(|n| {
                (
                    *n,
                    GatewayProfile {
                        capacity_bps: 1.25e9,
                        capacity_pps: 1.5e6,
                        fail_prob: 0.01,
                    },
                )
            })
            .collect()
    }

    fn owned(n: NodeId) -> VipRecord {
        VipRecord {
            owner: Some(n),
            handoff_to: None,
            handoff_revision: 0,
        }
    }

    const CFG: ReplanConfig = ReplanConfig {
        target: TargetConfig {
            availability: 0.999,
            replicas: 2,
            seed: 1,
            max_moves: 2,
        },
        min_gain: 0.05,
    };

    /// Nine VIPs round-robin on three nodes, the three on node 1 heavy.
    fn skewed() -> (BTreeMap<Ipv4Addr, VipRecord>, BTreeMap<Ipv4Addr, Rate>) {
        let vips = (1..=9u8)
            .map(|i| (vip(i), owned(1 + (i as u64 - 1) % 3)))
            .collect();
        let rates = (1..=9u8)
            .map(|i| {
                let bps = if i % 3 == 1 { 450e6 } else { 20e6 };
                (
                    vip(i),
                    Rate {
                        bps,
                        pps: bps / 1000.0,
                    },
                )
            })
            .collect();
        (vips, rates)
    }

    #[test]
    fn a_skewed_profile_moves_heaviest_first_within_the_cap() {
        let (mut vips, rates) = skewed();
        let nodes = profiles(&[1, 2, 3]);
        let tenants = BTreeMap::new();
        let input = ReplanInput {
            vips: &vips,
            rates: &rates,
            tenants: &tenants,
            nodes: &nodes,
        };
        let r = replan(&input, &CFG).unwrap();
        let rep = &r.report;
        // Node 1 carries 1.35 GB/s of 1.25: over capacity before any failure.
        assert!(rep.current_worst > 1.0, "{rep:?}");
        assert!(!rep.moves.is_empty() && rep.moves.len() <= 2, "{rep:?}");
        assert!(rep.planned_worst < rep.current_worst, "{rep:?}");
        // The heaviest move first: a 450 MB/s VIP leaves node 1.
        assert_eq!(rep.moves[0].from, 1);
        assert_eq!(rep.moves[0].rate.bps, 450e6);
        let planned = r.planned.unwrap();
        assert_eq!(planned.max_moves, 2);
        let differs = vips
            .iter()
            .filter(|(v, rec)| rec.owner != Some(planned.target[v]))
            .count();
        assert_eq!(differs, rep.moves.len(), "only the capped moves differ");
        // Re-planning until nothing moves reaches a placement that survives any single
        // failure, in a bounded number of rounds.
        let mut rounds = 0;
        loop {
            let input = ReplanInput {
                vips: &vips,
                rates: &rates,
                tenants: &tenants,
                nodes: &nodes,
            };
            let r = replan(&input, &CFG).unwrap();
            if r.report.moves.is_empty() {
                assert!(r.report.current_worst <= 1.0, "{:?}", r.report);
                break;
            }
            for m in &r.report.moves {
                vips.insert(m.vip, owned(m.to));
            }
            rounds += 1;
            assert!(rounds < 10, "re-planning does not settle");
        }
        // Each tenant keeps its availability target.
        let input = ReplanInput {
            vips: &vips,
            rates: &rates,
            tenants: &tenants,
            nodes: &nodes,
        };
        let r = replan(&input, &CFG).unwrap();
        for t in &r.report.tenants {
            assert!(t.availability >= t.target, "{t:?}");
        }
    }

    #[test]
    fn small_gains_and_no_traffic_move_nothing() {
        let (vips, _) = skewed();
        let nodes = profiles(&[1, 2, 3]);
        let tenants = BTreeMap::new();
        let flat: BTreeMap<Ipv4Addr, Rate> = vips
            .keys()
            .map(|v| {
                (
                    *v,
                    Rate {
                        bps: 100e6,
                        pps: 1e5,
                    },
                )
            })
            .collect();
        let input = ReplanInput {
            vips: &vips,
            rates: &flat,
            tenants: &tenants,
            nodes: &nodes,
        };
        let r = replan(&input, &CFG).unwrap();
        assert!(r.report.moves.is_empty(), "{:?}", r.report);
        let planned = r.planned.unwrap();
        assert!(vips
            .iter()
            .all(|(v, rec)| rec.owner == Some(planned.target[v])));
        let none = BTreeMap::new();
        let input = ReplanInput {
            rates: &none,
            ..input
        };
        let r = replan(&input, &CFG).unwrap();
        assert_eq!(r.planned, None);
        assert_eq!(r.report.reason, "no traffic measured yet");
    }

    #[test]
    fn stay_keeps_every_placed_vip_where_it_is_going() {
        let mut vips: BTreeMap<Ipv4Addr, VipRecord> =
            [(vip(1), owned(1)), (vip(2), VipRecord::default())].into();
        vips.insert(
            vip(3),
            VipRecord {
                owner: Some(1),
                handoff_to: Some(2),
                handoff_revision: 5,
            },
        );
        let p = stay(&vips, 3);
        assert_eq!(p.target, [(vip(1), 1), (vip(3), 2)].into());
        assert_eq!(p.max_moves, 3);
    }

    #[test]
    fn vips_that_carry_nothing_never_move() {
        // Node 1 owns VIPs 1, 4 and 7; only 1 and 4 carry traffic, together over capacity.
        let (vips, _) = skewed();
        let rates: BTreeMap<Ipv4Addr, Rate> = [1u8, 4]
            .into_iter()
            .map(|i| {
                (
                    vip(i),
                    Rate {
                        bps: 700e6,
                        pps: 7e5,
                    },
                )
            })
            .collect();
        let nodes = profiles(&[1, 2, 3]);
        let tenants = BTreeMap::new();
        let cfg = ReplanConfig {
            target: TargetConfig {
                max_moves: 9,
                ..CFG.target
            },
            ..CFG
        };
        let r = replan(
            &ReplanInput {
                vips: &vips,
                rates: &rates,
                tenants: &tenants,
                nodes: &nodes,
            },
            &cfg,
        )
        .unwrap();
        assert_eq!(r.report.moves.len(), 1, "{:?}", r.report);
        let m = r.report.moves[0];
        assert!(m.vip == vip(1) || m.vip == vip(4), "{m:?}");
        assert_eq!(m.from, 1);
        let planned = r.planned.unwrap();
        let moved: Vec<_> = vips
            .iter()
            .filter(|(v, rec)| rec.owner != Some(planned.target[v]))
            .collect();
        assert_eq!(moved.len(), 1, "idle vips stay: {moved:?}");
        assert!(r.report.planned_worst < r.report.current_worst);
    }

    #[test]
    fn vips_of_a_dead_node_are_planned_onto_the_survivors() {
        let (mut vips, rates) = skewed();
        // Node 3 died; rules 1-4 have not moved its VIPs yet.
        let nodes = profiles(&[1, 2]);
        let tenants: BTreeMap<Ipv4Addr, String> =
            vips.keys().map(|v| (*v, "vni-7".to_owned())).collect();
        vips.insert(vip(9), owned(3));
        let input = ReplanInput {
            vips: &vips,
            rates: &rates,
            tenants: &tenants,
            nodes: &nodes,
        };
        let r = replan(&input, &CFG).unwrap();
        let planned = r.planned.unwrap();
        assert!(planned.target.values().all(|n| *n == 1 || *n == 2));
        assert_eq!(r.report.tenants.len(), 1);
        assert_eq!(r.report.tenants[0].tenant, "vni-7");
        assert_eq!(r.report.nodes.len(), 2);
    }
}
