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

/*
 * gw_sources: key struct gw_ep_key with ip = an outer (underlay) source address -> __u32 1.
 * A tunnel frame for a VNI is taken only from a source registered for that VNI.
 */

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
	GW_DROP_UNKNOWN_SOURCE, /* tunnel frame from an outer source not registered for its VNI */
	GW_COUNTER_MAX, /* number of counters: gw_counters' max_entries */
};
_Static_assert(GW_COUNTER_MAX == 20, "Rust Counter::ALL has 20 entries");

/*
 * Map sizes, mirrored in Rust (layout.rs) so the loader can check pinned maps it adopts, and
 * read by the replicated state machine (yard-raft-store), which refuses a VIP pool or an
 * endpoint table larger than these.
 */
#define GW_VIPS_MAX 4096
#define GW_ENDPOINTS_MAX 262144
#define GW_HOSTS_MAX 65536
/*
 * gw_sources holds one (VNI, compute host) pair per VNI a host has an endpoint in: never more
 * pairs than endpoints, so the endpoint table's bound is its bound too.
 */
#define GW_SOURCES_MAX GW_ENDPOINTS_MAX

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


/* ============================== aggregator: yard_agg ============================== */
/*
 * Gradient aggregation (bpf/aggregator.bpf.c, mirrored in ebpf/src/layout.rs and
 * ebpf/src/aggregator.rs; the protocol is documented in docs/aggregation-protocol.md).
 *
 * Wire: Ethernet | IPv4 (no options) | UDP to AGG_PORT | struct agg_hdr | count x __s32.
 * Unlike the rest of this header, the aggregation header and the values are little-endian:
 * the program adds the values where they lie, and every machine we run on is little-endian,
 * so nobody swaps bytes (the clients convert explicitly, so a big-endian client still works).
 */

/* The UDP port aggregators listen on. */
#define AGG_PORT 7481
/* "YAGG" as it appears on the wire (little-endian __u32). */
#define AGG_MAGIC 0x47474159
/* 3: every frame carries a token (agg_hdr.token; 2 had a reserved field there and 16-bit worker
 * and contributors; 1 carried contributors in `worker`, and a receiver that checked `worker` as
 * an index dropped a result of 64 contributions or more). */
#define AGG_VERSION 3
/*
 * Most values one frame carries: 768 x 4 B + 74 B of headers = 3146 B, inside the largest frame
 * native XDP takes on veth and most NIC drivers (one page less headroom and skb_shared_info).
 * A job's chunk size is the largest its interfaces' MTU allows, at most this.
 */
#define AGG_VALUES_MAX 768
/* Members of one job at one aggregator (a flat job's workers, a tree cluster's, a root's own plus
 * its clusters): the contribution bitmap is one __u64. */
#define AGG_WORKERS_MAX 64

enum agg_kind {
	AGG_DATA = 1,   /* worker (or cluster aggregator) -> aggregator: one chunk of one round's gradient (or partial sum) */
	AGG_RESULT = 2, /* aggregator -> worker (or parent -> cluster aggregator): the chunk's sum */
	AGG_FANOUT = 3, /* internal: a fresh result XDP hands to the TC fan-out, its token
			 * agg_job.fanout_tag; dropped if received, to AGG_PORT or any other port */
};

enum agg_dtype {
	AGG_DTYPE_I32 = 0, /* values are the gradient; sums wrap modulo 2^32 as int32 adds do */
	AGG_DTYPE_F32 = 1, /* values are fixed point: value x 2^(exp - AGG_FRAC_BITS(workers)) */
};

/* agg_hdr.flags */
#define AGG_F_RETX 0x01   /* a worker's resend after a timeout (handled like any DATA) */
#define AGG_F_REPLAY 0x02 /* a regrouped worker's stored result of its last round, for workers one round behind */

