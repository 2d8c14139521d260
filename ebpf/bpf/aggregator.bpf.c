// SPDX-License-Identifier: GPL-2.0
/*
 * yard_agg: gradient aggregation in XDP with the whole gradient cached (XAgg; DESIGN.md,
 * "aggregator"; the protocol is docs/aggregation-protocol.md).
 *
 * Workers send each chunk of a round's gradient to UDP AGG_PORT on the aggregator host. Each
 * job owns a range of agg_slots sized to its whole gradient, twice (round parity), so a fast
 * worker never waits for a slow one's slot: every chunk of the round has its own slot, and the
 * next round uses the other half. A chunk's slot sums the contributions as they arrive; the one
 * that completes it becomes the result, which the TC program yard_agg_fanout sends to every
 * worker of the job. A contribution to a chunk that is already complete (its sender lost the
 * result and timed out) is answered with the stored result, to the sender only (XDP_TX).
 *
 * Exactness and exactly-once:
 * - a per-slot bitmap of contributors: a duplicate is never added twice;
 * - the completing contribution is the one that brings count to the job's workers, decided
 *   under the slot's spin lock, so one frame and only one fans the result out;
 * - int32 adds wrap modulo 2^32 (unsigned arithmetic), exactly as int32 tensors add;
 * - float32 travels as fixed point with one exponent per chunk and worker (SwitchML's block
 *   scheme, with the scale chosen so an N-way sum cannot overflow): the slot keeps the largest
 *   exponent seen and shifts whichever side is finer onto it before adding. Which side that is
 *   depends on arrival order, so the low bits of a float sum can differ from run to run, but a
 *   chunk is completed once and every worker gets that one stored result: bit-identical
 *   everywhere, and within the bound in the protocol document of the exact sum.
 * - across a regrouping too: a worker that had completed the round in flight sends its stored
 *   result of it (AGG_F_REPLAY), which becomes the chunk's result here whatever was added so
 *   far, so the workers that had not completed it get the very bits the others already have
 *   instead of a re-sum (whose low bits could differ).
 *
 * Slot lifetime: a slot whose (job, epoch) differ from the frame's is free, so a new job or a
 * regrouping reuses memory without the daemon clearing it. Within a job, round r + 2 may
 * overwrite a complete round r: a worker sends round r + 2 only after it has round r + 1's
 * result, which needed every worker's round r + 1 contribution, which each sent only after it
 * had round r's result. So nobody still needs round r. A round-(r + 2) frame reaching an
 * incomplete round r breaks that rule; it is dropped (AHEAD) rather than lose a sum. A replayed
 * result completes its slot at once, so the replay of a worker that was itself behind (a round
 * everybody has) never holds up the round after next.
 *
 * Admission: a frame must name a job served here, the job's current epoch, and come from the
 * source address and port the daemon registered for the worker index it claims
 * (agg_members, filled from Raft), so a worker of another job cannot add to this one's sums.
 * Anything else addressed to AGG_PORT is dropped and counted; any other traffic is passed to the
 * stack untouched. Every frame counts exactly one reason; the program never returns XDP_ABORTED.
 *
 * The UDP checksum is neither checked nor produced (results carry 0, which IPv4 allows): the
 * program would have to sum every payload byte, the Ethernet FCS already covers the wire, and
 * veth hands XDP frames whose checksum the sender left for offload.
 */
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>

#include "yard.h"

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AGG_JOBS_MAX);
	__type(key, __u32);
	__type(value, struct agg_job);
} agg_jobs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AGG_MEMBERS_MAX);
	__type(key, struct agg_member_key);
	__type(value, struct agg_member);
} agg_members SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AGG_MEMBERS_MAX);
	__type(key, struct agg_peer_key);
	__type(value, struct agg_peer);
} agg_peers SEC(".maps");

/* max_entries is the loader's (the host's aggregation memory budget); 1 is a placeholder. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct agg_slot);
} agg_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AGG_COUNTER_MAX);
	__type(key, __u32);
	__type(value, struct gw_counter);
} agg_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, AGG_JOBS_MAX * AGG_COUNTER_MAX);
	__type(key, struct agg_job_counter_key);
	__type(value, struct gw_counter);
} agg_job_counters SEC(".maps");

/* The headers every aggregation frame starts with; IPv4 options are not accepted. */
struct agg_frame {
	struct ethhdr eth;
	struct iphdr ip;
	struct udphdr udp;
	struct agg_hdr agg;
} __attribute__((packed));
_Static_assert(sizeof(struct agg_frame) == 14 + 20 + 8 + 32, "aggregation frame headers");
#define AGG_HEADERS sizeof(struct agg_frame)

#define IP_FRAG_MASK_BE bpf_htons(0x3fff) /* MF flag and fragment offset */

