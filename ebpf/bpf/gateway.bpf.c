// SPDX-License-Identifier: GPL-2.0
/*
 * yard_gateway: the east-west overlay gateway's data plane (DESIGN.md, "XDP programs").
 *
 * Compute hosts send VXLAN (UDP 4789) to a virtual IP (VIP) that this gateway cluster owns. The
 * program looks the inner destination up in (VNI, inner IPv4) -> endpoint, re-addresses the outer
 * headers to the endpoint's compute host and sends the frame straight back out of the interface
 * it came in on (XDP_TX). It also answers ARP: for an owned VIP on the underlay ("outer") and
 * for tenant addresses inside the tunnel ("inner"), so the kernel never has to.
 *
 * Fencing: the node's lease deadline lives in gw_config. Past it, no ARP is answered for any
 * VIP (the program must stop on its own, because a pinned program keeps running when its daemon
 * is dead or hung): owning a VIP means answering for it, and two nodes must never do that at
 * once. Tunnel frames that still arrive (neighbour caches not yet moved, or a control plane that
 * is down altogether) are forwarded with the last state: a frame goes to one gateway only, so
 * forwarding it can never duplicate anything, and it keeps the overlay up through an outage.
 *
 * Sources: a tunnel frame is taken only from an outer source address registered for its VNI
 * in gw_sources (the daemon registers every compute host that has an endpoint in the VNI);
 * anything else is dropped and counted (DROP_UNKNOWN_SOURCE), so a host on the underlay that
 * knows a VNI cannot send into that tenant's network through the gateway.
 *
 * Rules kept throughout: every packet byte is bounds-checked before it is read, every exit
 * counts exactly one reason in gw_counters, and the program never returns XDP_ABORTED. A frame
 * shorter than the total length its outer or inner IPv4 header announces is never sent on
 * (DROP_TRUNCATED); traffic not addressed to a VIP is passed before any such check, untouched.
 */
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>

#include "ipv4.h"
#include "yard.h"

char LICENSE[] SEC("license") = "GPL";

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

/*
 * Who may send for a tenant: (VNI, outer source) pairs. The daemon derives them from the
 * endpoint table (a compute host may tunnel a VNI's traffic if it hosts an endpoint of that
 * VNI), so an underlay host that knows a VNI cannot inject frames into it.
 */
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

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, GW_COUNTER_MAX);
	__type(key, __u32);
	__type(value, struct gw_counter);
} gw_counters SEC(".maps");

/*
 * Per-VIP traffic (key: VIP, network order): frames addressed to this gateway for the VIP,
 * counted once each whatever their fate. The daemon samples it into rates for the service
 * planner, which places VIPs by what they carry.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, GW_VIPS_MAX);
	__type(key, __u32);
	__type(value, struct gw_counter);
} gw_vip_stats SEC(".maps");

/* ARP for IPv4 over Ethernet: the only ARP the gateway answers. */
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
_Static_assert(sizeof(struct arp_eth_ipv4) == 28, "ARP body");

struct vxlanhdr {
	__u8 flags; /* 0x08: the VNI is valid (the I flag) */
	__u8 reserved1[3];
	__u8 vni[3];
	__u8 reserved2;
};
_Static_assert(sizeof(struct vxlanhdr) == 8, "VXLAN header");

#define ARPOP_REQUEST_BE bpf_htons(1)
#define ARPOP_REPLY_BE bpf_htons(2)
#define IP_FRAG_MASK_BE bpf_htons(0x3fff) /* MF flag and fragment offset */
#define VXLAN_FLAG_I 0x08
#define YARD_AF_INET 2 /* <sys/socket.h> is not for BPF targets */
/* Offset of the inner IPv4 header: the outer IPv4 header is option-less once we get there. */
#define INNER_L3_OFF                                                                              \
	(sizeof(struct ethhdr) + sizeof(struct iphdr) + sizeof(struct udphdr) +                    \
	 sizeof(struct vxlanhdr) + sizeof(struct ethhdr))

/* Counts one exit reason for this frame and returns its verdict. */
/* Whether two MAC addresses are equal. */
static __always_inline int same_mac(const unsigned char *a, const unsigned char *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3] && a[4] == b[4] &&
	       a[5] == b[5];
}

