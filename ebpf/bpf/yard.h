/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The one header shared by every Switchyard XDP program and mirrored in Rust
 * (ebpf/src/layout.rs, ebpf/src/counters.rs).
 *
 * Every struct that crosses the user/kernel boundary has no implicit padding (explicit `pad`
 * fields where alignment needs them) and a _Static_assert on its size and field offsets; the
 * Rust side asserts the same numbers, so a change on one side that is not made on the other
 * fails to build (C) or fails the layout test (Rust).
 *
 * Byte order: IPv4 addresses are kept in network order (as they appear in packets, so the
 * program compares them without swapping); VNIs, modes, MTUs and times in host order.
 */
#ifndef YARD_H
#define YARD_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define YARD_ASSERT_SIZE(type, n) _Static_assert(sizeof(type) == (n), "size of " #type)
#define YARD_ASSERT_OFFSET(type, field, n)                                                        \
	_Static_assert(__builtin_offsetof(type, field) == (n), "offset of " #type "." #field)

/* The VXLAN UDP port (IANA). */
#define YARD_VXLAN_PORT 4789
/* The TTL written into every outer IPv4 header the gateway emits. */
#define YARD_OUTER_TTL 64

/* gw_config[0]: written by the daemon; an all-zero value (mtu == 0) means "not configured". */
struct gw_config {
	__u8 mac[6];               /* this gateway interface's MAC: source of everything sent */
	__u16 mtu;                 /* largest outer L3 size accepted; frames > mtu + 14 dropped */
	__u64 lease_deadline_ns;   /* bpf_ktime_get_ns() at which this node's lease lapses */
};
YARD_ASSERT_SIZE(struct gw_config, 16);
YARD_ASSERT_OFFSET(struct gw_config, mac, 0);
YARD_ASSERT_OFFSET(struct gw_config, mtu, 6);
YARD_ASSERT_OFFSET(struct gw_config, lease_deadline_ns, 8);

/* gw_vips value modes. Any other value is treated as "not a VIP". */
enum gw_vip_mode {
	GW_VIP_OWNED = 1,        /* answer ARP for it and forward tunnel traffic to it */
	GW_VIP_FORWARD_ONLY = 2, /* forward tunnel traffic to it, answer no ARP (hand-off) */
};

/* gw_vips: key __u32 VIP (network order). */
struct gw_vip {
	__u32 mode;
};
YARD_ASSERT_SIZE(struct gw_vip, 4);
YARD_ASSERT_OFFSET(struct gw_vip, mode, 0);

/* gw_endpoints key: a tenant address is only unique inside its VNI. */
struct gw_ep_key {
	__u32 vni; /* host order, 24 significant bits */
	__u32 ip;  /* network order */
};
YARD_ASSERT_SIZE(struct gw_ep_key, 8);
YARD_ASSERT_OFFSET(struct gw_ep_key, vni, 0);
YARD_ASSERT_OFFSET(struct gw_ep_key, ip, 4);

/* gw_endpoints value. */
struct gw_ep {
	__u8 mac[6]; /* the tenant interface's MAC */
	__u16 pad;   /* always 0 */
	__u32 host;  /* compute host's underlay IPv4, network order */
};
YARD_ASSERT_SIZE(struct gw_ep, 12);
YARD_ASSERT_OFFSET(struct gw_ep, mac, 0);
YARD_ASSERT_OFFSET(struct gw_ep, pad, 6);
YARD_ASSERT_OFFSET(struct gw_ep, host, 8);

/* gw_hosts: key __u32 host IPv4 (network order) -> next-hop MAC. */
struct gw_host {
	__u8 mac[6];
	__u16 pad; /* always 0 */
};
YARD_ASSERT_SIZE(struct gw_host, 8);
YARD_ASSERT_OFFSET(struct gw_host, mac, 0);
YARD_ASSERT_OFFSET(struct gw_host, pad, 6);

/* gw_counters value: one per reason and CPU. `bytes` counts whole frames as received. */
struct gw_counter {
	__u64 packets;
	__u64 bytes;
};
YARD_ASSERT_SIZE(struct gw_counter, 16);
YARD_ASSERT_OFFSET(struct gw_counter, packets, 0);
YARD_ASSERT_OFFSET(struct gw_counter, bytes, 8);

/*
 * Why a frame left the gateway program: every exit counts exactly one of these. The Rust enum
 * `Counter` has the same order; its name() is the metric label.
 */
enum gw_counter_idx {
	GW_FORWARDED = 0,
	GW_ARP_REPLIED_INNER,
	GW_ARP_REPLIED_OUTER,
	GW_PASS_NOT_VIP,
	GW_PASS_NON_IPV4,
	GW_PASS_NOT_VXLAN,
	GW_PASS_NOT_CONFIGURED,
	GW_DROP_LEASE_EXPIRED,
	GW_DROP_TRUNCATED,
	GW_DROP_BAD_VXLAN,
	GW_DROP_IP_OPTIONS,
	GW_DROP_FRAGMENT,
	GW_DROP_OVERSIZE,
	GW_DROP_TTL,
	GW_DROP_INNER_IPV6,
	GW_DROP_INNER_OTHER,
	GW_DROP_UNKNOWN_ENDPOINT,
	GW_DROP_UNKNOWN_HOST,
	GW_PASS_UNRESOLVED_HOST, /* host MAC unknown to the daemon and the kernel: re-addressed, to the stack */
	GW_COUNTER_MAX, /* number of counters: gw_counters' max_entries */
};
_Static_assert(GW_COUNTER_MAX == 19, "Rust Counter::ALL has 19 entries");

/* Map sizes, mirrored in Rust (layout.rs) so the loader can check pinned maps it adopts. */
#define GW_VIPS_MAX 4096
#define GW_ENDPOINTS_MAX 262144
#define GW_HOSTS_MAX 65536

/* ================================ probe: yard_peers ================================ */
/*
 * The per-peer traffic counters of a training job (bpf/peers.bpf.c, mirrored in
 * ebpf/src/layout.rs and ebpf/src/peers.rs). The job registers its ports in peers_ports; every
 * TCP/UDP packet to or from one of them is added to its remote host's entry in `peers`.
 */

/* peers_ports: key __be16 port (network order, as in the packet) -> __u8 (1 = registered). */
#define PEERS_PORTS_MAX 1024
/* peers: at most this many (peer, direction) entries; a new peer beyond it is not counted. */
#define PEERS_MAX 4096

/* Direction of a packet as seen from this host. */
enum peers_dir {
	PEERS_DIR_INGRESS = 0, /* received from the peer */
	PEERS_DIR_EGRESS = 1,  /* sent to the peer */
};

/* peers key. */
struct peers_key {
	__u32 peer;  /* the remote host's IPv4, network order */
	__u8 dir;    /* enum peers_dir */
	__u8 pad[3]; /* always 0: part of the hashed key */
};
YARD_ASSERT_SIZE(struct peers_key, 8);
YARD_ASSERT_OFFSET(struct peers_key, peer, 0);
YARD_ASSERT_OFFSET(struct peers_key, dir, 4);
YARD_ASSERT_OFFSET(struct peers_key, pad, 5);

/* peers value, one per CPU: user space sums bytes/packets and takes the largest last_ns. */
struct peers_value {
	__u64 bytes;   /* Ethernet frame bytes as TC sees them (header included, no FCS) */
	__u64 packets; /* wire packets: a GSO packet counts its segments */
	__u64 last_ns; /* bpf_ktime_get_ns() of the latest packet counted on this CPU */
};
YARD_ASSERT_SIZE(struct peers_value, 24);
YARD_ASSERT_OFFSET(struct peers_value, bytes, 0);
YARD_ASSERT_OFFSET(struct peers_value, packets, 8);
YARD_ASSERT_OFFSET(struct peers_value, last_ns, 16);

/*
 * What yard_peers made of a packet: every packet counts exactly one of these (value type
 * struct gw_counter: packets and bytes). The Rust enum `PeerCounter` has the same order.
 * Whatever the reason, the packet itself goes on unchanged.
 */
enum peers_counter_idx {
	PEERS_COUNTED = 0,   /* added to its peer's entry */
	PEERS_NOT_JOB,       /* TCP/UDP, but neither port is registered */
	PEERS_NON_IPV4,      /* not IPv4 (IPv6, ARP, two VLAN tags, ...) */
	PEERS_NOT_TCP_UDP,   /* IPv4 of another protocol (ICMP, ...) */
	PEERS_FRAGMENT,      /* an IPv4 fragment: the later ones carry no ports */
	PEERS_TRUNCATED,     /* the frame ends before the headers, or before the IPv4 length */
	PEERS_MALFORMED,     /* IPv4 version not 4, IHL < 5, or total length < the headers */
	PEERS_PEERS_FULL,    /* a new peer found `peers` full: not counted */
	PEERS_COUNTER_MAX,   /* number of counters: peers_counters' max_entries */
};
_Static_assert(PEERS_COUNTER_MAX == 8, "Rust PeerCounter::ALL has 8 entries");

#endif /* YARD_H */
