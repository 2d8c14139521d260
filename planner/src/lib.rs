//! Robust service mapping (after RSMP, IEEE/ACM ToN 2022): which gateway nodes serve each
//! tenant, and which node owns each VIP, so that after any single node failure no survivor is
//! pushed past its capacity and each tenant keeps its availability target.
//!
//! Two timescales, each a pure function of its input (no I/O, no clock; randomness only from a
//! seed):
//! - [`assign`] (slow): each tenant's node set — LP relaxation, seeded randomized rounding,
//!   knapsack repair; availability is a covering constraint on `−ln p`, and the load each
//!   tenant reserves on a node leaves room for one of its nodes to fail.
//! - [`schedule`] (fast): given the sets and the live nodes, splittable traffic by max-flow
//!   with binary search (within 1 + ε of the LP), unsplittable VIPs by LP rounding (within
//!   2(1 + ε) of the optimum).
//!
//! [`grouping`] groups an aggregation job's workers into a tree of aggregators by measured
//! bandwidth (ALEPH). [`baseline`] holds the strategies it is compared with, [`eval`] the failure evaluation,
//! [`lp`] the solver models (also the exact ILP oracles), [`parse`] the offline file formats.

pub mod assign;
pub mod baseline;
pub mod eval;
pub mod family;
mod flow;
pub mod grouping;
pub mod lp;
pub mod model;
pub mod parse;
pub mod schedule;

pub use assign::{AssignOptions, Assignment};
pub use eval::{Failover, Placement};
pub use model::{Instance, Node, PlanError, Tenant, Unit};

/// Options of the whole plan.
#[derive(Debug, Clone)]
pub struct PlanOptions {
    pub assign: AssignOptions,
    /// The schedulers' precision.
    pub epsilon: f64,
}

impl Default for PlanOptions {
    fn default() -> PlanOptions {
        PlanOptions {
            assign: AssignOptions::default(),
            epsilon: 0.01,
        }
    }
}

/// A plan: the assignment, the VIP schedule on it, and the placement both give.
#[derive(Debug, Clone)]
pub struct ServicePlan {
    pub assignment: Assignment,
    pub schedule: schedule::Unsplittable,
    pub placement: Placement,
}

/// Assigns node sets, then schedules every VIP onto one node of its tenant's set.
pub fn plan(inst: &Instance, opts: &PlanOptions) -> Result<ServicePlan, PlanError> {
    let assignment = assign::assign(inst, &opts.assign)?;
    let alive = vec![true; inst.nodes.len()];
    let schedule = schedule::unsplittable(inst, &assignment.sets, &alive, opts.epsilon);
    let placement = placement_of(&assignment.sets, &schedule.owner);
    Ok(ServicePlan {
        assignment,
        schedule,
        placement,
    })
}

/// The placement of a schedule in which every unit has a node.
pub fn placement_of(sets: &[Vec<usize>], owner: &[Vec<Option<usize>>]) -> Placement {
    Placement {
        sets: sets.to_vec(),
        owner: owner
            .iter()
            .enumerate()
            .map(|(t, o)| o.iter().map(|n| n.unwrap_or(sets[t][0])).collect())
            .collect(),
        failover: Failover::WithinSet,
    }
}

/// Re-plan after failures: the VIPs are rescheduled over each tenant's surviving nodes (the
/// sets stay; a tenant whose nodes all died keeps no VIP placed).
pub fn replan(
    inst: &Instance,
    sets: &[Vec<usize>],
    alive: &[bool],
    epsilon: f64,
) -> schedule::Unsplittable {
    schedule::unsplittable(inst, sets, alive, epsilon)
}

/// The exact ILP assignment (small instances only), scheduled like the planner's.
pub fn exact(inst: &Instance, robust: bool, epsilon: f64) -> Result<ServicePlan, PlanError> {
    let (x, lambda) = lp::assignment(inst, robust, true)?;
    let sets: Vec<Vec<usize>> = x
        .iter()
        .map(|row| (0..row.len()).filter(|&n| row[n] > 0.5).collect())
        .collect();
    let alive = vec![true; inst.nodes.len()];
    let schedule = schedule::unsplittable(inst, &sets, &alive, epsilon);
    let placement = placement_of(&sets, &schedule.owner);
    let reserved = assign::reserved_load(inst, &sets, robust);
    Ok(ServicePlan {
        assignment: Assignment {
            relaxed: lambda,
            exact_lp: true,
            lambda: reserved.iter().copied().fold(0.0, f64::max),
            sets,
        },
        schedule,
        placement,
    })
}
