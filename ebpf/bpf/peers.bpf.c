// SPDX-License-Identifier: GPL-2.0
/*
 * yard_peers: per-peer traffic counters of a training job (DESIGN.md, "probe").
 *
 * Attached with TC (clsact/tcx) at both ingress and egress of the host's interface. For every
 * IPv4 TCP or UDP packet whose local-side or remote-side port the job registered in
 * peers_ports, it adds the frame's bytes, its wire packets and the time to the remote host's
 * entry in `peers`, per direction. The analyzer reads the entries to corroborate a slow link:
 * a peer whose traffic stalls or thins while the collective is stuck.
 *
 * Direction: two entry points, yard_peers_ingress and yard_peers_egress, each a one-line call
 * of the same inlined function with a constant direction. skb->ingress_ifindex cannot tell the
 * direction (a forwarded packet carries its arrival interface on egress too), and a constant
 * per attachment (.rodata) would need two loads of the program anyway; two sections cost
 * nothing.
 *
 * It observes and never decides: every exit returns TC_ACT_UNSPEC, "no verdict", so the packet
 * continues to the next TC program (tcx: TCX_NEXT) and then the stack, unchanged. TC_ACT_OK
 * would be TCX_PASS on tcx, which ends the chain and would skip any program attached after this
 * one (a firewall, a fault injector). Every exit counts exactly one reason in peers_counters.
 *
 * Headers are read with bpf_skb_load_bytes, not direct packet access: on TC the headers of a
 * received or GSO packet may lie beyond the linear part of the skb, where direct access cannot
 * reach, and a copy of 4 to 20 bytes needs no reallocation (bpf_skb_pull_data would).
 *
 * Map choice: `peers` is a per-CPU hash. The NICs' RSS spreads one peer's flows (NCCL opens
 * several sockets per peer) over several queues and CPUs; with a shared hash every packet would
 * do atomic adds on one cache line that bounces between those CPUs, at line rate. Per-CPU
 * entries are written by one CPU only, with plain adds; the cost moves to the reader, which
 * sums (at most 4096 x CPUs values) about once a second. Measured with BPF_PROG_TEST_RUN on a
 * 2-vCPU VM: both variants cost the same on one CPU (~187 ns per counted packet); two CPUs
 * counting the same peer at once cost 179-195 ns per-CPU against 189-238 ns shared (noisy;
 * the gap grows with the number of CPUs sharing the line).
 */
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <asm-generic/errno-base.h>
#include <bpf/bpf_endian.h>

#include "yard.h"

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PEERS_PORTS_MAX);
	__type(key, __be16);
	__type(value, __u8);
} peers_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, PEERS_MAX);
	__type(key, struct peers_key);
	__type(value, struct peers_value);
} peers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PEERS_COUNTER_MAX);
	__type(key, __u32);
	__type(value, struct gw_counter);
} peers_counters SEC(".maps");

#define ETH_P_8021Q_BE bpf_htons(0x8100)
#define ETH_P_8021AD_BE bpf_htons(0x88a8)
#define VLAN_HLEN 4
#define IP_FRAG_MASK_BE bpf_htons(0x3fff) /* MF flag and fragment offset */

/* Counts one reason for this packet and gives the verdict: always "no verdict". */
static __always_inline int done(__u32 idx, __u64 len)
{
	struct gw_counter *c = bpf_map_lookup_elem(&peers_counters, &idx);

	if (c) {
		/* per-CPU slot: no other writer, no atomics needed */
		c->packets += 1;
		c->bytes += len;
	}
	return TC_ACT_UNSPEC;
}

#define OUT(idx) return done((idx), len)

static __always_inline int port_registered(__be16 port)
{
	return bpf_map_lookup_elem(&peers_ports, &port) != NULL;
}

/*
 * Adds one packet to (peer, dir); returns the reason to count. A peer seen for the first time
 * is inserted with BPF_NOEXIST: if another CPU inserted it in between, the insert fails with
 * EEXIST and this CPU's slot of that entry is updated instead. Any other failure means no room.
 */
