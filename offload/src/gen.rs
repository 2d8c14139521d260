//! The generator: a NIC program and a host program in C for one cut of the gateway pipeline,
//! composed from one template per primitive op (the design the anchors note recommends over
//! splitting compiled bytecode).
//!
//! Both programs are the ops of gateway.bpf.c as labelled blocks in source order, each ending
//! in a jump to the op that follows it on the packet's path, so a class's path through the
//! blocks is its path through the pipeline:
//! - the NIC program holds the ops of the cut; an op outside it is a stub that hands the packet
//!   over (`resume` = that op). A packet the NIC decides to PASS is handed over as well
//!   (`resume` = done), so that every frame reaching the host carries the handoff;
//! - the host program holds every op, because a class resumes at its first op outside the cut
//!   and continues through whatever follows, on the cut or not. With no handoff in front of
//!   the frame (no NIC part) it starts at the first op and is the whole program.
//!
//! The handoff is a 40-byte shim pushed with `bpf_xdp_adjust_head` and stripped by the host:
//! the nfp cannot call `bpf_xdp_adjust_meta` nor read `data_meta` (verifier.c, jit.c), while
//! `adjust_head` is a firmware-advertised helper there; on this machine the NIC part runs as an
//! ordinary XDP program (the emulated NIC). Counters: the NIC part counts into its own ARRAY
//! with atomic adds (per-CPU maps and direct value stores are host-only on the nfp), the host
//! part into `gw_counters`; their sum is the whole program's count.

use std::fmt::Write as _;

use crate::plan::Pipeline;

/// Which of the two programs to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Nic,
    Host,
}

impl Role {
    pub fn program_name(self) -> &'static str {
        match self {
            Role::Nic => "oxdp_nic",
            Role::Host => "oxdp_host",
        }
    }
}

/// How the NIC part hands a frame over to the host part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handoff {
    /// `XDP_PASS`: up the NIC's receive path into the host's driver, where the host part runs
    /// (a real SmartNIC, whose firmware does not redirect).
    Pass,
    /// `XDP_REDIRECT` through `oxdp_handoff`, a one-slot DEVMAP the loader points at the
    /// emulated NIC's host port: on the emulated NIC (an XDP program on a veth) a pass would
    /// end in that veth's own stack, not at the host's interface. An empty slot falls back to
    /// `XDP_PASS`, so under BPF_PROG_TEST_RUN both handoffs give the same verdicts.
    Redirect,
}

/// The split parts as files: (file name, role, handoff), as `yard offload plan --emit` writes
/// them and as `ebpf/bpf/` holds them, generated for [`crate::gateway::default_cut`] and
/// compiled into the daemon by the ebpf crate's build (a test keeps them current).
pub const FILES: [(&str, Role, Handoff); 3] = [
    ("oxdp_nic.bpf.c", Role::Nic, Handoff::Pass),
    ("oxdp_nic_emu.bpf.c", Role::Nic, Handoff::Redirect),
    ("oxdp_host.bpf.c", Role::Host, Handoff::Pass),
];

/// The project's shared header, which the generated programs include: written beside them
/// by `yard offload plan --emit`.
pub const YARD_H: &str = include_str!("../../ebpf/bpf/yard.h");

/// The shim's size in bytes (`struct oxdp_shim` below; the C asserts it).
pub const SHIM_LEN: usize = 40;
/// The shim's first word, in host order as the C writes it.
pub const SHIM_MAGIC: u32 = 0x5844_584f;

const PRELUDE: &str = r#"#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>

#include "yard.h"

#pragma clang diagnostic ignored "-Wunused-label"
#pragma clang diagnostic ignored "-Wunused-function"
#pragma clang diagnostic ignored "-Wunused-variable"

char LICENSE[] SEC("license") = "GPL";