/* Counts one reason for this frame, globally and (job != 0) for its job. */
static __always_inline void count(__u32 idx, __u32 job, __u64 len)
{
	struct gw_counter *c = bpf_map_lookup_elem(&agg_counters, &idx);

	if (c) {
		/* per-CPU slot: no other writer */
		c->packets += 1;
		c->bytes += len;
	}
	if (!job)
		return;
	struct agg_job_counter_key key = { .job = job, .reason = idx };
	c = bpf_map_lookup_elem(&agg_job_counters, &key);
	if (c) {
		c->packets += 1;
		c->bytes += len;
	} else {
		struct gw_counter init = { .packets = 1, .bytes = len };

		/* a full table loses this count only: the global counter above has it */
		bpf_map_update_elem(&agg_job_counters, &key, &init, BPF_NOEXIST);
	}
}

/* Values in `chunk` of `job`: chunk_values, or the remainder in the last chunk. */
static __always_inline __u32 chunk_len(const struct agg_job *job, __u32 chunk)
{
	__u32 start = chunk * (__u32)job->chunk_values;

	return job->values - start < job->chunk_values ? job->values - start : job->chunk_values;
}

/*
 * The value loops run to the end of the frame, whose length was checked to be exactly the
 * header's count: their only exit condition is the packet bound, never the count. Had they
 * compared against the count, the verifier would narrow the count's range on every iteration
 * and walk the rest of the program once per possible count, past its 1M-instruction limit.
 * For the same reason, code after a loop re-derives its packet pointers from ctx (RELOAD):
 * the loop has widened the old pointers' verified range, and if they stayed live every
 * iteration's exit would be a distinct state to verify.
 */
#define RELOAD()                                                                                  \
	do {                                                                                      \
		asm volatile("" ::: "memory");                                                    \
		data = (void *)(long)ctx->data;                                                   \
		data_end = (void *)(long)ctx->data_end;                                           \
		eth = data;                                                                       \
		ip = data + sizeof(*eth);                                                         \
		udp = (void *)ip + sizeof(*ip);                                                   \
		h = (void *)udp + sizeof(*udp);                                                   \
		if ((void *)(h + 1) > data_end)                                                   \
			return XDP_DROP; /* cannot happen: checked before */                      \
	} while (0)

/* Writes the slot's sum over the frame's values. */
static __always_inline void write_result(struct xdp_md *ctx, struct agg_slot *slot)
{
	void *data_end = (void *)(long)ctx->data_end;
	__s32 *v = (void *)(long)ctx->data + AGG_HEADERS;

#pragma clang loop unroll(disable)
	for (__u32 i = 0; i < AGG_VALUES_MAX; i++) {
		if ((void *)(v + i + 1) > data_end)
			break;
		v[i] = slot->acc[i];
	}
}

/* Turns the frame around: from this host, to its sender. IPv4's checksum does not change. */
static __always_inline void reverse(struct ethhdr *eth, struct iphdr *ip, struct udphdr *udp)
{
	__u8 mac[ETH_ALEN];
	__u32 addr = ip->saddr;
	__u16 port = udp->source;

	__builtin_memcpy(mac, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, mac, ETH_ALEN);
	ip->saddr = ip->daddr;
	ip->daddr = addr;
	udp->source = udp->dest;
	udp->dest = port;
	udp->check = 0;
}

enum outcome { ADD, COMPLETE, RESEND, DUP, STALE, AHEAD };

