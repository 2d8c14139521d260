//! `#[repr(C)]` mirrors of the structs in `bpf/yard.h` (gateway, probe and aggregator sections).
//!
//! The header asserts every size and field offset with `_Static_assert`; the constants and the
//! compile-time assertions here state the same numbers, so a change made on one side only fails
//! the build (C) or this crate's build (Rust). Keep the two in step by hand: both are short.
//!
//! Byte order follows the header: IPv4 addresses are stored in network order (the bytes of
//! `Ipv4Addr::octets()` read as a native `u32`), everything else in host order.

// aya reads and writes map keys and values as raw bytes, which is what its `Pod` marker promises
// is sound; implementing an `unsafe trait` needs `unsafe impl`.
#![allow(unsafe_code)]

use std::mem::{offset_of, size_of};
use std::net::Ipv4Addr;

/// `struct gw_config`: the single entry of `gw_config`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GwConfig {
    /// MAC of the gateway interface: the source of every frame the program sends.
    pub mac: [u8; 6],
    /// Largest outer L3 size accepted; 0 = never configured (the program passes everything).
    pub mtu: u16,
    /// `bpf_ktime_get_ns()` value from which on the node serves no VIP.
    pub lease_deadline_ns: u64,
}

/// `struct gw_vip`: value of `gw_vips` (key: VIP, network order).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GwVip {
    /// [`VIP_OWNED`] or [`VIP_FORWARD_ONLY`].
    pub mode: u32,
}

/// `struct gw_ep_key`: key of `gw_endpoints`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GwEpKey {
    /// VNI, host order, 24 bits.
    pub vni: u32,
    /// Tenant IPv4, network order.
    pub ip: u32,
}

/// `struct gw_ep`: value of `gw_endpoints`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GwEp {
    /// Tenant MAC.
    pub mac: [u8; 6],
    /// Always 0.
    pub pad: u16,
    /// Compute host's underlay IPv4, network order.
    pub host: u32,
}

/// `struct gw_host`: value of `gw_hosts` (key: host IPv4, network order).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GwHost {
    /// MAC of the compute host's underlay interface: the next hop.
    pub mac: [u8; 6],
    /// Always 0.
    pub pad: u16,
}

/// `struct gw_counter`: value of `gw_counters` per CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GwCounter {
    pub packets: u64,
    pub bytes: u64,
}

/// `struct peers_key`: key of `peers`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PeersKey {
    /// The remote host's IPv4, network order.
    pub peer: u32,
    /// [`PEERS_DIR_INGRESS`] or [`PEERS_DIR_EGRESS`].
    pub dir: u8,
    /// Always 0 (hashed as part of the key).
    pub pad: [u8; 3],
}

/// `struct peers_value`: value of `peers` per CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeersValue {
    /// Ethernet frame bytes as TC sees them.
    pub bytes: u64,
    /// Wire packets (a GSO packet counts its segments).
    pub packets: u64,
    /// `bpf_ktime_get_ns()` of the latest packet counted on this CPU.
    pub last_ns: u64,
}

/// `struct agg_job`: value of `agg_jobs` (key: job id).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AggJob {
    pub epoch: u32,
    /// First slot of the job's range in `agg_slots`.
    pub base: u32,
    pub chunks: u32,
    pub values: u32,
    pub chunk_values: u16,
    /// Contributions that complete a chunk.
    pub workers: u16,
    /// `enum agg_dtype`.
    pub dtype: u8,
    pub pad: [u8; 3],
    /// Address results are sent from, network order.
    pub self_ip: u32,
    /// A cluster aggregator's parent (network order); 0 at the root or a flat job's aggregator.
    pub parent_ip: u32,
    /// Network order.
    pub parent_port: u16,
    /// This host's worker index in the parent's sums.
    pub parent_worker: u16,
    /// Next hop toward the parent.
    pub parent_mac: [u8; 6],
    pub pad2: [u8; 2],
    /// The loader's fan-out tag ([`crate::Aggregator`]): the program writes it into the fresh
    /// results it hands to the fan-out, which clones only frames that carry it.
    pub fanout_tag: u32,
    /// The token of this aggregator's RESULT frames.
    pub result_token: u32,
    /// A cluster aggregator's token at its parent.
    pub up_token: u32,
    /// A cluster aggregator's parent's result token.
    pub parent_token: u32,
}

/// `struct agg_member_key`: key of `agg_members`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AggMemberKey {
    pub job: u32,
    /// Network order.
    pub ip: u32,
    /// Network order.
    pub port: u16,
    pub pad: u16,
}