/* The gateway's tables, one copy per part (the daemon writes both: read-only here). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gw_config);
} gw_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GW_VIPS_MAX);
	__type(key, __u32);
	__type(value, struct gw_vip);
} gw_vips SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GW_ENDPOINTS_MAX);
	__type(key, struct gw_ep_key);
	__type(value, struct gw_ep);
} gw_endpoints SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GW_SOURCES_MAX);
	__type(key, struct gw_ep_key);
	__type(value, __u32);
} gw_sources SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GW_HOSTS_MAX);
	__type(key, __u32);
	__type(value, struct gw_host);
} gw_hosts SEC(".maps");

struct arp_eth_ipv4 {
	__be16 htype;
	__be16 ptype;
	__u8 hlen;
	__u8 plen;
	__be16 op;
	__u8 sha[6];
	__u8 spa[4];
	__u8 tha[6];
	__u8 tpa[4];
} __attribute__((packed));

struct vxlanhdr {
	__u8 flags;
	__u8 reserved1[3];
	__u8 vni[3];
	__u8 reserved2;
};

/* What the NIC part hands the host part, in front of the frame. */
struct oxdp_shim {
	__u32 magic;
	__u8 resume;     /* the op to resume at, or OXDP_DONE: the NIC decided XDP_PASS */
	__u8 inner_done; /* the inner MAC and TTL are rewritten already */
	__u16 tot_len;
	__u32 vni;
	__u32 vip;
	__u32 host;
	__u32 vip_mode;
	__u32 arp_tip;
	__u8 ep_mac[6];
	__u8 nh_mac[6];
};
_Static_assert(sizeof(struct oxdp_shim) == 40, "shim");
#define OXDP_MAGIC 0x5844584f
#define OXDP_DONE 0xff

#define ARPOP_REQUEST_BE bpf_htons(1)
#define ARPOP_REPLY_BE bpf_htons(2)
#define IP_FRAG_MASK_BE bpf_htons(0x3fff)
#define VXLAN_FLAG_I 0x08
#define YARD_AF_INET 2
#define INNER_L3_OFF 64

/* Headers at the fixed offsets the checks before them guarantee (option-less outer IPv4). */
#define ETH ((struct ethhdr *)data)
#define ARPH ((struct arp_eth_ipv4 *)(data + 14))
#define IPH ((struct iphdr *)(data + 14))
#define UDPH ((struct udphdr *)(data + 34))
#define VXH ((struct vxlanhdr *)(data + 42))
#define IETH ((struct ethhdr *)(data + 50))
#define IIPH ((struct iphdr *)(data + 64))
#define IARPH ((struct arp_eth_ipv4 *)(data + 64))

static __always_inline int same_mac(const unsigned char *a, const unsigned char *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3] && a[4] == b[4] &&
	       a[5] == b[5];
}

static __always_inline int arp_is_ipv4_request(const struct arp_eth_ipv4 *arp)
{
	return arp->htype == bpf_htons(1) && arp->ptype == bpf_htons(ETH_P_IP) && arp->hlen == 6 &&
	       arp->plen == 4 && arp->op == ARPOP_REQUEST_BE;
}

static __always_inline int vip_mode_known(const struct gw_vip *vip)
{
	return vip && (vip->mode == GW_VIP_OWNED || vip->mode == GW_VIP_FORWARD_ONLY);
}

