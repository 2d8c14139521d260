//! Seeded instance families for the tests and the benchmark: deterministic for a seed, so a
//! figure can be reproduced and a failing case replayed.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::net::Ipv4Addr;

use crate::model::{Instance, Node, Tenant, Unit};

/// What varies between instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Equal nodes, equally reliable; VIP rates within ±50% of each other.
    Uniform,
    /// Equal nodes; VIP rates Pareto-distributed (α = 1.2, capped at 50× the scale): a few
    /// VIPs carry most of the traffic, as on real gateways.
    HeavyTailed,
    /// Nodes differ in capacity (0.5–2×) and failure probability (0.1%–10%, log-uniform);
    /// tenants ask for 99%, 99.9% or 99.99%.
    HeterogeneousReliability,
}

impl Family {
    pub const ALL: [Family; 3] = [
        Family::Uniform,
        Family::HeavyTailed,
        Family::HeterogeneousReliability,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Family::Uniform => "uniform",
            Family::HeavyTailed => "heavy-tailed",
            Family::HeterogeneousReliability => "hetero-reliability",
        }
    }
}

/// The shape of an instance.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub tenants: usize,
    pub nodes: usize,
    /// VIPs per tenant, drawn from 1..=units.
    pub units: usize,
    /// Total bytes/s as a fraction of the total capacity.
    pub utilisation: f64,
}

/// One instance of `family` with `shape`, from `seed`.
pub fn instance(family: Family, shape: Shape, seed: u64) -> Instance {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let nodes: Vec<Node> = (0..shape.nodes)
        .map(|i| {
            let (scale, p) = match family {
                Family::HeterogeneousReliability => (
                    rng.gen_range(0.5..2.0),
                    10f64.powf(rng.gen_range(-3.0..-1.0)),
                ),
                _ => (1.0, 0.01),
            };
            Node {
                id: format!("n{i}"),
                capacity_bps: 1.25e9 * scale,
                capacity_pps: 1.5e6 * scale,
                fail_prob: p,
            }
        })
        .collect();
    let mut vip = 0u32;
    let mut tenants: Vec<Tenant> = (0..shape.tenants)
        .map(|i| {
            let n = rng.gen_range(1..=shape.units.max(1));
            let units = (0..n)
                .map(|_| {
                    let bps: f64 = match family {
                        Family::HeavyTailed => {
                            let u: f64 = rng.gen_range(1e-9..1.0);
                            u.powf(-1.0 / 1.2).min(50.0)
                        }
                        _ => rng.gen_range(0.5..1.5),
                    };
                    let bytes_per_packet: f64 = rng.gen_range(400.0..1500.0);
                    vip += 1;
                    Unit {
                        id: Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 19, 0, 0)) + vip)
                            .to_string(),
                        bps,
                        pps: bps / bytes_per_packet,
                    }
                })
                .collect();
            let availability = match family {
                Family::HeterogeneousReliability => [0.99, 0.999, 0.9999][rng.gen_range(0..3)],
                _ => 0.999,
            };
            Tenant {
                id: format!("t{i}"),
                availability,
                replicas: 2,
                units,
            }
        })
        .collect();
    let cap: f64 = nodes.iter().map(|n| n.capacity_bps).sum();
    let total: f64 = tenants.iter().flat_map(|t| &t.units).map(|u| u.bps).sum();
    let k = shape.utilisation * cap / total;
    for u in tenants.iter_mut().flat_map(|t| t.units.iter_mut()) {
        u.bps *= k;
        u.pps *= k;
    }
    Instance::new(tenants, nodes).expect("a generated instance is valid")
}
