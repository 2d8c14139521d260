//! The planner's input: tenants with their VIPs, and gateway (service) nodes.
//!
//! Traffic has two dimensions, bytes/s and packets/s, and a node has a capacity in each. The
//! algorithms plan in one *conservative scalar* so that max-flow and LP rounding apply as they
//! are: with `r = Σ capacity_bps / Σ capacity_pps` (bytes per packet the cluster can afford on
//! average), a unit's size is `max(bps, pps·r)` and a node's scalar capacity is
//! `min(capacity_bps, capacity_pps·r)`. Each real dimension's normalised load is at most the
//! scalar one, so a plan whose scalar load fits fits in both dimensions. The evaluation
//! ([`crate::eval`]) reports the true two-dimensional load.

use serde::Serialize;
use thiserror::Error;

/// Why an instance cannot be planned.
#[derive(Debug, Error, PartialEq)]
pub enum PlanError {
    /// Nothing to place traffic on.
    #[error("there are no nodes to plan on")]
    NoNodes,
    /// A node's field is out of range.
    #[error("node {id}: {what}")]
    BadNode { id: String, what: String },
    /// A tenant's field is out of range.
    #[error("tenant {id}: {what}")]
    BadTenant { id: String, what: String },
    /// Two nodes or two tenants or two VIPs share an id, which would make the output ambiguous.
    #[error("duplicate id {0}")]
    Duplicate(String),
    /// The LP or ILP solver gave up.
    #[error("the solver failed: {0}")]
    Solver(String),
}

/// A gateway node: what it can carry and how often it fails.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Node {
    pub id: String,
    /// Bytes per second it can forward.
    pub capacity_bps: f64,
    /// Packets per second it can forward.
    pub capacity_pps: f64,
    /// Probability that it is down at a given time (independent of other nodes), in [0, 1).
    pub fail_prob: f64,
}

/// A unit of traffic that one node owns at a time: a VIP.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unit {
    pub id: String,
    pub bps: f64,
    pub pps: f64,
}

/// A tenant (a VNI or a named group of VIPs) with an availability target.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tenant {
    pub id: String,
    /// Wanted probability that at least one of the tenant's nodes is up, in [0, 1).
    pub availability: f64,
    /// Nodes the tenant is spread over at least; raised when the availability target needs
    /// more. Two is the least that survives a failure.
    pub replicas: usize,
    pub units: Vec<Unit>,
}

/// Nodes per tenant when the input does not say: the least that survives a failure.
pub const DEFAULT_REPLICAS: usize = 2;

/// A validated instance with the derived figures every algorithm uses.
#[derive(Debug, Clone)]
pub struct Instance {
    pub tenants: Vec<Tenant>,
    pub nodes: Vec<Node>,
    /// Scalar size of each tenant's units (see the module docs).
    pub size: Vec<Vec<f64>>,
    /// Scalar demand of each tenant (sum of its units).
    pub demand: Vec<f64>,
    /// Scalar capacity of each node.
    pub cap: Vec<f64>,
    /// `−ln p` of each node: what it contributes to a tenant's availability cover.
    pub weight: Vec<f64>,
    /// `−ln(1 − A)` of each tenant, capped at what its `k` most reliable nodes can give.
    pub need: Vec<f64>,
    /// Nodes each tenant gets: `max(replicas, fewest most-reliable nodes meeting the target)`,
    /// at most the node count.
    pub k: Vec<usize>,
}

/// Failure probabilities are floored here so that `−ln p` stays finite.
const MIN_FAIL_PROB: f64 = 1e-12;

fn finite_nonneg(x: f64) -> bool {
    x.is_finite() && x >= 0.0
}