static __always_inline __u16 ipv4_csum20(struct iphdr *ip)
{
	__u16 *p = (__u16 *)ip;
	__u32 sum = 0;

	ip->check = 0;
#pragma unroll
	for (int i = 0; i < 10; i++)
		sum += p[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

static __always_inline void ipv4_decrease_ttl(struct iphdr *ip)
{
	__u32 check = ip->check;

	check += bpf_htons(0x0100);
	ip->check = (__u16)(check + (check >= 0xffff));
	ip->ttl -= 1;
}

static __always_inline void arp_make_reply(struct arp_eth_ipv4 *arp, const __u8 *mac, __u32 ip)
{
	__u8 req_mac[6];
	__u8 req_ip[4];

	__builtin_memcpy(req_mac, arp->sha, 6);
	__builtin_memcpy(req_ip, arp->spa, 4);
	arp->op = ARPOP_REPLY_BE;
	__builtin_memcpy(arp->sha, mac, 6);
	__builtin_memcpy(arp->spa, &ip, 4);
	__builtin_memcpy(arp->tha, req_mac, 6);
	__builtin_memcpy(arp->tpa, req_ip, 4);
}

/* The outer re-addressing without the header checksum (the checksum op computes it). */
static __always_inline void outer_readdress_nocsum(struct ethhdr *eth, struct iphdr *ip,
						    struct udphdr *udp, const struct gw_config *cfg,
						    const __u8 *dst_mac, __u32 dst_ip)
{
	__u32 vip = ip->daddr;

	__builtin_memcpy(eth->h_dest, dst_mac, 6);
	__builtin_memcpy(eth->h_source, cfg->mac, 6);
	ip->saddr = vip;
	ip->daddr = dst_ip;
	ip->ttl = YARD_OUTER_TTL;
	udp->dest = bpf_htons(YARD_VXLAN_PORT);
	udp->check = 0;
}

static __always_inline void outer_readdress(struct ethhdr *eth, struct iphdr *ip,
					     struct udphdr *udp, const struct gw_config *cfg,
					     const __u8 *dst_mac, __u32 dst_ip)
{
	outer_readdress_nocsum(eth, ip, udp, cfg, dst_mac, dst_ip);
	ip->check = ipv4_csum20(ip);
}
"#;

const NIC_COUNT: &str = r#"
/* The NIC part's counters: an ARRAY with atomic adds, which the nfp offloads. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, GW_COUNTER_MAX);
	__type(key, __u32);
	__type(value, struct gw_counter);
} oxdp_nic_counters SEC(".maps");

static __always_inline void count(__u32 idx, __u64 len)
{
	struct gw_counter *c = bpf_map_lookup_elem(&oxdp_nic_counters, &idx);

	if (c) {
		__sync_fetch_and_add(&c->packets, 1);
		__sync_fetch_and_add(&c->bytes, len);
	}
}

/* A frame the NIC passes goes to the host with a "done" shim, like every frame it hands over. */
#define OUT(idx, action)                                                                          \
	do {                                                                                      \
		count((idx), len);                                                                \
		if ((action) == XDP_PASS) {                                                       \
			st.resume = OXDP_DONE;                                                    \
			goto handoff;                                                             \
		}                                                                                 \
		return (action);                                                                  \
	} while (0)
"#;

const HOST_COUNT: &str = r#"
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, GW_COUNTER_MAX);
	__type(key, __u32);
	__type(value, struct gw_counter);
} gw_counters SEC(".maps");

static __always_inline int verdict(__u32 idx, __u64 len, int action)
{
	struct gw_counter *c = bpf_map_lookup_elem(&gw_counters, &idx);

	if (c) {
		c->packets += 1;
		c->bytes += len;
	}
	return action;
}

#define OUT(idx, action) return verdict((idx), len, (action))
"#;

const LOCALS: &str = r#"	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u64 len = data_end - data;
	__u32 zero = 0;
	struct gw_config *cfg = 0;
	struct gw_vip *vip;
	struct gw_ep *ep;
	struct gw_host *nh;
	struct gw_ep_key key;
	struct bpf_fib_lookup fib;
	long rc;
	__u16 inner_len;
	__u8 prev_hop[6];
	struct oxdp_shim st;

	__builtin_memset(&st, 0, sizeof(st));
	__builtin_memset(&key, 0, sizeof(key));
"#;

