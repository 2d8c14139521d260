//! The gateway's forwarding function (ebpf/bpf/gateway.bpf.c) as a pipeline of primitive ops,
//! for the planner. Each op is one step of that program in source order, with the maps,
//! helpers, context fields and packet offsets its code uses there; instruction counts are
//! ESTIMATES apportioned from the compiled object (1126 reachable instructions in all, about
//! 190 of them the per-exit counters, which both sides pay on their own). The traffic mix is
//! ASSUMED: an east-west gateway in steady state, nearly all tunnel frames to known hosts.

use crate::elf::{MapDef, MapOrigin};
use crate::insn::{helper, map_type};
use crate::plan::{Access, Class, MapUse, Op, Pipeline, StateVar};

const DROP: u64 = 1;
const PASS: u64 = 2;
const TX: u64 = 3;

fn map(name: &str, t: u32, key: u32, value: u32, entries: u32) -> MapDef {
    MapDef {
        name: name.to_owned(),
        map_type: t,
        key_size: key,
        value_size: value,
        max_entries: entries,
        map_flags: 0,
        origin: MapOrigin::Btf,
    }
}

fn reads(names: &[&str]) -> Vec<MapUse> {
    names
        .iter()
        .map(|n| MapUse {
            map: (*n).to_owned(),
            access: Access::Read,
        })
        .collect()
}

