//! The split planner: the gateway's plan under each profile, and the planner's ideal search
//! against exhaustive search over all subsets on random small pipelines (the oracle).

use proptest::prelude::*;
use yard_offload::elf::{MapDef, MapOrigin};
use yard_offload::gateway::{self, ops};
use yard_offload::insn::{helper, map_type};
use yard_offload::plan::{self, Access, Class, HostModel, MapUse, Op, Pipeline, StateVar};
use yard_offload::Profile;

fn profile(name: &str) -> Profile {
    Profile::by_name(name).expect("profile")
}

#[test]
fn gateway_pipeline_is_well_formed() {
    let p = gateway::pipeline();
    plan::validate(&p).expect("valid");
    let total: f64 = p.classes.iter().map(|c| c.share).sum();
    assert!((total - 1.0).abs() < 1e-9);
}

#[test]
fn gateway_on_nfp_offloads_the_fast_path_lookups_and_keeps_helpers_on_the_host() {
    let p = gateway::pipeline();
    let host = HostModel::default();
    let plan = plan::plan(&p, &profile("nfp"), &host).expect("plans");
    println!("{}", plan.human());
    let on_nic = |n: &str| plan.nic_ops.iter().any(|o| o == n);
    // bpf_fib_lookup and bpf_ktime_get_ns are not nfp helpers
    assert!(!on_nic("fib_fallback") && !on_nic("lease_check"));
    assert!(plan.host_reasons["fib_fallback"].contains("bpf_fib_lookup (69)"));
    assert!(plan.host_reasons["lease_check"].contains("bpf_ktime_get_ns (5)"));
    // the tunnel fast path's parsing and both lookups run on the NIC
    for n in [
        "config",
        "parse_eth",
        "outer_ipv4",
        "vip_check",
        "udp_vxlan",
        "inner_headers",
        "endpoint_lookup",
        "host_lookup",
    ] {
        assert!(on_nic(n), "{n} not on the NIC:\n{}", plan.human());
    }
    assert!(plan.nic_prog_insns_model <= plan.nic_prog_limit);
    assert!(plan.figures.throughput_pps > plan.host_only.throughput_pps);
    assert!(plan.speedup_vs_host_only > 1.0);
    assert!(plan.label.starts_with("MODEL"));
    // malformed frames and traffic for other hosts are decided on the NIC
    let class = |n: &str| plan.classes.iter().find(|c| c.class == n).expect("class");
    assert!(class("malformed").finishes_on_nic);
    assert!(class("not_for_a_vip").finishes_on_nic);
    // a host the daemon has not resolved goes to the host with what the NIC found
    let unresolved = class("forward_unresolved_host");
    assert_eq!(unresolved.on_host[0], "fib_fallback");
    assert!(unresolved.handoff.iter().any(|h| h == "host"));
    // read-only tables are replicated, never shared (an offloaded map is not host-reachable)
    assert!(plan.replicated_maps.iter().any(|m| m == "gw_vips"));
    // the planner's answer is the exhaustive search's
    let (mask, f) = plan::best_exhaustive(&p, &profile("nfp"), &host);
    assert_eq!(mask, plan.mask);
    assert_eq!(f.throughput_pps, plan.figures.throughput_pps);
    assert!(plan.best_prefix.throughput_pps <= plan.figures.throughput_pps);
}

#[test]
fn gateway_on_hxdp_keeps_the_big_endpoint_table_on_the_host() {
    let p = gateway::pipeline();
    let host = HostModel::default();
    let plan = plan::plan(&p, &profile("hxdp"), &host).expect("plans");
    assert!(!plan.nic_ops.iter().any(|o| o == "endpoint_lookup"));
    assert!(plan.host_reasons["endpoint_lookup"].contains("262144 entries"));
    let (mask, _) = plan::best_exhaustive(&p, &profile("hxdp"), &host);
    assert_eq!(mask, plan.mask);
}

#[test]
fn gateway_on_none_runs_everything_on_the_host() {
    let p = gateway::pipeline();
    let plan = plan::plan(&p, &profile("none"), &HostModel::default()).expect("plans");
    assert!(plan.nic_ops.is_empty());
    assert_eq!(plan.host_ops.len(), p.ops.len());
    assert_eq!(plan.speedup_vs_host_only, 1.0);
    assert_eq!(plan.figures.to_host_fraction, 1.0);
    let _ = ops::CONFIG;
}

#[test]
fn a_written_map_stays_with_all_its_users() {
    // op 0 reads m, op 1 (which needs a helper the nfp lacks) updates it: op 0 must stay too
    let mut p = random_pipeline(1, 2);
    p.maps = vec![MapDef {
        name: "m".into(),
        map_type: map_type::HASH,
        key_size: 4,
        value_size: 4,
        max_entries: 16,
        map_flags: 0,
        origin: MapOrigin::Btf,
    }];
    for (i, op) in p.ops.iter_mut().enumerate() {
        op.deps = if i == 1 { vec![0] } else { vec![] };
        op.helpers = if i == 1 {
            vec![helper::KTIME_GET_NS]
        } else {
            vec![]
        };
        op.actions = vec![];
        op.maps = vec![MapUse {
            map: "m".into(),
            access: if i == 1 {
                Access::HelperWrite
            } else {
                Access::Read
            },
        }];
    }
    p.classes = vec![Class {
        name: "all".into(),
        share: 1.0,
        path: vec![0, 1],
        action: 3,
    }];
    let plan = plan::plan(&p, &profile("nfp"), &HostModel::default()).expect("plans");
    assert!(plan.nic_ops.is_empty(), "{}", plan.human());
    assert!(
        plan.host_reasons["op0"].contains("a map it uses is written on the host side"),
        "{}",
        plan.human()
    );
    // read-only, the same map is simply replicated and op 0 moves
    p.ops[1].maps[0].access = Access::Read;
    let plan = plan::plan(&p, &profile("nfp"), &HostModel::default()).expect("plans");
    assert_eq!(plan.nic_ops, vec!["op0".to_owned()], "{}", plan.human());
    assert_eq!(plan.replicated_maps, vec!["m".to_owned()]);
}