/* After the UDP header: 32 bytes, little-endian. */
struct agg_hdr {
	__u32 magic;   /* AGG_MAGIC */
	__u8 version;  /* AGG_VERSION */
	__u8 kind;     /* enum agg_kind */
	__u8 flags;    /* AGG_F_* */
	__s8 exp;      /* f32: the chunk's block exponent; i32: 0 */
	__u32 job;     /* the job's id, from the cluster's job table */
	__u32 epoch;   /* bumped by every regrouping (aggregator moved, worker gone) */
	__u32 round;   /* the training step: each round sums the whole gradient once */
	__u32 chunk;   /* the chunk's index in the gradient */
	__u8 worker;   /* DATA: the sender's index in the job (< AGG_WORKERS_MAX); RESULT: 0 */
	/*
	 * RESULT: the contributions the sum holds (a root's members, which may be 64: never an
	 * index, so never checked against AGG_WORKERS_MAX); DATA: 0.
	 */
	__u8 contributors;
	__u16 count;   /* values that follow, 1..AGG_VALUES_MAX */
	/*
	 * DATA: the sender's token at this aggregator (agg_member.token, or a cluster aggregator's
	 * agg_job.up_token at its parent); RESULT: the sending aggregator's agg_job.result_token;
	 * FANOUT: agg_job.fanout_tag. The control plane draws the first two per job, epoch,
	 * aggregator and worker from a secret the fabric never sees, and only members learn theirs,
	 * so a host that forges a member's (or the parent's) address but cannot read its traffic
	 * makes frames that are foreign.
	 */
	__u32 token;
};
YARD_ASSERT_SIZE(struct agg_hdr, 32);
YARD_ASSERT_OFFSET(struct agg_hdr, magic, 0);
YARD_ASSERT_OFFSET(struct agg_hdr, version, 4);
YARD_ASSERT_OFFSET(struct agg_hdr, kind, 5);
YARD_ASSERT_OFFSET(struct agg_hdr, flags, 6);
YARD_ASSERT_OFFSET(struct agg_hdr, exp, 7);
YARD_ASSERT_OFFSET(struct agg_hdr, job, 8);
YARD_ASSERT_OFFSET(struct agg_hdr, epoch, 12);
YARD_ASSERT_OFFSET(struct agg_hdr, round, 16);
YARD_ASSERT_OFFSET(struct agg_hdr, chunk, 20);
YARD_ASSERT_OFFSET(struct agg_hdr, worker, 24);
YARD_ASSERT_OFFSET(struct agg_hdr, contributors, 25);
YARD_ASSERT_OFFSET(struct agg_hdr, count, 26);
YARD_ASSERT_OFFSET(struct agg_hdr, token, 28);

/* agg_jobs: key __u32 job id -> the job as this aggregator serves it (filled from Raft). */
struct agg_job {
	__u32 epoch;        /* frames of any other epoch are stale */
	__u32 base;         /* first slot of the job's range in agg_slots */
	__u32 chunks;       /* chunks of the gradient; the range is 2 x chunks slots */
	__u32 values;       /* values of the gradient; the last chunk holds the remainder */
	__u16 chunk_values; /* values per chunk (the last may hold fewer) */
	__u16 workers;      /* contributions that complete a chunk: the members of this epoch */
	__u8 dtype;         /* enum agg_dtype */
	__u8 pad[3];        /* 0 */
	__u32 self_ip;      /* the address results are sent from (network order) */
	/*
	 * A cluster aggregator of a tree (ALEPH): where its finished partial sums go, as DATA
	 * frames from this host's AGG_PORT, and whose RESULT frames it takes as the chunk's result.
	 * parent_ip 0: this host is the job's root (or its only aggregator) and fans results out.
	 */
	__u32 parent_ip;      /* network order */
	__u16 parent_port;    /* network order */
	__u16 parent_worker;  /* this host's worker index in the parent's sums */
	__u8 parent_mac[6];   /* next hop toward the parent (the daemon resolves it) */
	__u8 pad2[2];         /* 0 */
	/*
	 * This load's fan-out tag (the loader draws it at random, never 0, and writes it into every
	 * job): yard_agg writes it as the token of each fresh result it hands to yard_agg_fanout,
	 * and the fan-out clones only a frame that carries it, after replacing it with
	 * result_token. It never leaves the host.
	 */
	__u32 fanout_tag;
	__u32 result_token;  /* the token of this aggregator's RESULT frames, which its members check */
	__u32 up_token;      /* a cluster aggregator: its token at the parent (its partial sums carry it) */
	__u32 parent_token;  /* a cluster aggregator: the parent's result_token (a RESULT needs it) */
};
YARD_ASSERT_SIZE(struct agg_job, 60);
YARD_ASSERT_OFFSET(struct agg_job, epoch, 0);
YARD_ASSERT_OFFSET(struct agg_job, base, 4);
YARD_ASSERT_OFFSET(struct agg_job, chunks, 8);
YARD_ASSERT_OFFSET(struct agg_job, values, 12);
YARD_ASSERT_OFFSET(struct agg_job, chunk_values, 16);
YARD_ASSERT_OFFSET(struct agg_job, workers, 18);
YARD_ASSERT_OFFSET(struct agg_job, dtype, 20);
YARD_ASSERT_OFFSET(struct agg_job, self_ip, 24);
YARD_ASSERT_OFFSET(struct agg_job, parent_ip, 28);
YARD_ASSERT_OFFSET(struct agg_job, parent_port, 32);
YARD_ASSERT_OFFSET(struct agg_job, parent_worker, 34);
YARD_ASSERT_OFFSET(struct agg_job, parent_mac, 36);
YARD_ASSERT_OFFSET(struct agg_job, fanout_tag, 44);
YARD_ASSERT_OFFSET(struct agg_job, result_token, 48);
YARD_ASSERT_OFFSET(struct agg_job, up_token, 52);
YARD_ASSERT_OFFSET(struct agg_job, parent_token, 56);