/// `struct agg_member`: value of `agg_members`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AggMember {
    pub worker: u16,
    pub pad: u16,
    /// The token the member's frames must carry.
    pub token: u32,
}

/// `struct agg_peer_key`: key of `agg_peers`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AggPeerKey {
    pub job: u32,
    pub worker: u32,
}

/// `struct agg_peer`: value of `agg_peers`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AggPeer {
    /// Network order.
    pub ip: u32,
    /// Network order.
    pub port: u16,
    /// Learnt by the program from the worker's frames; 0 until then.
    pub mac: [u8; 6],
    pub pad: u32,
    /// The program's arrival timing of the member's frames (`struct agg_peer` in `yard.h`):
    /// monotonic ns of the latest, and the gaps and bytes of those that came in bursts.
    pub last_ns: u64,
    pub busy_ns: u64,
    pub bytes: u64,
}

/// `struct agg_job_counter_key`: key of `agg_job_counters`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AggJobCounterKey {
    pub job: u32,
    pub reason: u32,
}

/// `AGG_VALUES_MAX`.
pub const AGG_VALUES_MAX: usize = 768;
/// `AGG_JOBS_MAX`.
pub const AGG_JOBS_MAX: u32 = 1024;
/// `AGG_MEMBERS_MAX`.
pub const AGG_MEMBERS_MAX: u32 = 65_536;
/// `AGG_COUNTER_MAX`.
pub const AGG_COUNTER_MAX: u32 = 16;

/// `struct agg_slot`: value of `agg_slots`, one chunk of one round parity of one job.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AggSlot {
    /// `struct bpf_spin_lock`: the kernel leaves it out of copies to and from user space.
    pub lock: u32,
    pub job: u32,
    pub epoch: u32,
    pub round: u32,
    pub seen: u64,
    pub count: u16,
    pub values: u16,
    pub exp: i8,
    /// `enum agg_slot_state`.
    pub done: u8,
    /// The flags a forwarded partial sum went up with.
    pub up_flags: u8,
    pub pad: u8,
    pub acc: [i32; AGG_VALUES_MAX],
}

impl Default for AggSlot {
    fn default() -> Self {
        AggSlot {
            lock: 0,
            job: 0,
            epoch: 0,
            round: 0,
            seen: 0,
            count: 0,
            values: 0,
            exp: 0,
            done: 0,
            up_flags: 0,
            pad: 0,
            acc: [0; AGG_VALUES_MAX],
        }
    }
}

/// `struct agg_partial` (bpf/aggregator.bpf.c, the per-CPU sum strategy only): one CPU's part of
/// one slot's sum.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AggPartial {
    /// Contributions summed on this CPU this round; 0: `exp` and `acc` are free.
    pub count: u32,
    pub exp: i8,
    pub pad: [u8; 3],
    pub acc: [i32; AGG_VALUES_MAX],
}

impl Default for AggPartial {
    fn default() -> Self {
        AggPartial {
            count: 0,
            exp: 0,
            pad: [0; 3],
            acc: [0; AGG_VALUES_MAX],
        }
    }
}

// SAFETY: each type is `#[repr(C)]`, made only of integers and integer arrays, has no padding
// (asserted below: the sizes equal the sum of the fields) and every bit pattern is a valid value,
// so reading it from and writing it to map bytes is sound.
unsafe impl aya::Pod for GwConfig {}
// SAFETY: as above.
unsafe impl aya::Pod for GwVip {}
// SAFETY: as above.
unsafe impl aya::Pod for GwEpKey {}
// SAFETY: as above.
unsafe impl aya::Pod for GwEp {}
// SAFETY: as above.
unsafe impl aya::Pod for GwHost {}
// SAFETY: as above.
unsafe impl aya::Pod for GwCounter {}
// SAFETY: as above.
unsafe impl aya::Pod for PeersKey {}
// SAFETY: as above.
unsafe impl aya::Pod for PeersValue {}
// SAFETY: as above.
unsafe impl aya::Pod for AggJob {}
// SAFETY: as above.
unsafe impl aya::Pod for AggMemberKey {}
// SAFETY: as above.
unsafe impl aya::Pod for AggMember {}
// SAFETY: as above.
unsafe impl aya::Pod for AggPeerKey {}
// SAFETY: as above.
unsafe impl aya::Pod for AggPeer {}
// SAFETY: as above.
unsafe impl aya::Pod for AggJobCounterKey {}
// SAFETY: as above (the lock is a u32 the kernel owns; user space never writes it).
unsafe impl aya::Pod for AggSlot {}
// SAFETY: as above.
unsafe impl aya::Pod for AggPartial {}