#[test]
fn random_pipelines_offload_something_often() {
    // keeps the oracle property below from passing vacuously on all-host plans
    let host = HostModel::default();
    let nonzero = (0..300u64)
        .filter(|&s| {
            let p = random_pipeline(s, 1 + (s % 9) as usize);
            plan::best_exhaustive(&p, &profile("nfp"), &host).0 != 0
        })
        .count();
    assert!(
        nonzero > 100,
        "only {nonzero} of 300 random pipelines put anything on the NIC"
    );
}

/// splitmix64: a seeded generator for the random pipelines (proptest supplies the seed).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn random_pipeline(seed: u64, n: usize) -> Pipeline {
    let mut r = Rng(seed);
    let mk = |name: &str, t: u32, entries: u32| MapDef {
        name: name.into(),
        map_type: t,
        key_size: 4,
        value_size: 8,
        max_entries: entries,
        map_flags: 0,
        origin: MapOrigin::Btf,
    };
    let maps = vec![
        mk("h", map_type::HASH, 1000),
        mk("a", map_type::ARRAY, 10),
        mk("pc", map_type::PERCPU_ARRAY, 4),
    ];
    let mut ops = Vec::new();
    for i in 0..n {
        let deps: Vec<usize> = (0..i).filter(|_| r.chance(35)).collect();
        let mut helpers = vec![];
        if r.chance(10) {
            helpers.push(helper::KTIME_GET_NS);
        }
        if r.chance(10) {
            helpers.push(helper::MAP_LOOKUP_ELEM);
        }
        let mut uses = vec![];
        for m in ["h", "a", "pc"] {
            if r.chance(25) {
                uses.push(MapUse {
                    map: m.into(),
                    access: if r.chance(15) {
                        Access::HelperWrite
                    } else {
                        Access::Read
                    },
                });
            }
        }
        let mut actions: Vec<u64> = (1..=3).filter(|_| r.chance(30)).collect();
        if r.chance(5) {
            actions.push(4);
        }
        let earlier: Vec<String> = (0..i).map(|j| format!("v{j}")).collect();
        let inputs = earlier.into_iter().filter(|_| r.chance(30)).collect();
        ops.push(Op {
            name: format!("op{i}"),
            what: String::new(),
            deps,
            bpf_insns: 1 + r.below(300) as u32,
            stack_bytes: r.below(96) as u32,
            helpers,
            maps: uses,
            ctx_reads: if r.chance(5) { vec![12] } else { vec![0, 4] },
            max_pkt_offset: r.below(120) as u32,
            inputs,
            outputs: vec![StateVar {
                name: format!("v{i}"),
                bytes: 1 + r.below(8) as u32,
            }],
            actions,
        });
    }
    let nclasses = 1 + r.below(4) as usize;
    let mut classes = Vec::new();
    let mut total = 0.0;
    for c in 0..nclasses {
        // the path to a random op: its ancestors and itself, in index order
        let last = r.below(n as u64) as usize;
        let mut need = vec![false; n];
        need[last] = true;
        for i in (0..=last).rev() {
            if need[i] {
                for &d in &ops[i].deps {
                    need[d] = true;
                }
            }
        }
        let share = 1.0 + r.below(20) as f64;
        total += share;
        classes.push(Class {
            name: format!("c{c}"),
            share,
            path: (0..n).filter(|&i| need[i]).collect(),
            action: 1 + r.below(3),
        });
    }
    for c in &mut classes {
        c.share /= total;
    }
    Pipeline {
        name: format!("random-{seed}"),
        ops,
        maps,
        classes,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn ideal_search_matches_exhaustive_search(
        seed in any::<u64>(),
        n in 1usize..=9,
        prog_len in 50u64..3000,
        stack_max in 32u32..512,
        entries in prop::sample::select(vec![500u64, 5000]),
        which in prop::sample::select(vec!["nfp", "hxdp"]),
    ) {
        let p = random_pipeline(seed, n);
        plan::validate(&p).expect("the generator makes valid pipelines");
        let mut prof = profile(which);
        prof.max_prog_len = prog_len;
        prof.stack_max = stack_max;
        prof.max_total_entries = Some(entries);
        let host = HostModel::default();
        let (m1, f1) = plan::best_ideal(&p, &prof, &host);
        let (m2, f2) = plan::best_exhaustive(&p, &prof, &host);
        prop_assert_eq!(m1, m2);
        prop_assert_eq!(f1.throughput_pps.to_bits(), f2.throughput_pps.to_bits());
        // a prefix cut is one of the DAG cuts, so never better
        let (_, fp) = plan::best_prefix(&p, &prof, &host);
        prop_assert!(fp.throughput_pps <= f1.throughput_pps);
        // never worse than leaving everything on the host
        let plan = plan::plan(&p, &prof, &host).expect("plans");
        prop_assert!(plan.figures.throughput_pps >= plan.host_only.throughput_pps);
        prop_assert!(plan.nic_prog_insns_model <= prof.max_prog_len || plan.mask == 0);
    }
}
