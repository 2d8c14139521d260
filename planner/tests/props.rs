//! Properties on random instances: determinism for a seed, feasibility, the knapsack against
//! brute force, and the evaluation's bookkeeping.

use proptest::prelude::*;
use yard_planner::assign::knapsack_keep;
use yard_planner::baseline;
use yard_planner::eval::{self, Failover};
use yard_planner::family::{instance, Family, Shape};
use yard_planner::{plan, schedule, PlanOptions};

fn shape(tenants: usize, nodes: usize) -> Shape {
    Shape {
        tenants,
        nodes,
        units: 3,
        utilisation: 0.5,
    }
}

fn fam(i: usize) -> Family {
    Family::ALL[i % 3]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn a_seed_gives_the_same_plan(f in 0usize..3, t in 1usize..12, n in 2usize..7, seed in 0u64..1000) {
        let inst = instance(fam(f), shape(t, n), seed);
        let mut opts = PlanOptions::default();
        opts.assign.seed = seed;
        let a = plan(&inst, &opts).unwrap();
        let b = plan(&inst, &opts).unwrap();
        prop_assert_eq!(&a.assignment.sets, &b.assignment.sets);
        prop_assert_eq!(&a.placement.owner, &b.placement.owner);
        prop_assert_eq!(baseline::random(&inst, seed).owner, baseline::random(&inst, seed).owner);
    }

    #[test]
    fn every_vip_is_owned_by_a_node_of_its_set(f in 0usize..3, t in 1usize..40, n in 2usize..9, seed in 0u64..1000) {
        let inst = instance(fam(f), shape(t, n), seed);
        let mut opts = PlanOptions::default();
        opts.assign.seed = seed;
        opts.assign.exact_lp_limit = if seed % 2 == 0 { 2_000 } else { 0 };
        let p = plan(&inst, &opts).unwrap();
        for (t, owners) in p.placement.owner.iter().enumerate() {
            prop_assert_eq!(owners.len(), inst.tenants[t].units.len());
            for o in owners {
                prop_assert!(p.placement.sets[t].contains(o));
            }
        }
        for b in [baseline::round_robin(&inst), baseline::random(&inst, seed), baseline::least_loaded(&inst), baseline::reliability_first(&inst)] {
            for (t, owners) in b.owner.iter().enumerate() {
                prop_assert_eq!(b.sets[t].len(), inst.k[t]);
                for o in owners {
                    prop_assert!(b.sets[t].contains(o));
                }
            }
        }
    }

    #[test]
    fn knapsack_keeps_nearly_the_best_subset(items in prop::collection::vec(0.01f64..1.0, 1..12), cap in 0.2f64..3.0) {
        // (brute force over every subset)
        let steps = 2_000;
        let keep = knapsack_keep(&items, cap, steps);
        let kept: f64 = items.iter().zip(&keep).filter(|e| *e.1).map(|e| e.0).sum();
        prop_assert!(kept <= cap * (1.0 + 1e-12));
        // Weights are rounded up by less than cap/steps each, so the DP is exact against every
        // subset that fits in cap less one step per item (the FPTAS's trade).
        let shrunk = cap * (1.0 - items.len() as f64 / steps as f64);
        let mut best: f64 = 0.0;
        for mask in 0u32..(1 << items.len()) {
            let w: f64 = (0..items.len()).filter(|i| mask & (1 << i) != 0).map(|i| items[i]).sum();
            if w <= shrunk {
                best = best.max(w);
            }
        }
        prop_assert!(kept >= best - 1e-12);
    }

    #[test]
    fn the_worst_case_looks_at_every_combination(n in 2usize..8, f in 1usize..3, seed in 0u64..100) {
        let inst = instance(Family::Uniform, shape(6, n), seed);
        let p = baseline::least_loaded(&inst);
        let w = eval::worst(&inst, &p, f, seed);
        let f = f.min(n);
        let expect = (0..f).fold(1usize, |acc, i| acc * (n - i) / (i + 1));
        prop_assert!(w.exhaustive);
        prop_assert_eq!(w.scenarios, expect);
    }
}

#[test]
fn even_spread_balances_counts_and_fails_over_to_the_fewest() {
    let inst = instance(Family::HeavyTailed, shape(20, 4), 5);
    let p = baseline::even_spread(&inst);
    assert_eq!(p.failover, Failover::FewestVips);
    let mut count = [0usize; 4];
    p.owner.iter().flatten().for_each(|&n| count[n] += 1);
    assert!(count.iter().max().unwrap() - count.iter().min().unwrap() <= 1);
    let failed = [false, true, false, false];
    let (_, owner) = eval::loads_after(&inst, &p, &failed);
    let mut after = [0usize; 4];
    owner.iter().flatten().for_each(|n| after[n.unwrap()] += 1);
    assert_eq!(after[1], 0);
    let live = [after[0], after[2], after[3]];
    assert!(live.iter().max().unwrap() - live.iter().min().unwrap() <= 1);
}

#[test]
fn a_tenant_whose_set_is_down_spills_to_the_survivors() {
    let inst = instance(Family::Uniform, shape(3, 4), 1);
    let p = baseline::round_robin(&inst);
    let mut failed = vec![false; 4];
    for &n in &p.sets[0] {
        failed[n] = true;
    }
    let (_, owner) = eval::loads_after(&inst, &p, &failed);
    for n in &owner[0] {
        let n = n.expect("a survivor takes it");
        assert!(!failed[n] && !p.sets[0].contains(&n));
    }
    let o = eval::outcome(&inst, &p, &failed);
    assert_eq!(o.max_load <= 1.0, (o.served - 1.0).abs() < 1e-12);
    let all = eval::outcome(&inst, &p, &[true; 4]);
    assert_eq!(all.served, 0.0);
    // Served is whole exactly when no node is over its capacity.
    let none = eval::outcome(&inst, &p, &[false; 4]);
    assert_eq!(none.max_load <= 1.0, (none.served - 1.0).abs() < 1e-12);
}

#[test]
fn replan_after_a_death_moves_nothing_onto_the_dead_node() {
    let inst = instance(Family::HeavyTailed, shape(40, 6), 9);
    let p = plan(&inst, &PlanOptions::default()).unwrap();
    let mut alive = vec![true; 6];
    alive[2] = false;
    let s = yard_planner::replan(&inst, &p.assignment.sets, &alive, 0.01);
    assert!(s.owner.iter().flatten().all(|n| n.is_some_and(|n| n != 2)));
    let loads = schedule::scalar_loads(&inst, &s.owner);
    assert_eq!(loads[2], 0.0);
}
