//! The gateway's exit reasons: one per-CPU counter (packets and bytes) each.

/// Why a frame left `yard_gateway`; every frame counts exactly one.
///
/// The discriminant is the index into `gw_counters` and matches `enum gw_counter_idx` in
/// `bpf/yard.h` (a unit test compares the two lists).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum Counter {
    /// Tunnel frame re-addressed to the inner destination's compute host (XDP_TX).
    Forwarded = 0,
    /// ARP request inside the tunnel answered back through it (XDP_TX).
    ArpRepliedInner,
    /// ARP request for an owned VIP answered on the underlay (XDP_TX).
    ArpRepliedOuter,
    /// Not addressed to a VIP (the node's own traffic) or ARP the gateway does not answer: passed.
    PassNotVip,
    /// Neither IPv4 nor ARP (IPv6, VLAN-tagged, ...): passed to the host.
    PassNonIpv4,
    /// To a VIP but not VXLAN: passed to the host.
    PassNotVxlan,
    /// `gw_config` never written (mtu 0): everything passes.
    PassNotConfigured,
    /// ARP for a VIP while the node's lease has lapsed: dropped (fencing; tunnel frames are
    /// still forwarded with the last state).
    DropLeaseExpired,
    /// A header was cut short, the frame is shorter than an IPv4 total length, or an IPv4
    /// header is malformed (version, IHL < 5, total length < 20).
    DropTruncated,
    /// VXLAN header without the I (valid VNI) flag.
    DropBadVxlan,
    /// Outer or inner IPv4 with options (not forwarded, to keep the fast path fixed-size).
    DropIpOptions,
    /// Outer or inner IPv4 fragment.
    DropFragment,
    /// Frame longer than the configured MTU + 14.
    DropOversize,
    /// Inner TTL 0 or 1.
    DropTtl,
    /// Inner IPv6 (the overlay is IPv4-only).
    DropInnerIpv6,
    /// Inner frame neither IPv4 nor a valid ARP request.
    DropInnerOther,
    /// No endpoint for (VNI, inner destination).
    DropUnknownEndpoint,
    /// The endpoint's compute host has no next-hop MAC and the kernel's route to it is a
    /// blackhole, unreachable or prohibited: dropped, as the kernel would.
    DropUnknownHost,
    /// The endpoint's compute host has no next-hop MAC in the map nor in the kernel's neighbour
    /// table: the frame is re-addressed to the host with the gateway's own MAC and passed to the
    /// stack, which forwards it once it has resolved the neighbour (a new tenant's first frames
    /// are late by one ARP exchange, not lost).
    PassUnresolvedHost,
    /// A tunnel frame whose outer source address is not registered for its VNI (no endpoint of
    /// the VNI lives on that host): dropped, so an underlay host cannot inject overlay traffic
    /// into a tenant's network by knowing its VNI.
    DropUnknownSource,
}

impl Counter {
    /// Every counter in index order.
    pub const ALL: [Counter; 20] = [
        Counter::Forwarded,
        Counter::ArpRepliedInner,
        Counter::ArpRepliedOuter,
        Counter::PassNotVip,
        Counter::PassNonIpv4,
        Counter::PassNotVxlan,
        Counter::PassNotConfigured,
        Counter::DropLeaseExpired,
        Counter::DropTruncated,
        Counter::DropBadVxlan,
        Counter::DropIpOptions,
        Counter::DropFragment,
        Counter::DropOversize,
        Counter::DropTtl,
        Counter::DropInnerIpv6,
        Counter::DropInnerOther,
        Counter::DropUnknownEndpoint,
        Counter::DropUnknownHost,
        Counter::PassUnresolvedHost,
        Counter::DropUnknownSource,
    ];

    /// Stable snake_case name, used as the metric label (`reason="forwarded"`): never rename.
    pub fn name(self) -> &'static str {
        match self {
            Counter::Forwarded => "forwarded",
            Counter::ArpRepliedInner => "arp_replied_inner",
            Counter::ArpRepliedOuter => "arp_replied_outer",
            Counter::PassNotVip => "pass_not_vip",
            Counter::PassNonIpv4 => "pass_non_ipv4",
            Counter::PassNotVxlan => "pass_not_vxlan",
            Counter::PassNotConfigured => "pass_not_configured",
            Counter::DropLeaseExpired => "drop_lease_expired",
            Counter::DropTruncated => "drop_truncated",
            Counter::DropBadVxlan => "drop_bad_vxlan",
            Counter::DropIpOptions => "drop_ip_options",
            Counter::DropFragment => "drop_fragment",
            Counter::DropOversize => "drop_oversize",
            Counter::DropTtl => "drop_ttl",
            Counter::DropInnerIpv6 => "drop_inner_ipv6",
            Counter::DropInnerOther => "drop_inner_other",
            Counter::DropUnknownEndpoint => "drop_unknown_endpoint",
            Counter::DropUnknownHost => "drop_unknown_host",
            Counter::PassUnresolvedHost => "pass_unresolved_host",
            Counter::DropUnknownSource => "drop_unknown_source",
        }
    }

    /// Index into `gw_counters`.
    pub fn index(self) -> u32 {
        self as u32
    }

    /// The counter at `index`, if there is one.
    pub fn from_index(index: u32) -> Option<Counter> {
        Counter::ALL.get(usize::try_from(index).ok()?).copied()
    }

    /// Whether frames counted here were sent back out (XDP_TX).
    pub fn is_tx(self) -> bool {
        matches!(
            self,
            Counter::Forwarded | Counter::ArpRepliedInner | Counter::ArpRepliedOuter
        )
    }

    /// Whether frames counted here were handed to the kernel's stack (XDP_PASS).
    pub fn is_pass(self) -> bool {
        matches!(
            self,
            Counter::PassNotVip
                | Counter::PassNonIpv4
                | Counter::PassNotVxlan
                | Counter::PassNotConfigured
                | Counter::PassUnresolvedHost
        )
    }
}

impl std::fmt::Display for Counter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One counter summed over all CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterValue {
    pub packets: u64,
    pub bytes: u64,
}

/// The member names of the C enum `enum_name` in `yard.h`, lowercased, without `prefix` and
/// without the trailing `<prefix>COUNTER_MAX`: what a counter enum's `name()`s must equal.
#[cfg(test)]
pub(crate) fn c_enum_names(enum_name: &str, prefix: &str) -> Vec<String> {
    let header = include_str!("../bpf/yard.h");
    let decl = format!("enum {enum_name} {{");
    let start = header.find(&decl).expect("enum in yard.h");
    let body = &header[start + decl.len()..];
    let body = &body[..body.find("};").expect("end of enum")];
    body.lines()
        .filter_map(|l| l.trim().strip_prefix(prefix))
        .map(|l| {
            l.split([' ', ',', '='])
                .next()
                .unwrap_or_default()
                .to_ascii_lowercase()
        })
        .filter(|n| n != "counter_max")
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_match_the_c_enum_in_order() {
        let c_names = c_enum_names("gw_counter_idx", "GW_");
        let rust: Vec<&str> = Counter::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(c_names, rust);
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(c.index() as usize, i);
            assert_eq!(Counter::from_index(i as u32), Some(*c));
        }
        assert_eq!(Counter::ALL.len() as u32, crate::layout::COUNTER_MAX);
    }
}