static __always_inline __u32 add_to_peer(__u32 peer, __u8 dir, __u64 bytes, __u64 packets)
{
	struct peers_key key = { .peer = peer, .dir = dir };
	__u64 now = bpf_ktime_get_ns();
	struct peers_value *v = bpf_map_lookup_elem(&peers, &key);

	if (!v) {
		struct peers_value first = { .bytes = bytes, .packets = packets, .last_ns = now };
		long err = bpf_map_update_elem(&peers, &key, &first, BPF_NOEXIST);

		if (err == 0)
			return PEERS_COUNTED;
		if (err != -EEXIST)
			return PEERS_PEERS_FULL;
		v = bpf_map_lookup_elem(&peers, &key);
		if (!v)
			return PEERS_PEERS_FULL;
	}
	v->bytes += bytes;
	v->packets += packets;
	v->last_ns = now;
	return PEERS_COUNTED;
}

static __always_inline int count_packet(struct __sk_buff *skb, __u8 dir)
{
	__u64 len = skb->len;
	__u32 l3 = sizeof(struct ethhdr);
	__be16 proto;

	if (bpf_skb_load_bytes(skb, __builtin_offsetof(struct ethhdr, h_proto), &proto, sizeof(proto)))
		OUT(PEERS_TRUNCATED);
	/* One 802.1Q/802.1ad tag left in the frame (not offloaded to skb->vlan_tci) is skipped. */
	if (proto == ETH_P_8021Q_BE || proto == ETH_P_8021AD_BE) {
		if (bpf_skb_load_bytes(skb, l3 + 2, &proto, sizeof(proto)))
			OUT(PEERS_TRUNCATED);
		l3 += VLAN_HLEN;
	}
	if (proto != bpf_htons(ETH_P_IP))
		OUT(PEERS_NON_IPV4);

	struct iphdr ip;
	if (bpf_skb_load_bytes(skb, l3, &ip, sizeof(ip)))
		OUT(PEERS_TRUNCATED);
	if (ip.version != 4 || ip.ihl < 5)
		OUT(PEERS_MALFORMED);
	__u32 ihl = ip.ihl * 4;
	__u32 tot_len = bpf_ntohs(ip.tot_len);
	if (tot_len < ihl)
		OUT(PEERS_MALFORMED);
	if (tot_len > len - l3)
		OUT(PEERS_TRUNCATED);
	if (ip.frag_off & IP_FRAG_MASK_BE)
		OUT(PEERS_FRAGMENT);
	if (ip.protocol != IPPROTO_TCP && ip.protocol != IPPROTO_UDP)
		OUT(PEERS_NOT_TCP_UDP);
	/* Source and destination port: the first 4 bytes of both the TCP and the UDP header. */
	if (tot_len < ihl + 4)
		OUT(PEERS_TRUNCATED);
	__be16 ports[2];
	if (bpf_skb_load_bytes(skb, l3 + ihl, ports, sizeof(ports)))
		OUT(PEERS_TRUNCATED);

	int ingress = dir == PEERS_DIR_INGRESS;
	__be16 local = ingress ? ports[1] : ports[0];
	__be16 remote = ingress ? ports[0] : ports[1];
	if (!port_registered(local) && !port_registered(remote))
		OUT(PEERS_NOT_JOB);

	__u32 peer = ingress ? ip.saddr : ip.daddr;
	/* A GSO packet (TSO on egress, GRO on ingress) stands for gso_segs packets on the wire. */
	__u64 packets = skb->gso_segs > 1 ? skb->gso_segs : 1;
	OUT(add_to_peer(peer, dir, len, packets));
}

SEC("classifier")
int yard_peers_ingress(struct __sk_buff *skb)
{
	return count_packet(skb, PEERS_DIR_INGRESS);
}

SEC("classifier")
int yard_peers_egress(struct __sk_buff *skb)
{
	return count_packet(skb, PEERS_DIR_EGRESS);
}