fn vars(v: &[(&str, u32)]) -> Vec<StateVar> {
    v.iter()
        .map(|(n, b)| StateVar {
            name: (*n).to_owned(),
            bytes: *b,
        })
        .collect()
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

#[allow(clippy::too_many_arguments)]
fn op(
    name: &str,
    what: &str,
    deps: &[usize],
    bpf_insns: u32,
    maps: &[&str],
    helpers: &[i32],
    max_pkt_offset: u32,
    inputs: &[&str],
    outputs: &[(&str, u32)],
    actions: &[u64],
) -> Op {
    Op {
        name: name.to_owned(),
        what: what.to_owned(),
        deps: deps.to_vec(),
        bpf_insns,
        stack_bytes: 8,
        helpers: helpers.to_vec(),
        maps: reads(maps),
        ctx_reads: vec![0, 4],
        max_pkt_offset,
        inputs: strs(inputs),
        outputs: vars(outputs),
        actions: actions.to_vec(),
    }
}

/// Op indices, for the classes below and for tests.
pub mod ops {
    pub const CONFIG: usize = 0;
    pub const PARSE_ETH: usize = 1;
    pub const ARP_OUTER: usize = 2;
    pub const LEASE_CHECK: usize = 3;
    pub const ARP_REPLY: usize = 4;
    pub const OUTER_IPV4: usize = 5;
    pub const VIP_CHECK: usize = 6;
    pub const UDP_VXLAN: usize = 7;
    pub const INNER_HEADERS: usize = 8;
    pub const INNER_ARP: usize = 9;
    pub const ENDPOINT_LOOKUP: usize = 10;
    pub const HOST_LOOKUP: usize = 11;
    pub const FIB_FALLBACK: usize = 12;
    pub const REWRITE: usize = 13;
    pub const CHECKSUM: usize = 14;
    pub const VERDICT_TX: usize = 15;
}

pub fn pipeline() -> Pipeline {
    use ops::*;
    let mut o = vec![
        op(
            "config",
            "gw_config[0] lookup; not configured -> PASS",
            &[],
            10,
            &["gw_config"],
            &[],
            0,
            &[],
            &[("cfg_mac", 6), ("mtu", 2)],
            &[PASS],
        ),
        op(
            "parse_eth",
            "Ethernet header bounds check and EtherType",
            &[],
            12,
            &[],
            &[],
            14,
            &[],
            &[("eth_proto", 2)],
            &[DROP],
        ),
        op(
            "arp_outer",
            "outer ARP request parse and VIP lookup",
            &[PARSE_ETH],
            50,
            &["gw_vips"],
            &[],
            42,
            &["eth_proto"],
            &[("arp_tip", 4), ("vip_mode", 4)],
            &[PASS],
        ),
        op(
            "lease_check",
            "the node's lease deadline against bpf_ktime_get_ns: fence ARP",
            &[CONFIG, ARP_OUTER],
            12,
            &["gw_config"],
            &[helper::KTIME_GET_NS],
            0,
            &["vip_mode"],
            &[],
            &[DROP, PASS],
        ),
        op(
            "arp_reply",
            "ARP reply rewritten in place",
            &[LEASE_CHECK],
            70,
            &[],
            &[],
            42,
            &["cfg_mac", "arp_tip"],
            &[],
            &[TX],
        ),
        op(
            "outer_ipv4",
            "outer IPv4 bounds, version and IHL",
            &[CONFIG, PARSE_ETH],
            30,
            &[],
            &[],
            34,
            &["eth_proto"],
            &[("vip", 4)],
            &[DROP],
        ),
        op(
            "vip_check",
            "destination VIP lookup and our-MAC check",
            &[OUTER_IPV4],
            40,
            &["gw_vips"],
            &[],
            34,
            &["vip", "cfg_mac"],
            &[],
            &[PASS],
        ),
        op(
            "udp_vxlan",
            "outer options, fragments, MTU and total length; UDP port 4789; the VXLAN header; \
             the (VNI, outer source) pair registered",
            &[VIP_CHECK],
            103,
            &["gw_sources"],
            &[],
            50,
            &["mtu"],
            &[("vni", 4), ("tot_len", 2)],
            &[PASS, DROP],
        ),
        op(
            "inner_headers",
            "inner Ethernet and IPv4: lengths, options, fragments, TTL",
            &[UDP_VXLAN],
            90,
            &[],
            &[],
            84,
            &[],
            &[("inner_daddr", 4)],
            &[DROP],
        ),
        op(
            "inner_arp",
            "inner ARP answered for an endpoint, sent back through the tunnel",
            &[INNER_HEADERS],
            170,
            &["gw_endpoints"],
            &[],
            92,
            &["vni", "cfg_mac", "vip"],
            &[],
            &[TX, DROP],
        ),
        op(
            "endpoint_lookup",
            "(VNI, inner IPv4) -> endpoint MAC and compute host",
            &[INNER_HEADERS],
            35,
            &["gw_endpoints"],
            &[],
            84,
            &["vni", "inner_daddr"],
            &[("ep_mac", 6), ("host", 4)],
            &[DROP],
        ),
        op(
            "host_lookup",
            "compute host -> next-hop MAC",
            &[ENDPOINT_LOOKUP],
            25,
            &["gw_hosts"],
            &[],
            0,
            &["host"],
            &[("next_hop_mac", 6)],
            &[],
        ),
        op(
            "fib_fallback",
            "bpf_fib_lookup for a host the daemon has not resolved yet",
            &[HOST_LOOKUP],
            80,
            &[],
            &[helper::FIB_LOOKUP],
            0,
            &["host", "vip", "tot_len"],
            &[("next_hop_mac", 6)],
            &[DROP, PASS],
        ),
        op(
            "rewrite",
            "inner destination MAC, TTL - 1 (RFC 1624), outer re-addressing",
            &[CONFIG, HOST_LOOKUP],
            110,
            &[],
            &[],
            84,
            &["ep_mac", "next_hop_mac", "host", "vip", "cfg_mac"],
            &[],
            &[],
        ),
        op(
            "checksum",
            "outer IPv4 header checksum over 20 bytes",
            &[REWRITE],
            45,
            &[],
            &[],
            34,
            &[],
            &[],
            &[],
        ),
        op(
            "verdict_tx",
            "count and XDP_TX",
            &[CHECKSUM],
            4,
            &[],
            &[],
            0,
            &[],
            &[],
            &[TX],
        ),
    ];
    // bpf_fib_lookup reads xdp_md.ingress_ifindex (gateway.bpf.c: fib.ifindex)
    o[FIB_FALLBACK].ctx_reads.push(12);
    o[FIB_FALLBACK].stack_bytes = 64; // struct bpf_fib_lookup on the stack
    let fwd = vec![
        CONFIG,
        PARSE_ETH,
        OUTER_IPV4,
        VIP_CHECK,
        UDP_VXLAN,
        INNER_HEADERS,
        ENDPOINT_LOOKUP,
        HOST_LOOKUP,
        REWRITE,
        CHECKSUM,
        VERDICT_TX,
    ];
    let mut unresolved = fwd.clone();
    unresolved.insert(8, FIB_FALLBACK);
    let class = |name: &str, share: f64, path: Vec<usize>, action: u64| Class {
        name: name.to_owned(),
        share,
        path,
        action,
    };
    Pipeline {
        name: "yard_gateway".into(),
        ops: o,
        // ebpf/bpf/yard.h sizes; gw_counters is left out: each side keeps its own counters
        maps: vec![
            map("gw_config", map_type::ARRAY, 4, 16, 1),
            map("gw_vips", map_type::HASH, 4, 4, 4096),
            map("gw_endpoints", map_type::HASH, 8, 12, 262_144),
            map("gw_sources", map_type::HASH, 8, 4, 262_144),
            map("gw_hosts", map_type::HASH, 4, 8, 65_536),
        ],
        classes: vec![
            class("forward", 0.93, fwd, TX),
            class("forward_unresolved_host", 0.005, unresolved, PASS),
            class(
                "inner_arp",
                0.005,
                vec![
                    CONFIG,
                    PARSE_ETH,
                    OUTER_IPV4,
                    VIP_CHECK,
                    UDP_VXLAN,
                    INNER_HEADERS,
                    INNER_ARP,
                ],
                TX,
            ),
            class(
                "outer_arp",
                0.005,
                vec![CONFIG, PARSE_ETH, ARP_OUTER, LEASE_CHECK, ARP_REPLY],
                TX,
            ),
            class(
                "not_for_a_vip",
                0.04,
                vec![CONFIG, PARSE_ETH, OUTER_IPV4, VIP_CHECK],
                PASS,
            ),
            class(
                "malformed",
                0.015,
                vec![CONFIG, PARSE_ETH, OUTER_IPV4],
                DROP,
            ),
        ],
    }
}

/// The cut the daemon's built-in split parts are generated for (`ebpf/bpf/oxdp_*.bpf.c`,
/// [`crate::gen::FILES`]): the planner's choice for the nfp profile and the default host
/// model, the one real SmartNIC the profiles describe from its driver.
pub fn default_cut() -> u64 {
    let p = pipeline();
    crate::plan::best_ideal(
        &p,
        &crate::profile::nfp(),
        &crate::plan::HostModel::default(),
    )
    .0
}
