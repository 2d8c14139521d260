//! The LP relaxations and the exact ILPs, through good_lp with the pure-Rust microlp backend.
//!
//! The ILPs are oracles for tests and the benchmark on small instances (microlp's branch and
//! bound is exponential); the assignment LP is the first step of [`crate::assign`] where the
//! instance is small enough for a dense simplex.
//!
//! Loads are normalised by each node's capacity before they reach the solver, so every
//! coefficient is O(1) and the objective is the load factor λ itself.

use good_lp::{
    constraint, variable, Expression, ProblemVariables, Solution, SolverModel, Variable,
};

use crate::model::{Instance, PlanError};

fn solver_error(e: impl std::fmt::Display) -> PlanError {
    PlanError::Solver(e.to_string().to_lowercase())
}

/// The assignment problem of [`crate::assign`]: `min λ` subject to, for every tenant `t`,
/// `Σ_n x_tn = k_t` and (robust only) `Σ_n x_tn·(−ln p_n) ≥ −ln(1 − A_t)`, and for every node
/// `Σ_t x_tn·reserve_t / C_n ≤ λ`. With `integer` the `x` are binary (the exact optimum),
/// otherwise in [0, 1] (the relaxation, a lower bound on it). Returns `x` densely and `λ`.
pub fn assignment(
    inst: &Instance,
    robust: bool,
    integer: bool,
) -> Result<(Vec<Vec<f64>>, f64), PlanError> {
    let (nt, nn) = (inst.tenants.len(), inst.nodes.len());
    let mut vars = ProblemVariables::new();
    let lambda = vars.add(variable().min(0.0));
    let x: Vec<Vec<Variable>> = (0..nt)
        .map(|_| {
            (0..nn)
                .map(|_| {
                    if integer {
                        vars.add(variable().binary())
                    } else {
                        vars.add(variable().min(0.0).max(1.0))
                    }
                })
                .collect()
        })
        .collect();
    let mut model = vars.minimise(lambda).using(good_lp::microlp);
    for (t, row) in x.iter().enumerate() {
        let count: Expression = row.iter().sum();
        model = model.with(constraint!(count == inst.k[t] as f64));
        if robust && inst.need[t] > 0.0 {
            let cover: Expression = row.iter().zip(&inst.weight).map(|(&v, &w)| w * v).sum();
            model = model.with(constraint!(cover >= inst.need[t] * (1.0 - 1e-9)));
        }
    }
    for (n, cap) in inst.cap.iter().enumerate() {
        let load: Expression = x
            .iter()
            .enumerate()
            .map(|(t, row)| (inst.reserve(t, robust) / cap) * row[n])
            .sum();
        model = model.with(constraint!(load - lambda <= 0.0));
    }
    let sol = model.solve().map_err(solver_error)?;
    let xs = x
        .iter()
        .map(|row| row.iter().map(|&v| sol.value(v).clamp(0.0, 1.0)).collect())
        .collect();
    Ok((xs, sol.value(lambda)))
}

/// The nodes each unit may go to: its tenant's set, alive ones only. A unit with none is
/// left out of the scheduling problems (it cannot be served).
pub(crate) fn allowed(sets: &[Vec<usize>], alive: &[bool], t: usize) -> Vec<usize> {
    sets[t].iter().copied().filter(|&n| alive[n]).collect()
}

/// Exact unsplittable scheduling: every unit on exactly one alive node of its tenant's set,
/// minimising the max scalar load factor. Returns λ* and each unit's node (`None` for a unit
/// with no alive node).
pub fn schedule_unsplittable(
    inst: &Instance,
    sets: &[Vec<usize>],
    alive: &[bool],
) -> Result<(f64, crate::schedule::Owners), PlanError> {
    let mut vars = ProblemVariables::new();
    let lambda = vars.add(variable().min(0.0));
    let mut z: Vec<Vec<Vec<(usize, Variable)>>> = Vec::new();
    for (t, sizes) in inst.size.iter().enumerate() {
        let ok = allowed(sets, alive, t);
        z.push(
            sizes
                .iter()
                .map(|_| {
                    ok.iter()
                        .map(|&n| (n, vars.add(variable().binary())))
                        .collect()
                })
                .collect(),
        );
    }
    let mut model = vars.minimise(lambda).using(good_lp::microlp);
    let mut load: Vec<Expression> = vec![Expression::from(0.0); inst.nodes.len()];
    for (t, units) in z.iter().enumerate() {
        for (u, choices) in units.iter().enumerate() {
            if choices.is_empty() {
                continue;
            }
            let one: Expression = choices.iter().map(|&(_, v)| v).sum();
            model = model.with(constraint!(one == 1.0));
            for &(n, v) in choices {
                load[n] += (inst.size[t][u] / inst.cap[n]) * v;
            }
        }
    }
    for l in load {
        model = model.with(constraint!(l - lambda <= 0.0));
    }
    let sol = model.solve().map_err(solver_error)?;
    let owner = z
        .iter()
        .map(|units| {
            units
                .iter()
                .map(|choices| {
                    choices
                        .iter()
                        .max_by(|a, b| sol.value(a.1).total_cmp(&sol.value(b.1)))
                        .map(|&(n, _)| n)
                })
                .collect()
        })
        .collect();
    Ok((sol.value(lambda), owner))
}

/// Exact splittable scheduling (an LP): each tenant's whole demand split over the alive nodes
/// of its set, minimising the max scalar load factor. Tenants with no alive node are left out.
pub fn schedule_splittable(
    inst: &Instance,
    sets: &[Vec<usize>],
    alive: &[bool],
) -> Result<f64, PlanError> {
    let mut vars = ProblemVariables::new();
    let lambda = vars.add(variable().min(0.0));
    let mut y: Vec<Vec<(usize, Variable)>> = Vec::new();
    for t in 0..inst.tenants.len() {
        let ok = allowed(sets, alive, t);
        y.push(
            ok.iter()
                .map(|&n| (n, vars.add(variable().min(0.0).max(1.0))))
                .collect(),
        );
    }
    let mut model = vars.minimise(lambda).using(good_lp::microlp);
    let mut load: Vec<Expression> = vec![Expression::from(0.0); inst.nodes.len()];
    for (t, choices) in y.iter().enumerate() {
        if choices.is_empty() {
            continue;
        }
        let one: Expression = choices.iter().map(|&(_, v)| v).sum();
        model = model.with(constraint!(one == 1.0));
        for &(n, v) in choices {
            load[n] += (inst.demand[t] / inst.cap[n]) * v;
        }
    }
    for l in load {
        model = model.with(constraint!(l - lambda <= 0.0));
    }
    let sol = model.solve().map_err(solver_error)?;
    Ok(sol.value(lambda))
}