SEC("xdp")
int yard_agg(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u64 len = data_end - data;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);
	struct udphdr *udp = (void *)ip + sizeof(*ip);
	struct agg_hdr *h = (void *)udp + sizeof(*udp);

	/* Only IPv4 UDP to AGG_PORT is ours; everything else goes on untouched. */
	if ((void *)(ip + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP) ||
	    ip->version != 4 || ip->ihl != 5 || ip->protocol != IPPROTO_UDP ||
	    (ip->frag_off & IP_FRAG_MASK_BE)) {
		count(AGG_PASS_NOT_AGG, 0, len);
		return XDP_PASS;
	}
	if ((void *)(udp + 1) > data_end || udp->dest != bpf_htons(AGG_PORT)) {
		count(AGG_PASS_NOT_AGG, 0, len);
		return XDP_PASS;
	}
	if ((void *)(h + 1) > data_end) {
		count(AGG_BAD_HEADER, 0, len);
		return XDP_DROP;
	}
	__u32 n = h->count;

	if (h->magic != AGG_MAGIC || h->version != AGG_VERSION || h->kind != AGG_DATA ||
	    h->reserved != 0 || n == 0 || n > AGG_VALUES_MAX) {
		count(AGG_BAD_HEADER, 0, len);
		return XDP_DROP;
	}
	/* The frame holds exactly the values announced, and the IPv4 and UDP lengths say so. */
	__u32 frame_len = AGG_HEADERS + n * 4;
	if (data + frame_len != data_end || bpf_ntohs(ip->tot_len) != frame_len - 14 ||
	    bpf_ntohs(udp->len) != frame_len - 34) {
		count(AGG_BAD_HEADER, 0, len);
		return XDP_DROP;
	}

	__u32 job_id = h->job;
	struct agg_job *job = bpf_map_lookup_elem(&agg_jobs, &job_id);
	if (!job) {
		count(AGG_UNKNOWN_JOB, 0, len);
		return XDP_DROP;
	}
	if (h->chunk >= job->chunks || n != chunk_len(job, h->chunk) ||
	    (job->dtype == AGG_DTYPE_I32 && h->exp != 0) || h->worker >= AGG_WORKERS_MAX) {
		count(AGG_BAD_HEADER, job_id, len);
		return XDP_DROP;
	}
	if (h->epoch != job->epoch) {
		count(AGG_STALE, job_id, len);
		return XDP_DROP;
	}
	struct agg_member_key mkey = {
		.job = job_id, .ip = ip->saddr, .port = udp->source, .pad = 0,
	};
	struct agg_member *member = bpf_map_lookup_elem(&agg_members, &mkey);
	if (!member || member->worker != h->worker) {
		count(AGG_FOREIGN, job_id, len);
		return XDP_DROP;
	}
	/* The fan-out sends to the MAC this worker's frames come from (its host, or the router). */
	struct agg_peer_key pkey = { .job = job_id, .worker = h->worker };
	struct agg_peer *peer = bpf_map_lookup_elem(&agg_peers, &pkey);
	if (peer)
		__builtin_memcpy(peer->mac, eth->h_source, ETH_ALEN);

	__u32 slot_idx = job->base + h->chunk * 2 + (h->round & 1);
	struct agg_slot *slot = bpf_map_lookup_elem(&agg_slots, &slot_idx);
	if (!slot) {
		/* the daemon sized the job's range inside the map; a miss means it did not */
		count(AGG_BAD_HEADER, job_id, len);
		return XDP_DROP;
	}

	__u64 bit = 1ULL << h->worker;
	__u16 workers = job->workers;
	__s32 *v = (void *)(h + 1);
	int replay = (h->flags & AGG_F_REPLAY) != 0;
	enum outcome out;
	int fresh;

	bpf_spin_lock(&slot->lock);
	fresh = slot->job != job_id || slot->epoch != h->epoch;
	if (!fresh && h->round != slot->round) {
		if ((__s32)(h->round - slot->round) < 0) {
			out = STALE;
			goto unlock;
		}
		if (!slot->done) {
			out = AHEAD;
			goto unlock;
		}
		fresh = 1;
	}
	if (!fresh && slot->done) {
		out = RESEND;
		goto unlock;
	}
	if (fresh || replay) {
		/* A first contribution, or a replayed result: the sum from now on (a result counts as
		 * every worker's contribution, and overrides what was added of the same round). */
		slot->job = job_id;
		slot->epoch = h->epoch;
		slot->round = h->round;
		slot->seen = bit;
		slot->count = replay ? workers : 1;
		slot->values = n;
		slot->exp = h->exp;
		slot->done = 0;
#pragma clang loop unroll(disable)
		for (__u32 i = 0; i < AGG_VALUES_MAX; i++) {
			if ((void *)(v + i + 1) > data_end)
				break;
			slot->acc[i] = v[i];
		}
	} else if (slot->seen & bit) {
		out = DUP;
		goto unlock;
	} else {
		/* Bring both sides to the coarser exponent, then add (f32; i32 shifts by 0). */
		__s32 up = (__s32)h->exp - (__s32)slot->exp;
		__u32 shift_acc = up > 0 ? (up > 31 ? 31 : up) : 0;
		__u32 shift_val = up < 0 ? (-up > 31 ? 31 : -up) : 0;

		if (up > 0)
			slot->exp = h->exp;
#pragma clang loop unroll(disable)
		for (__u32 i = 0; i < AGG_VALUES_MAX; i++) {
			if ((void *)(v + i + 1) > data_end)
				break;
			__u32 a = (__u32)(slot->acc[i] >> shift_acc);
			__u32 b = (__u32)(v[i] >> shift_val);

			slot->acc[i] = (__s32)(a + b);
		}
		slot->seen |= bit;
		slot->count += 1;
	}
	if (slot->count >= workers) {
		slot->done = 1;
		out = COMPLETE;
	} else {
		out = ADD;
	}