const HOST_RESUME_HEAD: &str = r#"	/* A frame from the NIC part: take the shim off and resume where it stopped. */
	if (data + sizeof(st) <= data_end && ((struct oxdp_shim *)data)->magic == OXDP_MAGIC) {
		__builtin_memcpy(&st, data, sizeof(st));
		if (bpf_xdp_adjust_head(ctx, (int)sizeof(st)))
			return XDP_DROP;
		data = (void *)(long)ctx->data;
		data_end = (void *)(long)ctx->data_end;
		if (st.resume == OXDP_DONE)
			return XDP_PASS; /* decided and counted on the NIC */
		len = data_end - data;
		cfg = bpf_map_lookup_elem(&gw_config, &zero);
		if (!cfg || cfg->mtu == 0)
			return XDP_PASS;
		switch (st.resume) {
"#;

const NIC_HANDOFF: &str = r#"handoff:
	st.magic = OXDP_MAGIC;
	if (bpf_xdp_adjust_head(ctx, -(int)sizeof(st)))
		return XDP_PASS;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	if (data + sizeof(st) > data_end)
		return XDP_PASS;
	__builtin_memcpy(data, &st, sizeof(st));
"#;

const NIC_REDIRECT_MAP: &str = r#"
/* The emulated NIC's host port: where a handed-over frame goes (slot 0, set by the loader). */
struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} oxdp_handoff SEC(".maps");
"#;

/// The template of one op: C statements that end by jumping to the next op on the path
/// (`GOTO(name)`) or by `OUT(reason, action)`. Each re-checks the bounds of what it reads,
/// so that it verifies when the host part resumes there; on a path through the earlier ops
/// these checks always pass.
fn template(op: &str) -> Option<&'static str> {
    Some(match op {
        "config" => {
            r#"	cfg = bpf_map_lookup_elem(&gw_config, &zero);
	if (!cfg || cfg->mtu == 0)
		OUT(GW_PASS_NOT_CONFIGURED, XDP_PASS);
	GOTO(parse_eth);
"#
        }
        "parse_eth" => {
            r#"	if (data + sizeof(struct ethhdr) > data_end)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	if (ETH->h_proto == bpf_htons(ETH_P_ARP))
		GOTO(arp_outer);
	if (ETH->h_proto != bpf_htons(ETH_P_IP))
		OUT(GW_PASS_NON_IPV4, XDP_PASS);
	GOTO(outer_ipv4);
"#
        }
        "arp_outer" => {
            r#"	if ((void *)(ARPH + 1) > data_end || !arp_is_ipv4_request(ARPH))
		OUT(GW_PASS_NOT_VIP, XDP_PASS);
	__builtin_memcpy(&st.arp_tip, ARPH->tpa, 4);
	vip = bpf_map_lookup_elem(&gw_vips, &st.arp_tip);
	if (!vip_mode_known(vip))
		OUT(GW_PASS_NOT_VIP, XDP_PASS);
	st.vip_mode = vip->mode;
	GOTO(lease_check);
"#
        }
        "lease_check" => {
            r#"	if (!(bpf_ktime_get_ns() < cfg->lease_deadline_ns))
		OUT(GW_DROP_LEASE_EXPIRED, XDP_DROP);
	if (st.vip_mode != GW_VIP_OWNED)
		OUT(GW_PASS_NOT_VIP, XDP_PASS);
	GOTO(arp_reply);
"#
        }
        "arp_reply" => {
            r#"	if ((void *)(ARPH + 1) > data_end)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	__builtin_memcpy(ETH->h_dest, ARPH->sha, 6);
	__builtin_memcpy(ETH->h_source, cfg->mac, 6);
	arp_make_reply(ARPH, cfg->mac, st.arp_tip);
	OUT(GW_ARP_REPLIED_OUTER, XDP_TX);
"#
        }
        "outer_ipv4" => {
            r#"	if ((void *)(IPH + 1) > data_end)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	if (IPH->version != 4 || IPH->ihl < 5)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	st.vip = IPH->daddr;
	GOTO(vip_check);
"#
        }
        "vip_check" => {
            r#"	if ((void *)(IPH + 1) > data_end)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	vip = bpf_map_lookup_elem(&gw_vips, &st.vip);
	if (!vip_mode_known(vip))
		OUT(GW_PASS_NOT_VIP, XDP_PASS);
	if (!same_mac(ETH->h_dest, cfg->mac))
		OUT(GW_PASS_NOT_VIP, XDP_PASS);
	GOTO(udp_vxlan);
"#
        }
        "udp_vxlan" => {
            r#"	if ((void *)(IPH + 1) > data_end)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	if (IPH->ihl > 5)
		OUT(GW_DROP_IP_OPTIONS, XDP_DROP);
	if (IPH->frag_off & IP_FRAG_MASK_BE)
		OUT(GW_DROP_FRAGMENT, XDP_DROP);
	if (len > (__u64)cfg->mtu + ETH_HLEN)
		OUT(GW_DROP_OVERSIZE, XDP_DROP);
	st.tot_len = bpf_ntohs(IPH->tot_len);
	if (st.tot_len < sizeof(struct iphdr) || st.tot_len > len - ETH_HLEN)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	if (IPH->protocol != IPPROTO_UDP)
		OUT(GW_PASS_NOT_VXLAN, XDP_PASS);
	if ((void *)(UDPH + 1) > data_end)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	if (UDPH->dest != bpf_htons(YARD_VXLAN_PORT))
		OUT(GW_PASS_NOT_VXLAN, XDP_PASS);
	if ((void *)(VXH + 1) > data_end)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	if (!(VXH->flags & VXLAN_FLAG_I))
		OUT(GW_DROP_BAD_VXLAN, XDP_DROP);
	st.vni = ((__u32)VXH->vni[0] << 16) | ((__u32)VXH->vni[1] << 8) | (__u32)VXH->vni[2];
	key.vni = st.vni;
	key.ip = IPH->saddr;
	if (!bpf_map_lookup_elem(&gw_sources, &key))
		OUT(GW_DROP_UNKNOWN_SOURCE, XDP_DROP);
	GOTO(inner_headers);
"#
        }
        "inner_headers" => {
            r#"	if ((void *)(IETH + 1) > data_end)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	if (IETH->h_proto == bpf_htons(ETH_P_ARP))
		GOTO(inner_arp);
	if (IETH->h_proto == bpf_htons(ETH_P_IPV6))
		OUT(GW_DROP_INNER_IPV6, XDP_DROP);
	if (IETH->h_proto != bpf_htons(ETH_P_IP))
		OUT(GW_DROP_INNER_OTHER, XDP_DROP);
	if ((void *)(IIPH + 1) > data_end)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	if (IIPH->version != 4 || IIPH->ihl < 5)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	inner_len = bpf_ntohs(IIPH->tot_len);
	if (inner_len < sizeof(struct iphdr) || inner_len > len - INNER_L3_OFF)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	if (IIPH->ihl > 5)
		OUT(GW_DROP_IP_OPTIONS, XDP_DROP);
	if (IIPH->frag_off & IP_FRAG_MASK_BE)
		OUT(GW_DROP_FRAGMENT, XDP_DROP);
	if (IIPH->ttl <= 1)
		OUT(GW_DROP_TTL, XDP_DROP);
	GOTO(endpoint_lookup);
"#
        }
        "inner_arp" => {
            r#"	if ((void *)(IARPH + 1) > data_end)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	if (!arp_is_ipv4_request(IARPH))
		OUT(GW_DROP_INNER_OTHER, XDP_DROP);
	key.vni = st.vni;
	__builtin_memcpy(&key.ip, IARPH->tpa, 4);
	ep = bpf_map_lookup_elem(&gw_endpoints, &key);
	if (!ep)
		OUT(GW_DROP_UNKNOWN_ENDPOINT, XDP_DROP);
	__builtin_memcpy(IETH->h_dest, IARPH->sha, 6);
	__builtin_memcpy(IETH->h_source, ep->mac, 6);
	arp_make_reply(IARPH, ep->mac, key.ip);
	__builtin_memcpy(prev_hop, ETH->h_source, 6);
	outer_readdress(ETH, IPH, UDPH, cfg, prev_hop, IPH->saddr);
	OUT(GW_ARP_REPLIED_INNER, XDP_TX);
"#
        }
        "endpoint_lookup" => {
            r#"	if ((void *)(IIPH + 1) > data_end)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	key.vni = st.vni;
	key.ip = IIPH->daddr;
	ep = bpf_map_lookup_elem(&gw_endpoints, &key);
	if (!ep)
		OUT(GW_DROP_UNKNOWN_ENDPOINT, XDP_DROP);
	st.host = ep->host;
	__builtin_memcpy(st.ep_mac, ep->mac, 6);
	GOTO(host_lookup);
"#
        }
        "host_lookup" => {
            r#"	nh = bpf_map_lookup_elem(&gw_hosts, &st.host);
	if (!nh)
		GOTO(fib_fallback);
	__builtin_memcpy(st.nh_mac, nh->mac, 6);
	GOTO(rewrite);
"#
        }
        "fib_fallback" => {
            r#"	if ((void *)(IIPH + 1) > data_end)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	__builtin_memcpy(IETH->h_dest, st.ep_mac, 6);
	ipv4_decrease_ttl(IIPH);
	st.inner_done = 1;
	__builtin_memset(&fib, 0, sizeof(fib));
	fib.family = YARD_AF_INET;
	fib.l4_protocol = IPPROTO_UDP;
	fib.tot_len = st.tot_len;
	fib.ifindex = ctx->ingress_ifindex;
	fib.ipv4_src = st.vip;
	fib.ipv4_dst = st.host;
	rc = bpf_fib_lookup(ctx, &fib, sizeof(fib), BPF_FIB_LOOKUP_OUTPUT);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS && fib.ifindex == ctx->ingress_ifindex) {
		__builtin_memcpy(st.nh_mac, fib.dmac, 6);
		GOTO(rewrite);
	}
	if (rc == BPF_FIB_LKUP_RET_BLACKHOLE || rc == BPF_FIB_LKUP_RET_UNREACHABLE ||
	    rc == BPF_FIB_LKUP_RET_PROHIBIT)
		OUT(GW_DROP_UNKNOWN_HOST, XDP_DROP);
	outer_readdress(ETH, IPH, UDPH, cfg, cfg->mac, st.host);
	OUT(GW_PASS_UNRESOLVED_HOST, XDP_PASS);
"#
        }
        "rewrite" => {
            r#"	if ((void *)(IIPH + 1) > data_end)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	if (!st.inner_done) {
		__builtin_memcpy(IETH->h_dest, st.ep_mac, 6);
		ipv4_decrease_ttl(IIPH);
	}
	outer_readdress_nocsum(ETH, IPH, UDPH, cfg, st.nh_mac, st.host);
	GOTO(checksum);
"#
        }
        "checksum" => {
            r#"	if ((void *)(IPH + 1) > data_end)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	IPH->check = ipv4_csum20(IPH);
	GOTO(verdict_tx);
"#
        }
        "verdict_tx" => {
            r#"	OUT(GW_FORWARDED, XDP_TX);
"#
        }
        _ => return None,
    })
}