/* agg_members key: who may send for a job, by source address and port. */
struct agg_member_key {
	__u32 job;
	__u32 ip;   /* network order */
	__u16 port; /* network order */
	__u16 pad;  /* 0: part of the hashed key */
};
YARD_ASSERT_SIZE(struct agg_member_key, 12);
YARD_ASSERT_OFFSET(struct agg_member_key, job, 0);
YARD_ASSERT_OFFSET(struct agg_member_key, ip, 4);
YARD_ASSERT_OFFSET(struct agg_member_key, port, 8);

/* agg_members value. */
struct agg_member {
	__u16 worker; /* the index the member must claim in agg_hdr.worker */
	__u16 pad;
	__u32 token;  /* the token its frames must carry in agg_hdr.token */
};
YARD_ASSERT_SIZE(struct agg_member, 8);

/* agg_peers key: a job's worker by index, where the fan-out sends results. */
struct agg_peer_key {
	__u32 job;
	__u32 worker;
};
YARD_ASSERT_SIZE(struct agg_peer_key, 8);

/*
 * agg_peers value: the daemon writes ip and port; the program learns mac from the worker's
 * frames, and times them for the daemon's drift watch over the grouping's bandwidth figures
 * (yard_actors::aggregator::bandwidth::Drift): a frame that arrives within
 * AGG_BURST_GAP_NS of the member's previous one adds the gap to busy_ns and its length to
 * bytes, so bytes / busy_ns is the rate the member's frames arrived at while it was sending
 * (its compute time and waits for results, longer gaps, are left out).
 */
struct agg_peer {
	__u32 ip;     /* network order */
	__u16 port;   /* network order */
	__u8 mac[6];  /* next hop toward the worker: the source MAC of its latest accepted frame */
	__u32 pad;
	__u64 last_ns; /* bpf_ktime_get_ns() of the member's latest accepted frame */
	__u64 busy_ns;
	__u64 bytes;
};
YARD_ASSERT_SIZE(struct agg_peer, 40);
YARD_ASSERT_OFFSET(struct agg_peer, ip, 0);
YARD_ASSERT_OFFSET(struct agg_peer, port, 4);
YARD_ASSERT_OFFSET(struct agg_peer, mac, 6);
YARD_ASSERT_OFFSET(struct agg_peer, last_ns, 16);
YARD_ASSERT_OFFSET(struct agg_peer, busy_ns, 24);
YARD_ASSERT_OFFSET(struct agg_peer, bytes, 32);

/* The longest gap between a member's frames still counted as sending: a 1514-byte frame every
 * millisecond is 12 Mbit/s, below any link the grouping serves. */
#define AGG_BURST_GAP_NS 1000000ULL