static __always_inline int verdict(__u32 idx, __u64 len, int action)
{
	struct gw_counter *c = bpf_map_lookup_elem(&gw_counters, &idx);

	if (c) {
		/* per-CPU slot: no other writer, no atomics needed */
		c->packets += 1;
		c->bytes += len;
	}
	return action;
}

#define OUT(idx, action) return verdict((idx), len, (action))

/* Counts one frame of `len` bytes for `vip` in gw_vip_stats. */
static __always_inline void count_vip(__u32 vip, __u64 len)
{
	struct gw_counter *c = bpf_map_lookup_elem(&gw_vip_stats, &vip);

	if (c) {
		/* per-CPU slot: no other writer, no atomics needed */
		c->packets += 1;
		c->bytes += len;
		return;
	}
	struct gw_counter first = { .packets = 1, .bytes = len };
	/* full map or a racing first insert on another CPU: this frame goes uncounted */
	bpf_map_update_elem(&gw_vip_stats, &vip, &first, BPF_NOEXIST);
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

static __always_inline int lease_valid(const struct gw_config *cfg)
{
	return bpf_ktime_get_ns() < cfg->lease_deadline_ns;
}

/* TTL - 1 with the checksum adjusted incrementally (RFC 1624), as Linux's ip_decrease_ttl(). */
static __always_inline void ipv4_decrease_ttl(struct iphdr *ip)
{
	__u32 check = ip->check;

	check += bpf_htons(0x0100);
	ip->check = (__u16)(check + (check >= 0xffff));
	ip->ttl -= 1;
}

/*
 * Turns an ARP request into the reply from (mac, ip) in place. The Ethernet header's addresses
 * are left to the caller because they differ between the outer and the inner case.
 */
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

/*
 * Re-addresses the outer Ethernet/IPv4/UDP headers of a tunnel frame: from this gateway (config
 * MAC, the VIP the frame was sent to) to (dst_mac, dst_ip). The outer UDP source port is kept: it
 * carries the original VTEP's flow entropy. UDP checksum 0 is legal for IPv4 and is what Linux
 * vxlan devices send by default.
 */
static __always_inline void outer_readdress(struct ethhdr *eth, struct iphdr *ip,
					     struct udphdr *udp, const struct gw_config *cfg,
					     const __u8 *dst_mac, __u32 dst_ip)
{
	__u32 vip = ip->daddr;

	__builtin_memcpy(eth->h_dest, dst_mac, 6);
	__builtin_memcpy(eth->h_source, cfg->mac, 6);
	ip->saddr = vip;
	ip->daddr = dst_ip;
	ip->ttl = YARD_OUTER_TTL;
	ip->check = ipv4_csum20(ip);
	udp->dest = bpf_htons(YARD_VXLAN_PORT);
	udp->check = 0;
}

SEC("xdp")
int yard_gateway(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u64 len = data_end - data;
	__u32 zero = 0;

	struct gw_config *cfg = bpf_map_lookup_elem(&gw_config, &zero);
	if (!cfg || cfg->mtu == 0)
		OUT(GW_PASS_NOT_CONFIGURED, XDP_PASS);

	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);

	/* ---- outer ARP: answer for owned VIPs, fence them when the lease lapsed ---- */
	if (eth->h_proto == bpf_htons(ETH_P_ARP)) {
		struct arp_eth_ipv4 *arp = (void *)(eth + 1);
		__u32 tip;

		if ((void *)(arp + 1) > data_end || !arp_is_ipv4_request(arp))
			OUT(GW_PASS_NOT_VIP, XDP_PASS);
		__builtin_memcpy(&tip, arp->tpa, 4);
		struct gw_vip *vip = bpf_map_lookup_elem(&gw_vips, &tip);
		if (!vip_mode_known(vip))
			OUT(GW_PASS_NOT_VIP, XDP_PASS);
		/*
		 * Lease lapsed: drop ARP for every VIP, owned or forward-only. The address may still
		 * be configured on the interface, and the kernel must not answer for it either.
		 */
		if (!lease_valid(cfg))
			OUT(GW_DROP_LEASE_EXPIRED, XDP_DROP);
		if (vip->mode != GW_VIP_OWNED)
			OUT(GW_PASS_NOT_VIP, XDP_PASS);
		__builtin_memcpy(eth->h_dest, arp->sha, 6);
		__builtin_memcpy(eth->h_source, cfg->mac, 6);
		arp_make_reply(arp, cfg->mac, tip);
		OUT(GW_ARP_REPLIED_OUTER, XDP_TX);
	}
	if (eth->h_proto != bpf_htons(ETH_P_IP))
		OUT(GW_PASS_NON_IPV4, XDP_PASS);

	/* ---- outer IPv4 to one of our VIPs ---- */
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	if (ip->version != 4 || ip->ihl < 5)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	__u32 daddr = ip->daddr;
	struct gw_vip *vip = bpf_map_lookup_elem(&gw_vips, &daddr);
	if (!vip_mode_known(vip))
		OUT(GW_PASS_NOT_VIP, XDP_PASS); /* the node's own traffic: untouched */
	/*
	 * A bridge floods a unicast frame whose destination it has not learned to every port, so
	 * every gateway serving the VIP (the owner and one still forwarding it after a handoff)
	 * sees it: only the gateway it was addressed to may forward it, or the tenant receives it
	 * twice. The others leave it to the stack, which ignores frames for another host.
	 */
	if (!same_mac(eth->h_dest, cfg->mac))
		OUT(GW_PASS_NOT_VIP, XDP_PASS);
	count_vip(daddr, len);
	if (ip->ihl > 5)
		OUT(GW_DROP_IP_OPTIONS, XDP_DROP);
	if (ip->frag_off & IP_FRAG_MASK_BE)
		OUT(GW_DROP_FRAGMENT, XDP_DROP);
	if (len > (__u64)cfg->mtu + ETH_HLEN)
		OUT(GW_DROP_OVERSIZE, XDP_DROP);
	/* never forward a frame cut short of what its header announces */
	__u16 tot_len = bpf_ntohs(ip->tot_len);
	if (tot_len < sizeof(*ip) || tot_len > len - ETH_HLEN)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	if (ip->protocol != IPPROTO_UDP)
		OUT(GW_PASS_NOT_VXLAN, XDP_PASS);
	struct udphdr *udp = (void *)(ip + 1);
	if ((void *)(udp + 1) > data_end)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	if (udp->dest != bpf_htons(YARD_VXLAN_PORT))
		OUT(GW_PASS_NOT_VXLAN, XDP_PASS);
	struct vxlanhdr *vx = (void *)(udp + 1);
	if ((void *)(vx + 1) > data_end)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	if (!(vx->flags & VXLAN_FLAG_I))
		OUT(GW_DROP_BAD_VXLAN, XDP_DROP);
	__u32 vni = ((__u32)vx->vni[0] << 16) | ((__u32)vx->vni[1] << 8) | (__u32)vx->vni[2];
	/* only a host registered for the VNI may send into it (ARP included: no tenant oracle) */
	struct gw_ep_key src = { .vni = vni, .ip = ip->saddr };
	if (!bpf_map_lookup_elem(&gw_sources, &src))
		OUT(GW_DROP_UNKNOWN_SOURCE, XDP_DROP);

	struct ethhdr *ieth = (void *)(vx + 1);
	if ((void *)(ieth + 1) > data_end)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);

	/* ---- inner ARP: answer for tenant endpoints back through the tunnel ---- */
	if (ieth->h_proto == bpf_htons(ETH_P_ARP)) {
		struct arp_eth_ipv4 *iarp = (void *)(ieth + 1);
		struct gw_ep_key key = { .vni = vni };

		if ((void *)(iarp + 1) > data_end)
			OUT(GW_DROP_TRUNCATED, XDP_DROP);
		if (!arp_is_ipv4_request(iarp))
			OUT(GW_DROP_INNER_OTHER, XDP_DROP);
		__builtin_memcpy(&key.ip, iarp->tpa, 4);
		struct gw_ep *ep = bpf_map_lookup_elem(&gw_endpoints, &key);
		if (!ep)
			OUT(GW_DROP_UNKNOWN_ENDPOINT, XDP_DROP);
		__builtin_memcpy(ieth->h_dest, iarp->sha, 6);
		__builtin_memcpy(ieth->h_source, ep->mac, 6);
		arp_make_reply(iarp, ep->mac, key.ip);

		__u8 prev_hop[6];
		__builtin_memcpy(prev_hop, eth->h_source, 6);
		outer_readdress(eth, ip, udp, cfg, prev_hop, ip->saddr);
		OUT(GW_ARP_REPLIED_INNER, XDP_TX);
	}
	if (ieth->h_proto == bpf_htons(ETH_P_IPV6))
		OUT(GW_DROP_INNER_IPV6, XDP_DROP);
	if (ieth->h_proto != bpf_htons(ETH_P_IP))
		OUT(GW_DROP_INNER_OTHER, XDP_DROP);

	/* ---- inner IPv4: route to the endpoint's compute host ---- */
	struct iphdr *iip = (void *)(ieth + 1);
	if ((void *)(iip + 1) > data_end)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	if (iip->version != 4 || iip->ihl < 5)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	__u16 inner_len = bpf_ntohs(iip->tot_len);
	if (inner_len < sizeof(*iip) || inner_len > len - INNER_L3_OFF)
		OUT(GW_DROP_TRUNCATED, XDP_DROP);
	if (iip->ihl > 5)
		OUT(GW_DROP_IP_OPTIONS, XDP_DROP);
	if (iip->frag_off & IP_FRAG_MASK_BE)
		OUT(GW_DROP_FRAGMENT, XDP_DROP);
	if (iip->ttl <= 1)
		OUT(GW_DROP_TTL, XDP_DROP);

	struct gw_ep_key key = { .vni = vni, .ip = iip->daddr };
	struct gw_ep *ep = bpf_map_lookup_elem(&gw_endpoints, &key);
	if (!ep)
		OUT(GW_DROP_UNKNOWN_ENDPOINT, XDP_DROP);
	__u32 host = ep->host;
	struct gw_host *next_hop = bpf_map_lookup_elem(&gw_hosts, &host);

	__builtin_memcpy(ieth->h_dest, ep->mac, 6);
	ipv4_decrease_ttl(iip);
	if (next_hop) {
		outer_readdress(eth, ip, udp, cfg, next_hop->mac, host);
		OUT(GW_FORWARDED, XDP_TX);
	}
	/*
	 * The daemon has not put the host's MAC into gw_hosts yet (a new endpoint on a host this
	 * gateway never sent to). Ask the kernel's neighbour table; if it has no entry either,
	 * re-address the frame to the host with this gateway's own MAC as the destination and hand
	 * it to the stack, which forwards it out of the same interface and resolves the neighbour
	 * on the way (holding the frame in the neighbour's queue meanwhile): a tenant's first
	 * frames arrive late by one ARP exchange instead of being lost (a TCP SYN would wait a
	 * 1 s retransmission). This needs forwarding (the FIB helper checks it as well) and
	 * accept_local (the outer source is the VIP, a local address) on the interface; the daemon
	 * sets both, behind an nftables table that lets the kernel forward from the interface only
	 * this (UDP to the VXLAN port, back out of it: yard_actors::gateway::kernel_path). Without them the lookup says FWD_DISABLED and the frame still goes to the
	 * stack, which then drops it: no worse than dropping it here.
	 */
	struct bpf_fib_lookup fib = {};
	fib.family = YARD_AF_INET;
	fib.l4_protocol = IPPROTO_UDP;
	fib.tot_len = tot_len;
	fib.ifindex = ctx->ingress_ifindex;
	fib.ipv4_src = daddr;
	fib.ipv4_dst = host;
	long rc = bpf_fib_lookup(ctx, &fib, sizeof(fib), BPF_FIB_LOOKUP_OUTPUT);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS && fib.ifindex == ctx->ingress_ifindex) {
		outer_readdress(eth, ip, udp, cfg, fib.dmac, host);
		OUT(GW_FORWARDED, XDP_TX);
	}
	if (rc == BPF_FIB_LKUP_RET_BLACKHOLE || rc == BPF_FIB_LKUP_RET_UNREACHABLE ||
	    rc == BPF_FIB_LKUP_RET_PROHIBIT)
		OUT(GW_DROP_UNKNOWN_HOST, XDP_DROP); /* the kernel would drop it too */
	outer_readdress(eth, ip, udp, cfg, cfg->mac, host);
	OUT(GW_PASS_UNRESOLVED_HOST, XDP_PASS);
}