unlock:
	bpf_spin_unlock(&slot->lock);
	RELOAD();

	switch (out) {
	case ADD:
		count(AGG_ADDED, job_id, len);
		return XDP_DROP;
	case DUP:
		count(AGG_DUPLICATE, job_id, len);
		return XDP_DROP;
	case STALE:
		count(AGG_STALE, job_id, len);
		return XDP_DROP;
	case AHEAD:
		count(AGG_AHEAD, job_id, len);
		return XDP_DROP;
	default:
		break;
	}
	/*
	 * COMPLETE or RESEND: the slot is done, and stays unchanged until round + 2 (see the top of
	 * this file), so its sum is read without the lock.
	 */
	RELOAD();
	write_result(ctx, slot);
	RELOAD();
	h->exp = slot->exp;
	h->worker = slot->count;
	h->flags = 0;
	reverse(eth, ip, udp);
	if (out == RESEND) {
		h->kind = AGG_RESULT;
		count(AGG_RESULT_RESENT, job_id, len);
		return XDP_TX;
	}
	/* To every worker: yard_agg_fanout, on this interface's TC ingress, copies it out. */
	h->kind = AGG_FANOUT;
	count(AGG_COMPLETED, job_id, len);
	return XDP_PASS;
}

#define ETH_OFF_DEST 0
#define IP_OFF_CHECK (14 + __builtin_offsetof(struct iphdr, check))
#define IP_OFF_DADDR (14 + __builtin_offsetof(struct iphdr, daddr))
#define UDP_OFF_DEST (14 + 20 + __builtin_offsetof(struct udphdr, dest))
#define AGG_OFF_KIND (14 + 20 + 8 + __builtin_offsetof(struct agg_hdr, kind))

/*
 * yard_agg_fanout: TC ingress on the aggregator's interface. XDP can send a frame back only
 * where it came from, so a fresh result (kind AGG_FANOUT, which only yard_agg produces: it drops
 * every received frame that is not DATA) comes here as an skb, is re-addressed to each worker of
 * its job in turn and cloned out of the interface; the original is then dropped. Workers whose
 * MAC is not known yet (no frame of theirs accepted) are skipped and counted: they get the
 * result by resending their contribution. Every other packet gets no verdict.
 */
SEC("classifier")
int yard_agg_fanout(struct __sk_buff *skb)
{
	struct agg_frame f;
	__u64 len = skb->len;

	if (bpf_skb_load_bytes(skb, 0, &f, sizeof(f)) < 0 || f.eth.h_proto != bpf_htons(ETH_P_IP) ||
	    f.ip.protocol != IPPROTO_UDP || f.ip.ihl != 5 || f.udp.source != bpf_htons(AGG_PORT) ||
	    f.agg.magic != AGG_MAGIC || f.agg.kind != AGG_FANOUT)
		return TC_ACT_UNSPEC;

	__u32 job_id = f.agg.job;
	struct agg_job *job = bpf_map_lookup_elem(&agg_jobs, &job_id);
	if (!job)
		return TC_ACT_SHOT;
	__u32 workers = job->workers;
	__u8 kind = AGG_RESULT;
	__u32 daddr = f.ip.daddr;

	if (bpf_skb_store_bytes(skb, AGG_OFF_KIND, &kind, 1, 0) < 0)
		return TC_ACT_SHOT;
#pragma clang loop unroll(disable)
	for (__u32 w = 0; w < AGG_WORKERS_MAX; w++) {
		if (w >= workers)
			break;
		struct agg_peer_key key = { .job = job_id, .worker = w };
		struct agg_peer *peer = bpf_map_lookup_elem(&agg_peers, &key);
		__u8 mac[ETH_ALEN];
		__u32 ip;
		__u16 port;

		if (!peer) {
			count(AGG_FANOUT_FAILED, job_id, len);
			continue;
		}
		__builtin_memcpy(mac, peer->mac, ETH_ALEN);
		ip = peer->ip;
		port = peer->port;
		if (!(mac[0] | mac[1] | mac[2] | mac[3] | mac[4] | mac[5])) {
			count(AGG_FANOUT_FAILED, job_id, len);
			continue;
		}
		if (bpf_skb_store_bytes(skb, ETH_OFF_DEST, mac, ETH_ALEN, 0) < 0 ||
		    bpf_l3_csum_replace(skb, IP_OFF_CHECK, daddr, ip, 4) < 0 ||
		    bpf_skb_store_bytes(skb, IP_OFF_DADDR, &ip, 4, 0) < 0 ||
		    bpf_skb_store_bytes(skb, UDP_OFF_DEST, &port, 2, 0) < 0) {
			count(AGG_FANOUT_FAILED, job_id, len);
			return TC_ACT_SHOT;
		}
		daddr = ip;
		if (bpf_clone_redirect(skb, skb->ifindex, 0) < 0)
			count(AGG_FANOUT_FAILED, job_id, len);
		else
			count(AGG_FANOUT_SENT, job_id, len);
	}
	return TC_ACT_SHOT;
}