/// `GW_VIP_OWNED`.
pub const VIP_OWNED: u32 = 1;
/// `GW_VIP_FORWARD_ONLY`.
pub const VIP_FORWARD_ONLY: u32 = 2;

/// `GW_VIPS_MAX`.
pub const VIPS_MAX: u32 = 4096;
/// `GW_ENDPOINTS_MAX`.
pub const ENDPOINTS_MAX: u32 = 262_144;
/// `GW_HOSTS_MAX`.
pub const HOSTS_MAX: u32 = 65_536;
/// `GW_SOURCES_MAX`: `GW_ENDPOINTS_MAX` (a (VNI, host) pair comes from at least one endpoint).
pub const SOURCES_MAX: u32 = ENDPOINTS_MAX;
/// `GW_COUNTER_MAX`.
pub const COUNTER_MAX: u32 = 20;

/// `PEERS_DIR_INGRESS`.
pub const PEERS_DIR_INGRESS: u8 = 0;
/// `PEERS_DIR_EGRESS`.
pub const PEERS_DIR_EGRESS: u8 = 1;
/// `PEERS_MAX`.
pub const PEERS_MAX: u32 = 4096;
/// `PEERS_PORTS_MAX`.
pub const PEERS_PORTS_MAX: u32 = 1024;
/// `PEERS_COUNTER_MAX`.
pub const PEERS_COUNTER_MAX: u32 = 8;

/// The VXLAN UDP port the gateway listens on and sends to (`YARD_VXLAN_PORT`).
pub const VXLAN_PORT: u16 = 4789;
/// TTL of every outer IPv4 header the gateway emits (`YARD_OUTER_TTL`).
pub const OUTER_TTL: u8 = 64;

/// One struct's layout as `yard.h` asserts it: name, size, and (field, offset) pairs.
#[derive(Debug)]
pub struct Layout {
    pub name: &'static str,
    pub size: usize,
    pub fields: &'static [(&'static str, usize)],
}

/// The numbers of every `YARD_ASSERT_SIZE` / `YARD_ASSERT_OFFSET` in `yard.h`.
pub const C_LAYOUTS: &[Layout] = &[
    Layout {
        name: "gw_config",
        size: 16,
        fields: &[("mac", 0), ("mtu", 6), ("lease_deadline_ns", 8)],
    },
    Layout {
        name: "gw_vip",
        size: 4,
        fields: &[("mode", 0)],
    },
    Layout {
        name: "gw_ep_key",
        size: 8,
        fields: &[("vni", 0), ("ip", 4)],
    },
    Layout {
        name: "gw_ep",
        size: 12,
        fields: &[("mac", 0), ("pad", 6), ("host", 8)],
    },
    Layout {
        name: "gw_host",
        size: 8,
        fields: &[("mac", 0), ("pad", 6)],
    },
    Layout {
        name: "gw_counter",
        size: 16,
        fields: &[("packets", 0), ("bytes", 8)],
    },
    Layout {
        name: "peers_key",
        size: 8,
        fields: &[("peer", 0), ("dir", 4), ("pad", 5)],
    },
    Layout {
        name: "peers_value",
        size: 24,
        fields: &[("bytes", 0), ("packets", 8), ("last_ns", 16)],
    },
    Layout {
        name: "agg_job",
        size: 60,
        fields: &[
            ("epoch", 0),
            ("base", 4),
            ("chunks", 8),
            ("values", 12),
            ("chunk_values", 16),
            ("workers", 18),
            ("dtype", 20),
            ("self_ip", 24),
            ("parent_ip", 28),
            ("parent_port", 32),
            ("parent_worker", 34),
            ("parent_mac", 36),
            ("fanout_tag", 44),
            ("result_token", 48),
            ("up_token", 52),
            ("parent_token", 56),
        ],
    },
    Layout {
        name: "agg_member_key",
        size: 12,
        fields: &[("job", 0), ("ip", 4), ("port", 8)],
    },
    Layout {
        name: "agg_peer",
        size: 40,
        fields: &[
            ("ip", 0),
            ("port", 4),
            ("mac", 6),
            ("last_ns", 16),
            ("busy_ns", 24),
            ("bytes", 32),
        ],
    },
    Layout {
        name: "agg_slot",
        size: 3104,
        fields: &[("seen", 16), ("acc", 32)],
    },
];

/// A struct's layout measured on the Rust side: name, size, (field, offset) pairs.
pub type RustLayout = (&'static str, usize, Vec<(&'static str, usize)>);