/*
 * agg_slots value: one chunk of one round parity of one job. A slot whose (job, epoch) is not
 * the frame's is free, whatever it holds: a new job or a regrouping reuses memory without the
 * daemon clearing it first.
 */
struct agg_slot {
	struct bpf_spin_lock lock;
	__u32 job;
	__u32 epoch;
	__u32 round;
	__u64 seen;    /* bit w: worker w's contribution is in acc */
	__u16 count;   /* contributions in acc */
	__u16 values;  /* values in this chunk */
	__s8 exp;      /* f32: acc is in units of 2^(exp - frac bits) */
	__u8 done;     /* AGG_SLOT_*: summing, the result, or a partial sum sent to the parent */
	__u8 up_flags; /* AGG_SLOT_FORWARDED: the flags the partial went up with (AGG_F_REPLAY) */
	__u8 pad;
	__s32 acc[AGG_VALUES_MAX];
};
YARD_ASSERT_SIZE(struct agg_slot, 3104); /* 32 + 4 x AGG_VALUES_MAX */
YARD_ASSERT_OFFSET(struct agg_slot, seen, 16);
YARD_ASSERT_OFFSET(struct agg_slot, acc, 32);

/* agg_slot.done */
enum agg_slot_state {
	AGG_SLOT_SUMMING = 0,   /* contributions are being added */
	AGG_SLOT_DONE = 1,      /* acc is the chunk's result (the root's, in a tree) */
	AGG_SLOT_FORWARDED = 2, /* a cluster aggregator's partial sum, sent to the parent: waiting */
};

/* agg_job_counters key: a job and a reason (enum agg_counter_idx); value struct gw_counter. */
struct agg_job_counter_key {
	__u32 job;
	__u32 reason;
};
YARD_ASSERT_SIZE(struct agg_job_counter_key, 8);

/*
 * What yard_agg made of a frame: every frame counts exactly one of these, in agg_counters and,
 * when the job is known, in agg_job_counters. The Rust enum `AggCounter` has the same order.
 */
enum agg_counter_idx {
	AGG_ADDED = 0,          /* a new contribution, summed; the chunk is not complete yet */
	AGG_COMPLETED,          /* the last contribution: the result goes to every worker */
	AGG_RESULT_RESENT,      /* a contribution to a complete chunk: the result back to its sender */
	AGG_DUPLICATE,          /* a contribution already in the sum (not complete yet): dropped */
	AGG_STALE,              /* another epoch, or a round the slot has moved past: dropped */
	AGG_AHEAD,              /* a round two ahead of an incomplete slot (protocol breach): dropped */
	AGG_FOREIGN,            /* sender is not a member of the job it names, claims another index or lacks its
				 * token; a received FANOUT frame (XDP), or one without this load's tag (TC) */
	AGG_UNKNOWN_JOB,        /* no such job here */
	AGG_BAD_HEADER,         /* bad magic/version/kind/count/chunk/exponent, or truncated */
	AGG_PASS_NOT_AGG,       /* not IPv4 UDP to AGG_PORT: passed to the stack untouched */
	AGG_FANOUT_SENT,        /* TC: one copy of a result sent to one worker */
	AGG_FANOUT_FAILED,      /* TC: a worker's copy could not be sent (no address yet, clone failed) */
	AGG_FORWARDED,          /* the last contribution at a cluster aggregator: the partial sum to the parent */
	AGG_FORWARD_RESENT,     /* a contribution to a forwarded chunk: the partial sum to the parent again */
	AGG_FORWARD_FAILED,     /* a partial sum that could not go up (the parent's MAC is not known yet) */
	AGG_PARENT_RESULT,      /* the parent's result for a chunk: taken, and fanned out to the members */
	AGG_COUNTER_MAX,        /* number of counters: agg_counters' max_entries */
};
_Static_assert(AGG_COUNTER_MAX == 16, "Rust AggCounter::ALL has 16 entries");

/* Job-table and membership sizes, mirrored in Rust. agg_slots' size is set by the loader. */
#define AGG_JOBS_MAX 1024
#define AGG_MEMBERS_MAX 65536

#endif /* YARD_H */