/// Why a pipeline cannot be generated.
#[derive(Debug, thiserror::Error)]
pub enum GenError {
    #[error("op {0} has no C template (the generator knows the gateway's ops only)")]
    NoTemplate(String),
    #[error("op {op} jumps to {target}, which is not an op of the pipeline")]
    UnknownTarget { op: String, target: String },
}

/// Replaces `GOTO(name)` with `goto op_<index>;`.
fn link(p: &Pipeline, op: &str, body: &str) -> Result<String, GenError> {
    let mut out = String::new();
    let mut rest = body;
    while let Some(at) = rest.find("GOTO(") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 5..];
        let end = after.find(')').unwrap_or(after.len());
        let target = &after[..end];
        let idx =
            p.ops
                .iter()
                .position(|o| o.name == target)
                .ok_or_else(|| GenError::UnknownTarget {
                    op: op.to_owned(),
                    target: target.to_owned(),
                })?;
        write!(out, "goto op_{idx}").expect("a String");
        rest = &after[(end + 1).min(after.len())..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The C source of one part for the cut `mask` (bit i: op i runs on the NIC), the NIC part
/// handing over with [`Handoff::Pass`].
pub fn generate(p: &Pipeline, mask: u64, role: Role) -> Result<String, GenError> {
    generate_with(p, mask, role, Handoff::Pass)
}

/// [`generate`] with a choice of handoff (which only the NIC part uses).
pub fn generate_with(
    p: &Pipeline,
    mask: u64,
    role: Role,
    handoff: Handoff,
) -> Result<String, GenError> {
    let mut c = String::new();
    let _ = writeln!(
        c,
        "// SPDX-License-Identifier: GPL-2.0\n/*\n * Generated by yard-offload from the {} op templates: the {} part of the cut {:#x}\n * (NIC ops: {}). Do not edit.\n */",
        p.name,
        match role {
            Role::Nic => "NIC",
            Role::Host => "host",
        },
        mask,
        p.ops
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, o)| o.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    c.push_str(PRELUDE);
    c.push_str(match role {
        Role::Nic => NIC_COUNT,
        Role::Host => HOST_COUNT,
    });
    let redirect = role == Role::Nic && handoff == Handoff::Redirect;
    if redirect {
        c.push_str(NIC_REDIRECT_MAP);
    }
    let _ = writeln!(
        c,
        "\nSEC(\"xdp\")\nint {}(struct xdp_md *ctx)\n{{",
        role.program_name()
    );
    c.push_str(LOCALS);
    if role == Role::Host {
        c.push_str(HOST_RESUME_HEAD);
        for i in 0..p.ops.len() {
            let _ = writeln!(c, "\t\tcase {i}:\n\t\t\tgoto op_{i};");
        }
        c.push_str("\t\t}\n\t\treturn XDP_DROP;\n\t}\n");
    }
    for (i, op) in p.ops.iter().enumerate() {
        let body = template(&op.name).ok_or_else(|| GenError::NoTemplate(op.name.clone()))?;
        let _ = writeln!(c, "op_{i}: /* {} */", op.name);
        if role == Role::Nic && mask & (1 << i) == 0 {
            let _ = writeln!(c, "\tst.resume = {i}; /* on the host */\n\tgoto handoff;");
        } else {
            c.push_str(&link(p, &op.name, body)?);
        }
    }
    if role == Role::Nic {
        c.push_str(NIC_HANDOFF);
        c.push_str(if redirect {
            "\treturn bpf_redirect_map(&oxdp_handoff, 0, XDP_PASS);\n"
        } else {
            "\treturn XDP_PASS;\n"
        });
    }
    c.push_str("}\n");
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway;

    #[test]
    fn every_gateway_op_has_a_template_and_jumps_resolve() {
        let p = gateway::pipeline();
        for role in [Role::Nic, Role::Host] {
            let c = generate(&p, 0b1111, role).expect("generates");
            assert!(!c.contains("GOTO("));
            assert!(c.contains(&format!("int {}(", role.program_name())));
        }
        let nic = generate(&p, 0b11, Role::Nic).expect("generates");
        // op 2 (arp_outer) is off the cut: a handoff stub
        assert!(nic.contains("op_2: /* arp_outer */\n\tst.resume = 2;"));
        assert!(nic.contains("oxdp_nic_counters"));
        assert!(!nic.contains("gw_counters SEC"));
        assert!(nic.contains("\treturn XDP_PASS;\n}"));
        assert!(!nic.contains("oxdp_handoff"));
        let emu = generate_with(&p, 0b11, Role::Nic, Handoff::Redirect).expect("generates");
        assert!(emu.contains("oxdp_handoff SEC(\".maps\")"));
        assert!(emu.contains("return bpf_redirect_map(&oxdp_handoff, 0, XDP_PASS);\n}"));
        let host = generate_with(&p, 0b11, Role::Host, Handoff::Redirect).expect("generates");
        assert_eq!(host, generate(&p, 0b11, Role::Host).expect("generates"));
    }
}