/// The same structs measured on the Rust side, in the order of [`C_LAYOUTS`].
pub fn rust_layouts() -> Vec<RustLayout> {
    vec![
        (
            "gw_config",
            size_of::<GwConfig>(),
            vec![
                ("mac", offset_of!(GwConfig, mac)),
                ("mtu", offset_of!(GwConfig, mtu)),
                ("lease_deadline_ns", offset_of!(GwConfig, lease_deadline_ns)),
            ],
        ),
        (
            "gw_vip",
            size_of::<GwVip>(),
            vec![("mode", offset_of!(GwVip, mode))],
        ),
        (
            "gw_ep_key",
            size_of::<GwEpKey>(),
            vec![
                ("vni", offset_of!(GwEpKey, vni)),
                ("ip", offset_of!(GwEpKey, ip)),
            ],
        ),
        (
            "gw_ep",
            size_of::<GwEp>(),
            vec![
                ("mac", offset_of!(GwEp, mac)),
                ("pad", offset_of!(GwEp, pad)),
                ("host", offset_of!(GwEp, host)),
            ],
        ),
        (
            "gw_host",
            size_of::<GwHost>(),
            vec![
                ("mac", offset_of!(GwHost, mac)),
                ("pad", offset_of!(GwHost, pad)),
            ],
        ),
        (
            "gw_counter",
            size_of::<GwCounter>(),
            vec![
                ("packets", offset_of!(GwCounter, packets)),
                ("bytes", offset_of!(GwCounter, bytes)),
            ],
        ),
        (
            "peers_key",
            size_of::<PeersKey>(),
            vec![
                ("peer", offset_of!(PeersKey, peer)),
                ("dir", offset_of!(PeersKey, dir)),
                ("pad", offset_of!(PeersKey, pad)),
            ],
        ),
        (
            "peers_value",
            size_of::<PeersValue>(),
            vec![
                ("bytes", offset_of!(PeersValue, bytes)),
                ("packets", offset_of!(PeersValue, packets)),
                ("last_ns", offset_of!(PeersValue, last_ns)),
            ],
        ),
        (
            "agg_job",
            size_of::<AggJob>(),
            vec![
                ("epoch", offset_of!(AggJob, epoch)),
                ("base", offset_of!(AggJob, base)),
                ("chunks", offset_of!(AggJob, chunks)),
                ("values", offset_of!(AggJob, values)),
                ("chunk_values", offset_of!(AggJob, chunk_values)),
                ("workers", offset_of!(AggJob, workers)),
                ("dtype", offset_of!(AggJob, dtype)),
                ("self_ip", offset_of!(AggJob, self_ip)),
                ("parent_ip", offset_of!(AggJob, parent_ip)),
                ("parent_port", offset_of!(AggJob, parent_port)),
                ("parent_worker", offset_of!(AggJob, parent_worker)),
                ("parent_mac", offset_of!(AggJob, parent_mac)),
                ("fanout_tag", offset_of!(AggJob, fanout_tag)),
                ("result_token", offset_of!(AggJob, result_token)),
                ("up_token", offset_of!(AggJob, up_token)),
                ("parent_token", offset_of!(AggJob, parent_token)),
            ],
        ),
        (
            "agg_member_key",
            size_of::<AggMemberKey>(),
            vec![
                ("job", offset_of!(AggMemberKey, job)),
                ("ip", offset_of!(AggMemberKey, ip)),
                ("port", offset_of!(AggMemberKey, port)),
            ],
        ),
        (
            "agg_peer",
            size_of::<AggPeer>(),
            vec![
                ("ip", offset_of!(AggPeer, ip)),
                ("port", offset_of!(AggPeer, port)),
                ("mac", offset_of!(AggPeer, mac)),
                ("last_ns", offset_of!(AggPeer, last_ns)),
                ("busy_ns", offset_of!(AggPeer, busy_ns)),
                ("bytes", offset_of!(AggPeer, bytes)),
            ],
        ),
        (
            "agg_slot",
            size_of::<AggSlot>(),
            vec![
                ("seen", offset_of!(AggSlot, seen)),
                ("acc", offset_of!(AggSlot, acc)),
            ],
        ),
    ]
}