impl Instance {
    /// Validates and derives. Errors name the node or tenant and the field.
    pub fn new(tenants: Vec<Tenant>, nodes: Vec<Node>) -> Result<Instance, PlanError> {
        if nodes.is_empty() {
            return Err(PlanError::NoNodes);
        }
        let mut ids = std::collections::HashSet::new();
        for n in &nodes {
            let bad = |what: &str| PlanError::BadNode {
                id: n.id.clone(),
                what: what.into(),
            };
            if !(n.capacity_bps.is_finite() && n.capacity_bps > 0.0) {
                return Err(bad("capacity in bytes/s must be positive"));
            }
            if !(n.capacity_pps.is_finite() && n.capacity_pps > 0.0) {
                return Err(bad("capacity in packets/s must be positive"));
            }
            if !(n.fail_prob.is_finite() && (0.0..1.0).contains(&n.fail_prob)) {
                return Err(bad("failure probability must be in [0, 1)"));
            }
            if !ids.insert(format!("node {}", n.id)) {
                return Err(PlanError::Duplicate(format!("node {}", n.id)));
            }
        }
        for t in &tenants {
            let bad = |what: &str| PlanError::BadTenant {
                id: t.id.clone(),
                what: what.into(),
            };
            if !(t.availability.is_finite() && (0.0..1.0).contains(&t.availability)) {
                return Err(bad("availability must be in [0, 1)"));
            }
            if t.replicas == 0 {
                return Err(bad("replicas must be at least 1"));
            }
            if t.units.is_empty() {
                return Err(bad("it has no VIPs"));
            }
            for u in &t.units {
                if !finite_nonneg(u.bps) || !finite_nonneg(u.pps) {
                    return Err(bad(&format!(
                        "VIP {} has a negative or infinite rate",
                        u.id
                    )));
                }
                if !ids.insert(format!("vip {}", u.id)) {
                    return Err(PlanError::Duplicate(format!("VIP {}", u.id)));
                }
            }
            if !ids.insert(format!("tenant {}", t.id)) {
                return Err(PlanError::Duplicate(format!("tenant {}", t.id)));
            }
        }
        let r = nodes.iter().map(|n| n.capacity_bps).sum::<f64>()
            / nodes.iter().map(|n| n.capacity_pps).sum::<f64>();
        let size: Vec<Vec<f64>> = tenants
            .iter()
            .map(|t| t.units.iter().map(|u| u.bps.max(u.pps * r)).collect())
            .collect();
        let demand = size.iter().map(|s| s.iter().sum()).collect();
        let cap = nodes
            .iter()
            .map(|n| n.capacity_bps.min(n.capacity_pps * r))
            .collect();
        let weight: Vec<f64> = nodes
            .iter()
            .map(|n| -n.fail_prob.max(MIN_FAIL_PROB).ln())
            .collect();
        let mut sorted = weight.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let mut k = Vec::with_capacity(tenants.len());
        let mut need = Vec::with_capacity(tenants.len());
        for t in &tenants {
            let want = -(1.0 - t.availability).ln();
            let mut m = 0;
            let mut acc = 0.0;
            while m < sorted.len() && acc < want {
                acc += sorted[m];
                m += 1;
            }
            let kt = t.replicas.max(m).min(nodes.len());
            let best: f64 = sorted[..kt].iter().sum();
            k.push(kt);
            need.push(want.min(best));
        }
        Ok(Instance {
            tenants,
            nodes,
            size,
            demand,
            cap,
            weight,
            need,
            k,
        })
    }

    /// What tenant `t` reserves on each of its nodes. Robust: `d/(k−1)`, so that when any one
    /// of its `k` nodes fails the rest still hold its whole demand split evenly (a node shared
    /// by many tenants is charged as if each of them had lost another node: conservative).
    /// Non-robust: `d/k`, the nominal share.
    pub fn reserve(&self, t: usize, robust: bool) -> f64 {
        let k = self.k[t];
        if robust && k >= 2 {
            self.demand[t] / (k - 1) as f64
        } else {
            self.demand[t] / k as f64
        }
    }

    /// Probability that at least one node of `set` is up.
    pub fn availability(&self, set: &[usize]) -> f64 {
        1.0 - set
            .iter()
            .map(|&n| self.nodes[n].fail_prob)
            .product::<f64>()
    }

    /// Whether `set` meets tenant `t`'s (capped) availability cover.
    pub fn covers(&self, t: usize, set: &[usize]) -> bool {
        set.iter().map(|&n| self.weight[n]).sum::<f64>() >= self.need[t] * (1.0 - 1e-9)
    }

    /// Total number of units.
    pub fn unit_count(&self) -> usize {
        self.tenants.iter().map(|t| t.units.len()).sum()
    }
}
