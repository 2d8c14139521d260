//! The stated bounds against the exact optimum (good_lp + microlp) on every small instance of
//! seeded families, and the assignment's feasibility.

use yard_planner::family::{instance, Family, Shape};
use yard_planner::{assign, lp, schedule, AssignOptions, Instance};

const EPS: f64 = 0.01;
const TOL: f64 = 1e-6;

fn small(tenants: usize, nodes: usize, units: usize) -> Shape {
    Shape {
        tenants,
        nodes,
        units,
        utilisation: 0.5,
    }
}

/// Every instance of every family for seeds 0..count.
fn family(shape: Shape, count: u64) -> Vec<(Family, u64, Instance)> {
    Family::ALL
        .iter()
        .flat_map(|&f| (0..count).map(move |s| (f, s, instance(f, shape, s))))
        .collect()
}

fn all_alive(inst: &Instance) -> Vec<bool> {
    vec![true; inst.nodes.len()]
}

#[test]
fn splittable_is_within_one_plus_eps_of_the_lp() {
    for (f, seed, inst) in family(small(6, 4, 3), 12) {
        let sets = assign::assign(&inst, &AssignOptions::default())
            .unwrap()
            .sets;
        let mut alive = all_alive(&inst);
        for dead in [None, Some(0), Some(2)] {
            if let Some(d) = dead {
                alive[d] = false;
            }
            let opt = lp::schedule_splittable(&inst, &sets, &alive).unwrap();
            let got = schedule::splittable(&inst, &sets, &alive, EPS).lambda;
            assert!(
                got <= (1.0 + EPS) * opt * (1.0 + TOL) + TOL,
                "{f:?} seed {seed} dead {dead:?}: {got} > (1+ε)·{opt}"
            );
            assert!(
                got >= opt * (1.0 - TOL) - TOL,
                "{f:?} seed {seed}: {got} beat the LP {opt}"
            );
        }
    }
}

#[test]
fn unsplittable_is_within_two_plus_two_eps_of_the_ilp() {
    for (f, seed, inst) in family(small(4, 3, 3), 12) {
        let sets = assign::assign(&inst, &AssignOptions::default())
            .unwrap()
            .sets;
        let mut alive = all_alive(&inst);
        for dead in [None, Some(1)] {
            if let Some(d) = dead {
                alive[d] = false;
            }
            let (opt, _) = lp::schedule_unsplittable(&inst, &sets, &alive).unwrap();
            let got = schedule::unsplittable(&inst, &sets, &alive, EPS);
            assert!(
                got.lambda <= 2.0 * (1.0 + EPS) * opt * (1.0 + TOL) + TOL,
                "{f:?} seed {seed} dead {dead:?}: {} > (2+2ε)·{opt}",
                got.lambda
            );
            assert!(
                got.lambda >= opt * (1.0 - TOL) - TOL,
                "{f:?} seed {seed}: beat the ILP"
            );
            // The fractional T is (up to 1+ε) a lower bound on the optimum.
            assert!(got.fractional <= (1.0 + EPS) * opt * (1.0 + TOL) + TOL);
            for (t, units) in got.owner.iter().enumerate() {
                for n in units {
                    let n = n.expect("every unit has a live node here");
                    assert!(alive[n] && sets[t].contains(&n));
                }
            }
        }
    }
}

/// Many units, one node down: every unit on an allowed live node, and the LP-rounding bound
/// against the fractional T holds.
#[test]
fn unsplittable_places_every_unit_on_an_allowed_live_node() {
    let inst = instance(Family::HeavyTailed, small(30, 6, 4), 7);
    let sets = assign::assign(&inst, &AssignOptions::default())
        .unwrap()
        .sets;
    let mut alive = all_alive(&inst);
    alive[3] = false;
    let s = schedule::unsplittable(&inst, &sets, &alive, EPS);
    for (t, units) in s.owner.iter().enumerate() {
        let live: Vec<usize> = sets[t].iter().copied().filter(|&n| alive[n]).collect();
        for n in units {
            match n {
                Some(n) => assert!(live.contains(n)),
                None => assert!(live.is_empty()),
            }
        }
    }
    assert!(s.lambda <= 2.0 * (1.0 + EPS) * s.fractional * (1.0 + TOL) + TOL);
}

fn best_nodes(inst: &Instance, k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..inst.nodes.len()).collect();
    idx.sort_by(|&a, &b| inst.nodes[a].fail_prob.total_cmp(&inst.nodes[b].fail_prob));
    idx.truncate(k);
    idx
}

#[test]
fn assignment_is_feasible_and_between_the_lp_and_above_the_ilp() {
    for (f, seed, inst) in family(small(5, 4, 2), 8) {
        for robust in [true, false] {
            let opts = AssignOptions {
                robust,
                seed,
                ..AssignOptions::default()
            };
            let a = assign::assign(&inst, &opts).unwrap();
            assert!(a.exact_lp);
            let (_, ilp) = lp::assignment(&inst, robust, true).unwrap();
            assert!(
                a.relaxed <= ilp * (1.0 + TOL) + TOL,
                "{f:?} {seed}: LP above ILP"
            );
            assert!(
                a.lambda >= ilp * (1.0 - TOL) - TOL,
                "{f:?} {seed}: rounding beat the ILP"
            );
            for (t, set) in a.sets.iter().enumerate() {
                assert_eq!(set.len(), inst.k[t], "{f:?} {seed} tenant {t}");
                assert!(set.windows(2).all(|w| w[0] < w[1]), "sorted and distinct");
                if robust {
                    assert!(
                        inst.covers(t, set),
                        "{f:?} {seed}: tenant {t} misses its cover"
                    );
                    let reachable = inst.availability(&best_nodes(&inst, inst.k[t]));
                    assert!(
                        inst.availability(set)
                            >= inst.tenants[t].availability.min(reachable) - 1e-9
                    );
                }
            }
        }
    }
}

/// The robust reserve's promise, in the splittable model: after any one node fails, every
/// tenant's whole demand fits on its survivors within the assignment's robust load factor.
#[test]
fn robust_sets_absorb_any_single_failure() {
    for (f, seed, inst) in family(small(8, 5, 3), 8) {
        let a = assign::assign(&inst, &AssignOptions::default()).unwrap();
        for dead in 0..inst.nodes.len() {
            let mut alive = all_alive(&inst);
            alive[dead] = false;
            let s = schedule::splittable(&inst, &a.sets, &alive, EPS);
            assert!(
                s.lambda <= a.lambda * (1.0 + EPS) * (1.0 + TOL) + TOL,
                "{f:?} {seed} node {dead} died: {} over the reserved {}",
                s.lambda,
                a.lambda
            );
            for (t, share) in s.share.iter().enumerate() {
                let total: f64 = share.iter().map(|e| e.1).sum();
                assert!((total - 1.0).abs() < 1e-6, "tenant {t} fully served");
            }
        }
    }
}

#[test]
fn the_large_path_is_feasible_too() {
    let inst = instance(Family::HeterogeneousReliability, small(300, 20, 3), 3);
    let a = assign::assign(&inst, &AssignOptions::default()).unwrap();
    assert!(!a.exact_lp);
    for (t, set) in a.sets.iter().enumerate() {
        assert_eq!(set.len(), inst.k[t]);
        assert!(set.windows(2).all(|w| w[0] < w[1]));
        assert!(inst.covers(t, set));
    }
}