// The padding-free claim behind the `Pod` impls, checked at compile time.
const _: () = {
    assert!(size_of::<GwConfig>() == 6 + 2 + 8);
    assert!(size_of::<GwVip>() == 4);
    assert!(size_of::<GwEpKey>() == 4 + 4);
    assert!(size_of::<GwEp>() == 6 + 2 + 4);
    assert!(size_of::<GwHost>() == 6 + 2);
    assert!(size_of::<GwCounter>() == 8 + 8);
    assert!(size_of::<PeersKey>() == 4 + 1 + 3);
    assert!(size_of::<PeersValue>() == 8 + 8 + 8);
    assert!(size_of::<AggJob>() == 4 * 4 + 2 + 2 + 1 + 3 + 4 + 4 + 2 + 2 + 6 + 2 + 4 * 4);
    assert!(size_of::<AggMemberKey>() == 4 + 4 + 2 + 2);
    assert!(size_of::<AggMember>() == 2 + 2 + 4);
    assert!(size_of::<AggPeerKey>() == 4 + 4);
    assert!(size_of::<AggPeer>() == 4 + 2 + 6 + 4 + 8 + 8 + 8);
    assert!(size_of::<AggJobCounterKey>() == 4 + 4);
    assert!(size_of::<AggSlot>() == 4 * 4 + 8 + 2 + 2 + 1 + 1 + 1 + 1 + 4 * AGG_VALUES_MAX);
    assert!(size_of::<AggPartial>() == 4 + 1 + 3 + 4 * AGG_VALUES_MAX);
};

/// An IPv4 address as the maps store it: network order in memory.
pub fn ip_to_map(ip: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(ip.octets())
}

/// The inverse of [`ip_to_map`].
pub fn ip_from_map(raw: u32) -> Ipv4Addr {
    Ipv4Addr::from(raw.to_ne_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_mirrors_match_the_static_asserts_in_yard_h() {
        let rust = rust_layouts();
        assert_eq!(rust.len(), C_LAYOUTS.len());
        for (c, (name, size, fields)) in C_LAYOUTS.iter().zip(rust) {
            assert_eq!(c.name, name);
            assert_eq!(c.size, size, "size of {name}");
            assert_eq!(c.fields, fields.as_slice(), "field offsets of {name}");
        }
    }

    #[test]
    fn layout_constants_appear_in_yard_h() {
        // The C numbers above are copied from yard.h: make sure the copy is current.
        let header = include_str!("../bpf/yard.h");
        for layout in C_LAYOUTS {
            let size = format!("YARD_ASSERT_SIZE(struct {}, {});", layout.name, layout.size);
            assert!(header.contains(&size), "yard.h lacks `{size}`");
            for (field, offset) in layout.fields {
                let line = format!(
                    "YARD_ASSERT_OFFSET(struct {}, {field}, {offset});",
                    layout.name
                );
                assert!(header.contains(&line), "yard.h lacks `{line}`");
            }
        }
        for (name, value) in [
            ("GW_VIPS_MAX", VIPS_MAX),
            ("GW_ENDPOINTS_MAX", ENDPOINTS_MAX),
            ("GW_HOSTS_MAX", HOSTS_MAX),
            ("PEERS_MAX", PEERS_MAX),
            ("PEERS_PORTS_MAX", PEERS_PORTS_MAX),
            ("AGG_JOBS_MAX", AGG_JOBS_MAX),
            ("AGG_MEMBERS_MAX", AGG_MEMBERS_MAX),
            ("AGG_VALUES_MAX", AGG_VALUES_MAX as u32),
        ] {
            assert!(
                header.contains(&format!("#define {name} {value}")),
                "yard.h lacks `#define {name} {value}`"
            );
        }
        assert!(header.contains("#define GW_SOURCES_MAX GW_ENDPOINTS_MAX"));
        assert!(header.contains(&format!("GW_COUNTER_MAX == {COUNTER_MAX}")));
        assert!(header.contains(&format!("PEERS_COUNTER_MAX == {PEERS_COUNTER_MAX}")));
        assert!(header.contains(&format!("AGG_COUNTER_MAX == {AGG_COUNTER_MAX}")));
        assert!(header.contains(&format!("PEERS_DIR_INGRESS = {PEERS_DIR_INGRESS},")));
        assert!(header.contains(&format!("PEERS_DIR_EGRESS = {PEERS_DIR_EGRESS},")));
        assert!(header.contains(&format!("GW_VIP_OWNED = {VIP_OWNED},")));
        assert!(header.contains(&format!("GW_VIP_FORWARD_ONLY = {VIP_FORWARD_ONLY},")));
        assert!(header.contains(&format!("#define YARD_VXLAN_PORT {VXLAN_PORT}")));
        assert!(header.contains(&format!("#define YARD_OUTER_TTL {OUTER_TTL}")));
    }

    #[test]
    fn addresses_are_stored_in_network_order() {
        let ip = Ipv4Addr::new(198, 19, 0, 1);
        let raw = ip_to_map(ip);
        assert_eq!(raw.to_ne_bytes(), [198, 19, 0, 1]);
        assert_eq!(ip_from_map(raw), ip);
    }
}
