//! The strategies the planner is measured against, in the same code and on the same model, so
//! that the benchmark compares placements and nothing else. Every baseline gives each tenant
//! the same number of nodes `k_t` as the planner (except today's even spread, which has no
//! sets).

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::eval::{Failover, Placement};
use crate::model::Instance;
use crate::schedule;

fn within_sets(inst: &Instance, sets: Vec<Vec<usize>>) -> Placement {
    let alive = vec![true; inst.nodes.len()];
    let owner = schedule::greedy(inst, &sets, &alive)
        .into_iter()
        .enumerate()
        .map(|(t, o)| o.into_iter().map(|n| n.unwrap_or(sets[t][0])).collect())
        .collect();
    Placement {
        sets,
        owner,
        failover: Failover::WithinSet,
    }
}

/// Tenant `i` gets nodes `i, i+1, …, i+k−1` (mod N); its VIPs go round the set in turn.
pub fn round_robin(inst: &Instance) -> Placement {
    let nn = inst.nodes.len();
    let sets: Vec<Vec<usize>> = (0..inst.tenants.len())
        .map(|t| {
            let mut s: Vec<usize> = (0..inst.k[t]).map(|j| (t + j) % nn).collect();
            s.sort_unstable();
            s
        })
        .collect();
    let owner = sets
        .iter()
        .enumerate()
        .map(|(t, s)| (0..inst.size[t].len()).map(|u| s[u % s.len()]).collect())
        .collect();
    Placement {
        sets,
        owner,
        failover: Failover::WithinSet,
    }
}

/// `k` distinct nodes drawn uniformly per tenant, each VIP on a uniform node of the set.
pub fn random(inst: &Instance, seed: u64) -> Placement {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let nodes: Vec<usize> = (0..inst.nodes.len()).collect();
    let sets: Vec<Vec<usize>> = (0..inst.tenants.len())
        .map(|t| {
            let mut s: Vec<usize> = nodes
                .choose_multiple(&mut rng, inst.k[t])
                .copied()
                .collect();
            s.sort_unstable();
            s
        })
        .collect();
    let owner = sets
        .iter()
        .enumerate()
        .map(|(t, s)| {
            (0..inst.size[t].len())
                .map(|_| s[rng.gen_range(0..s.len())])
                .collect()
        })
        .collect();
    Placement {
        sets,
        owner,
        failover: Failover::WithinSet,
    }
}

fn by_demand(inst: &Instance) -> Vec<usize> {
    let mut order: Vec<usize> = (0..inst.tenants.len()).collect();
    order.sort_by(|&a, &b| inst.demand[b].total_cmp(&inst.demand[a]).then(a.cmp(&b)));
    order
}

/// Greedy least-loaded (LPT): tenants by demand, largest first, each onto the `k` nodes with
/// the least load after adding its nominal share `d/k`; VIPs largest first within the set.
pub fn least_loaded(inst: &Instance) -> Placement {
    let mut load = vec![0.0; inst.nodes.len()];
    let mut sets = vec![Vec::new(); inst.tenants.len()];
    for t in by_demand(inst) {
        let share = inst.demand[t] / inst.k[t] as f64;
        let mut idx: Vec<usize> = (0..inst.nodes.len()).collect();
        idx.sort_by(|&a, &b| {
            ((load[a] + share) / inst.cap[a])
                .total_cmp(&((load[b] + share) / inst.cap[b]))
                .then(a.cmp(&b))
        });
        idx.truncate(inst.k[t]);
        idx.iter().for_each(|&n| load[n] += share);
        idx.sort_unstable();
        sets[t] = idx;
    }
    within_sets(inst, sets)
}

/// Reliability first: each tenant takes the most reliable nodes (ties: least loaded, then
/// lowest index) until it has `k`; VIPs largest first within the set.
pub fn reliability_first(inst: &Instance) -> Placement {
    let mut load = vec![0.0; inst.nodes.len()];
    let mut sets = vec![Vec::new(); inst.tenants.len()];
    for t in by_demand(inst) {
        let share = inst.demand[t] / inst.k[t] as f64;
        let mut idx: Vec<usize> = (0..inst.nodes.len()).collect();
        idx.sort_by(|&a, &b| {
            inst.nodes[a]
                .fail_prob
                .total_cmp(&inst.nodes[b].fail_prob)
                .then((load[a] / inst.cap[a]).total_cmp(&(load[b] / inst.cap[b])))
                .then(a.cmp(&b))
        });
        idx.truncate(inst.k[t]);
        idx.iter().for_each(|&n| load[n] += share);
        idx.sort_unstable();
        sets[t] = idx;
    }
    within_sets(inst, sets)
}

/// Sort key that puts VIPs in address order, as the gateway's `BTreeMap<Ipv4Addr, _>` does;
/// ids that are not addresses come after, in string order.
fn vip_key(id: &str) -> (u8, u32, String) {
    match id.parse::<std::net::Ipv4Addr>() {
        Ok(ip) => (0, u32::from(ip), String::new()),
        Err(_) => (1, 0, id.to_owned()),
    }
}

/// Today's gateway placement (actors/src/gateway/placement.rs): every node may own any VIP;
/// VIPs in address order each go to the node owning the fewest VIPs, ties to the lowest id
/// (rules 1 and 5: counts, not traffic, and not reliability). A failed node's VIPs go the same
/// way over the survivors (rule 2).
pub fn even_spread(inst: &Instance) -> Placement {
    let nn = inst.nodes.len();
    let mut units: Vec<(usize, usize)> = (0..inst.tenants.len())
        .flat_map(|t| (0..inst.tenants[t].units.len()).map(move |u| (t, u)))
        .collect();
    units.sort_by_cached_key(|&(t, u)| vip_key(&inst.tenants[t].units[u].id));
    let mut count = vec![0usize; nn];
    let mut owner: Vec<Vec<usize>> = inst.size.iter().map(|s| vec![0; s.len()]).collect();
    for (t, u) in units {
        let n = (0..nn).min_by_key(|&n| (count[n], n)).unwrap_or(0);
        count[n] += 1;
        owner[t][u] = n;
    }
    Placement {
        sets: vec![(0..nn).collect(); inst.tenants.len()],
        owner,
        failover: Failover::FewestVips,
    }
}
