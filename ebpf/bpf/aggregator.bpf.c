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
 * Trees (ALEPH): a job may be summed by a tree of aggregators, one per cluster of workers. A
 * cluster aggregator (agg_job.parent_ip set) completes a chunk like any other, but sends the
 * partial sum up as a DATA frame to its parent, where it is one contribution under this host's
 * worker index (slot state AGG_SLOT_FORWARDED), and takes the parent's RESULT frame as the
 * chunk's result, which it fans out to its members (AGG_SLOT_DONE). The parent is just an
 * aggregator whose members include its children, so the root needs nothing new. Losses are
 * repaired from below: a member that times out resends its contribution, and a cluster
 * aggregator that holds a forwarded chunk answers it by sending the partial up again, which the
 * parent adds, drops as a duplicate or answers with its stored result. Every level checks the
 * job's epoch, so a regrouping never sums a chunk under two trees. A replayed result
 * (AGG_F_REPLAY) goes up flagged as such, so the root takes it as the chunk's result too.
 * Fixed point: the workers scale for the job's whole N, so partial sums and the root's sum
 * both fit int32 by construction.
 *
 * Admission: a frame must name a job served here, the job's current epoch, and come from the
 * source address and port the daemon registered for the worker index it claims
 * (agg_members, filled from Raft), so a worker of another job cannot add to this one's sums,
 * with the member's token (agg_hdr.token), so a host that forges the member's address but cannot
 * read its traffic cannot either (nor replay a result, nor re-point the member's results to its
 * own MAC). A parent's RESULT needs the parent's token likewise. Results leave with this
 * aggregator's result token, which the workers check. The tokens are compared per frame; no
 * payload byte is hashed (the per-byte cost stays the sum's).
 * Anything else addressed to AGG_PORT is dropped and counted; any other traffic is passed to the
 * stack untouched, except a frame from AGG_PORT of kind AGG_FANOUT, which only this program may
 * make (see yard_agg_fanout): dropped, counted AGG_FOREIGN. Every frame counts exactly one
 * reason; the program never returns XDP_ABORTED.
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

#include "ipv4.h"
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

/*
 * Sum strategies (issue 12, "measure atomic adds against per-CPU partial sums and a spin lock").
 * The shipped program sums a slot under its bpf_spin_lock. build.rs also compiles this file
 * with -DAGG_SUM_ATOMIC and with -DAGG_SUM_PERCPU into objects used only by the agg_variants
 * tests and the agg-sum-variants bench, so the three are measured on one source:
 * - ATOMIC: every value added with __sync_fetch_and_add into the shared slot; int32 only,
 *   because float32's re-scaling (shift the sum onto a coarser exponent, then add) is a
 *   read-modify-write of every value that no atomic instruction does;
 * - PERCPU: each CPU sums into its own copy of the slot (agg_partials, a per-CPU array indexed
 *   like agg_slots), with the shipped shift-and-add, no lock; the completing contribution
 *   merges every CPU's partial with bpf_map_lookup_percpu_elem into the shared slot.
 * Both decide membership of the sum without the lock: the slot's `seen` word is
 * round << 32 | bitmap, claimed with one compare-and-swap (so a contribution cannot be counted
 * into a round the slot moved on to), which limits them to 32 workers; `count` and `values`
 * read as one __u32 finish counter, and the contribution whose fetch-and-add brings it to the
 * job's workers completes the chunk, after every add (each adds before it counts).
 * A lock-free slot cannot be re-initialised by its first contributor (the others would add
 * into it meanwhile), so the completer of (chunk, round r) recycles the other parity's slot
 * for round r + 1 (every worker had round r - 1's result before contributing to round r), and
 * the daemon prepares a job's slots for its first round (Aggregator::prepare_round). What the
 * variants do not do: regrouping (a new epoch needs prepare_round again, and a replayed result,
 * AGG_F_REPLAY, is dropped as stale rather than taken as the chunk's result).
 */
#if defined(AGG_SUM_ATOMIC) && defined(AGG_SUM_PERCPU)
#error "one sum variant at a time"
#endif
#if defined(AGG_SUM_ATOMIC) || defined(AGG_SUM_PERCPU)
#define AGG_SUM_VARIANT 1
#define AGG_SLOT_WORKERS 32 /* the low half of the seen word */
#else
#define AGG_SLOT_WORKERS AGG_WORKERS_MAX
#endif

#ifdef AGG_SUM_PERCPU
/* One CPU's part of one slot's sum. */
struct agg_partial {
	__u32 count; /* contributions summed on this CPU this round; 0: exp and acc are free */
	__s8 exp;
	__u8 pad[3];
	__s32 acc[AGG_VALUES_MAX];
};

/* max_entries is the loader's: agg_slots' size. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct agg_partial);
} agg_partials SEC(".maps");

/* Past any CPU count: bpf_map_lookup_percpu_elem returns NULL from nr_cpu_ids on. */
#define AGG_CPUS_MAX 8192
#endif

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

#ifndef AGG_SUM_VARIANT
/* Copies the frame's values into the slot's sum (the packet bounds the loop, as above). */
static __always_inline void take_values(struct agg_slot *slot, __s32 *v, void *data_end)
{
#pragma clang loop unroll(disable)
	for (__u32 i = 0; i < AGG_VALUES_MAX; i++) {
		if ((void *)(v + i + 1) > data_end)
			break;
		slot->acc[i] = v[i];
	}
}
#endif

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

#ifdef AGG_SUM_VARIANT
/* The slot's finish counter: count (low half, little-endian) and values (kept 0) as one word. */
static __always_inline __u32 *finish_word(struct agg_slot *slot)
{
	return (__u32 *)&slot->count;
}

/*
 * Sets done (byte 1 of the word at exp, offset 28) with a fully ordered atomic, so a reader
 * that sees done also sees the sum and the recycled other slot.
 */
static __always_inline void mark_done(struct agg_slot *slot)
{
	__sync_fetch_and_or((__u32 *)&slot->exp, 1U << 8);
}

#ifdef AGG_SUM_ATOMIC
/* Zeroes the first (frame's count) values of a slot's sum, the frame bounding the loop. */
static __always_inline void zero_acc(struct xdp_md *ctx, struct agg_slot *slot)
{
	void *data_end = (void *)(long)ctx->data_end;
	__s32 *v = (void *)(long)ctx->data + AGG_HEADERS;

#pragma clang loop unroll(disable)
	for (__u32 i = 0; i < AGG_VALUES_MAX; i++) {
		if ((void *)(v + i + 1) > data_end)
			break;
		slot->acc[i] = 0;
	}
}
#endif

#ifdef AGG_SUM_PERCPU
/* What merge_cpu needs: the slot, its chunk's values, and whether a partial is merged yet. */
struct agg_merge {
	__u32 idx;
	__u32 n;
	__u32 first;
};

/*
 * bpf_loop callback: merges CPU `cpu`'s partial of slot m->idx into the shared slot (the
 * shipped shift-and-add, a partial standing for one contribution) and frees the partial. Run
 * by the completing contribution only, after every contributor has counted, so no CPU writes
 * the partials meanwhile. A callback, because a loop over CPUs around a loop over values would
 * be walked by the verifier once per CPU it cannot rule out.
 */
static long merge_cpu(__u64 cpu, void *arg)
{
	struct agg_merge *m = arg;
	__u32 idx = m->idx;
	struct agg_partial *p = bpf_map_lookup_percpu_elem(&agg_partials, &idx, (__u32)cpu);

	if (!p)
		return 1; /* no such CPU: every one is merged */
	if (!p->count)
		return 0;
	struct agg_slot *s = bpf_map_lookup_elem(&agg_slots, &idx);
	if (!s)
		return 1;
	__u32 n = m->n;

	if (m->first) {
		s->exp = p->exp;
#pragma clang loop unroll(disable)
		for (__u32 i = 0; i < AGG_VALUES_MAX; i++) {
			if (i >= n)
				break;
			s->acc[i] = p->acc[i];
		}
		m->first = 0;
	} else {
		__s32 up = (__s32)p->exp - (__s32)s->exp;
		__u32 shift_acc = up > 0 ? (up > 31 ? 31 : up) : 0;
		__u32 shift_val = up < 0 ? (-up > 31 ? 31 : -up) : 0;

		if (up > 0)
			s->exp = p->exp;
#pragma clang loop unroll(disable)
		for (__u32 i = 0; i < AGG_VALUES_MAX; i++) {
			if (i >= n)
				break;
			__u32 a = (__u32)(s->acc[i] >> shift_acc);
			__u32 b = (__u32)(p->acc[i] >> shift_val);

			s->acc[i] = (__s32)(a + b);
		}
	}
	p->count = 0;
	return 0;
}
#endif
#endif /* AGG_SUM_VARIANT */

enum outcome { ADD, COMPLETE, RESEND, DUP, STALE, AHEAD, FORWARD, FORWARD_AGAIN, PARENT };

/*
 * Sends the slot's partial sum to the job's parent as a DATA frame with this host's worker
 * index there, out of the interface it came in on (XDP_TX). The frame is a member's DATA frame
 * of the same chunk, so its length is already the chunk's.
 */
static __always_inline int forward_up(struct xdp_md *ctx, const struct agg_job *job,
				      struct agg_slot *slot, __u32 job_id, __u64 len, __u32 reason)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);
	struct udphdr *udp = (void *)ip + sizeof(*ip);
	struct agg_hdr *h = (void *)udp + sizeof(*udp);
	__u8 mac[ETH_ALEN];

	if ((void *)(h + 1) > data_end)
		return XDP_DROP; /* cannot happen: checked before */
	__builtin_memcpy(mac, job->parent_mac, ETH_ALEN);
	if (!(mac[0] | mac[1] | mac[2] | mac[3] | mac[4] | mac[5])) {
		/* the daemon has not resolved the parent yet: a member's resend tries again */
		count(AGG_FORWARD_FAILED, job_id, len);
		return XDP_DROP;
	}
	write_result(ctx, slot);
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	eth = data;
	ip = data + sizeof(*eth);
	udp = (void *)ip + sizeof(*ip);
	h = (void *)udp + sizeof(*udp);
	if ((void *)(h + 1) > data_end)
		return XDP_DROP;
	h->kind = AGG_DATA;
	h->flags = slot->up_flags;
	h->exp = slot->exp;
	h->worker = job->parent_worker;
	h->contributors = 0;
	h->token = job->up_token;
	/* From this host (the member addressed it) to the parent. */
	__builtin_memcpy(eth->h_source, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, mac, ETH_ALEN);
	ip->saddr = job->self_ip;
	ip->daddr = job->parent_ip;
	ip->ttl = 64;
	ip->check = ipv4_csum20(ip);
	udp->source = bpf_htons(AGG_PORT);
	udp->dest = job->parent_port;
	udp->check = 0;
	count(reason, job_id, len);
	return XDP_TX;
}

static __always_inline int agg_xdp(struct xdp_md *ctx)
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
	if ((void *)(udp + 1) > data_end) {
		count(AGG_PASS_NOT_AGG, 0, len);
		return XDP_PASS;
	}
	if (udp->dest != bpf_htons(AGG_PORT)) {
		/*
		 * Not ours, but a frame that looks like one of our fresh results (from AGG_PORT, kind
		 * FANOUT) would be cloned to a whole job by yard_agg_fanout: only this program makes
		 * those, so one that arrives was forged (results to a worker on this host are RESULT).
		 */
		if (udp->source == bpf_htons(AGG_PORT) && (void *)(h + 1) <= data_end &&
		    h->magic == AGG_MAGIC && h->kind == AGG_FANOUT) {
			count(AGG_FOREIGN, 0, len);
			return XDP_DROP;
		}
		count(AGG_PASS_NOT_AGG, 0, len);
		return XDP_PASS;
	}
	if ((void *)(h + 1) > data_end) {
		count(AGG_BAD_HEADER, 0, len);
		return XDP_DROP;
	}
	__u32 n = h->count;

	if (h->magic != AGG_MAGIC || h->version != AGG_VERSION ||
	    (h->kind != AGG_DATA && h->kind != AGG_RESULT) || n == 0 || n > AGG_VALUES_MAX) {
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
	    (job->dtype == AGG_DTYPE_I32 && h->exp != 0) || h->worker >= AGG_SLOT_WORKERS
#ifdef AGG_SUM_ATOMIC
	    || job->dtype != AGG_DTYPE_I32
#endif
	) {
		count(AGG_BAD_HEADER, job_id, len);
		return XDP_DROP;
	}
	if (h->epoch != job->epoch) {
		count(AGG_STALE, job_id, len);
		return XDP_DROP;
	}
	/* A RESULT only from this cluster aggregator's parent, to its AGG_PORT, with its token. */
	int from_parent = h->kind == AGG_RESULT;

	if (from_parent && (!job->parent_ip || ip->saddr != job->parent_ip ||
			    udp->source != job->parent_port || h->token != job->parent_token)) {
		count(AGG_FOREIGN, job_id, len);
		return XDP_DROP;
	}
#ifdef AGG_SUM_VARIANT
	if (from_parent) {
		count(AGG_BAD_HEADER, job_id, len); /* the variants sum flat jobs only */
		return XDP_DROP;
	}
#endif
	if (from_parent)
		goto admitted;
	struct agg_member_key mkey = {
		.job = job_id, .ip = ip->saddr, .port = udp->source, .pad = 0,
	};
	struct agg_member *member = bpf_map_lookup_elem(&agg_members, &mkey);
	/* The token proves the frame is the member's own: without it, nothing below (its sum, a
	 * replayed result, the MAC its results go to) may be touched. */
	if (!member || member->worker != h->worker || member->token != h->token) {
		count(AGG_FOREIGN, job_id, len);
		return XDP_DROP;
	}
	/* The fan-out sends to the MAC this worker's frames come from (its host, or the router). */
	struct agg_peer_key pkey = { .job = job_id, .worker = h->worker };
	struct agg_peer *peer = bpf_map_lookup_elem(&agg_peers, &pkey);
	if (peer) {
		__builtin_memcpy(peer->mac, eth->h_source, ETH_ALEN);
		/* Arrival timing for the bandwidth figures (see struct agg_peer). */
		__u64 now = bpf_ktime_get_ns();
		__u64 last = peer->last_ns;

		if (last && now > last && now - last < AGG_BURST_GAP_NS) {
			__sync_fetch_and_add(&peer->busy_ns, now - last);
			__sync_fetch_and_add(&peer->bytes, len);
		}
		peer->last_ns = now;
	}

admitted:;
	__u32 slot_idx = job->base + h->chunk * 2 + (h->round & 1);
	struct agg_slot *slot = bpf_map_lookup_elem(&agg_slots, &slot_idx);
	if (!slot) {
		/* the daemon sized the job's range inside the map; a miss means it did not */
		count(AGG_BAD_HEADER, job_id, len);
		return XDP_DROP;
	}

#ifndef AGG_SUM_VARIANT
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
		/* Only a result may be overwritten by round + 2 (see the top of this file). */
		if (slot->done != AGG_SLOT_DONE) {
			out = AHEAD;
			goto unlock;
		}
		fresh = 1;
	}
	if (!fresh && slot->done == AGG_SLOT_DONE) {
		out = from_parent ? DUP : RESEND;
		goto unlock;
	}
	if (from_parent) {
		/* The root's result, whatever this host had summed or sent up of the round. */
		slot->job = job_id;
		slot->epoch = h->epoch;
		slot->round = h->round;
		slot->seen = ~0ULL;
		slot->count = h->contributors;
		slot->values = n;
		slot->exp = h->exp;
		slot->done = AGG_SLOT_DONE;
		slot->up_flags = 0;
		take_values(slot, v, data_end);
		out = PARENT;
		goto unlock;
	}
	/*
	 * A member's frame for a chunk whose partial sum went up: it timed out waiting, so the
	 * partial (or the parent's answer) was lost; send it up again. A replayed result still
	 * replaces a partial that was summed, as it would an incomplete sum.
	 */
	if (!fresh && slot->done == AGG_SLOT_FORWARDED &&
	    !(replay && !(slot->up_flags & AGG_F_REPLAY))) {
		out = FORWARD_AGAIN;
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
		slot->done = AGG_SLOT_SUMMING;
		slot->up_flags = 0;
		take_values(slot, v, data_end);
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
		if (job->parent_ip) {
			/* A cluster aggregator: the partial sum goes up, the result comes down. */
			slot->done = AGG_SLOT_FORWARDED;
			slot->up_flags = replay ? AGG_F_REPLAY : 0;
			out = FORWARD;
		} else {
			slot->done = AGG_SLOT_DONE;
			out = COMPLETE;
		}
	} else {
		out = ADD;
	}
unlock:
	bpf_spin_unlock(&slot->lock);
#else  /* AGG_SUM_VARIANT: no lock; see the top of this file */
	__u32 round = h->round;
	__u32 bit = 1U << h->worker;
	__u32 chunk = h->chunk;
#ifdef AGG_SUM_PERCPU
	__s8 exp = h->exp;
#endif
	__u16 workers = job->workers;
	__u32 other_idx = job->base + chunk * 2 + ((round + 1) & 1);
	__s32 *v = (void *)(h + 1);
	enum outcome out;
	int claimed = 0;
#ifdef AGG_SUM_PERCPU
	struct agg_partial *part = bpf_map_lookup_elem(&agg_partials, &slot_idx);

	if (!part) {
		/* sized like agg_slots by the loader: a miss means it was not */
		count(AGG_BAD_HEADER, job_id, len);
		return XDP_DROP;
	}
#endif
	if (slot->job != job_id || slot->epoch != h->epoch) {
		out = STALE; /* not prepared for this job and epoch */
		goto decided;
	}
	if (h->flags & AGG_F_REPLAY) {
		out = STALE; /* a replayed result: the variants do not regroup */
		goto decided;
	}
	__u64 word = *(volatile __u64 *)&slot->seen;

#pragma clang loop unroll(disable)
	for (int i = 0; i < AGG_SLOT_WORKERS; i++) {
		__u32 tag = word >> 32;

		if (tag != round) {
			out = (__s32)(round - tag) < 0 ? STALE : AHEAD;
			goto decided;
		}
		if (*(volatile __u8 *)&slot->done) {
			out = RESEND;
			goto decided;
		}
		if ((__u32)word & bit) {
			out = DUP;
			goto decided;
		}
		__u64 was = __sync_val_compare_and_swap(&slot->seen, word, word | bit);

		if (was == word) {
			claimed = 1;
			break;
		}
		word = was; /* another worker claimed its bit first: at most 31 times */
	}
	if (!claimed) {
		out = DUP; /* cannot happen: see the loop */
		goto decided;
	}
#ifdef AGG_SUM_ATOMIC
#pragma clang loop unroll(disable)
	for (__u32 i = 0; i < AGG_VALUES_MAX; i++) {
		if ((void *)(v + i + 1) > data_end)
			break;
		__sync_fetch_and_add(&slot->acc[i], v[i]);
	}
#else
	if (part->count == 0) {
		part->exp = exp;
#pragma clang loop unroll(disable)
		for (__u32 i = 0; i < AGG_VALUES_MAX; i++) {
			if ((void *)(v + i + 1) > data_end)
				break;
			part->acc[i] = v[i];
		}
	} else {
		__s32 up = (__s32)exp - (__s32)part->exp;
		__u32 shift_acc = up > 0 ? (up > 31 ? 31 : up) : 0;
		__u32 shift_val = up < 0 ? (-up > 31 ? 31 : -up) : 0;

		if (up > 0)
			part->exp = exp;
#pragma clang loop unroll(disable)
		for (__u32 i = 0; i < AGG_VALUES_MAX; i++) {
			if ((void *)(v + i + 1) > data_end)
				break;
			__u32 a = (__u32)(part->acc[i] >> shift_acc);
			__u32 b = (__u32)(v[i] >> shift_val);

			part->acc[i] = (__s32)(a + b);
		}
	}
	part->count += 1;
#endif
	/* Counted after adding: the one that brings the count to workers sees every add. */
	__u32 before = __sync_fetch_and_add(finish_word(slot), 1);

	out = before + 1 == workers ? COMPLETE : ADD;
decided:
	if (out == COMPLETE) {
#ifdef AGG_SUM_PERCPU
		struct agg_merge m = { .idx = slot_idx, .n = chunk_len(job, chunk), .first = 1 };

		bpf_loop(AGG_CPUS_MAX, merge_cpu, &m, 0);
#endif
		/*
		 * Every worker contributed to round r, so each has round r - 1's result: the other
		 * parity's slot becomes round r + 1's, before this result (the first thing that lets
		 * a worker send round r + 1) leaves. Its tag first, so a late round r - 1 frame that
		 * reads it is stale; one that read it just before may be answered from a sum being
		 * cleared, and its sender, already in round r, ignores a round r - 1 result.
		 */
		struct agg_slot *o = bpf_map_lookup_elem(&agg_slots, &other_idx);

		if (o) {
			o->seen = (__u64)(round + 1) << 32;
			o->round = round + 1;
			*finish_word(o) = 0;
			o->done = 0;
#ifdef AGG_SUM_ATOMIC
			zero_acc(ctx, o);
#endif
		}
		mark_done(slot);
	}
#endif /* AGG_SUM_VARIANT */
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
	case FORWARD:
		return forward_up(ctx, job, slot, job_id, len, AGG_FORWARDED);
	case FORWARD_AGAIN:
		return forward_up(ctx, job, slot, job_id, len, AGG_FORWARD_RESENT);
	case PARENT:
		/* The values in the frame are the result: to every member through the fan-out. */
		h->kind = AGG_FANOUT;
		h->flags = 0;
		h->worker = 0;
		h->token = job->fanout_tag;
		reverse(eth, ip, udp);
		count(AGG_PARENT_RESULT, job_id, len);
		return XDP_PASS;
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
	h->worker = 0;
	h->contributors = (__u8)slot->count; /* at most AGG_WORKERS_MAX */
	h->flags = 0;
	reverse(eth, ip, udp);
	if (out == RESEND) {
		h->kind = AGG_RESULT;
		h->token = job->result_token;
		count(AGG_RESULT_RESENT, job_id, len);
		return XDP_TX;
	}
	/*
	 * To every worker: yard_agg_fanout, on this interface's TC ingress, copies it out if it
	 * carries this load's tag, which it replaces with the result token (see struct agg_job).
	 */
	h->kind = AGG_FANOUT;
	h->token = job->fanout_tag;
	count(AGG_COMPLETED, job_id, len);
	return XDP_PASS;
}

SEC("xdp")
int yard_agg(struct xdp_md *ctx)
{
	return agg_xdp(ctx);
}

/*
 * The same program built for multi-buffer XDP (issue 26, jumbo frames): a driver refuses a
 * single-buffer program while its MTU exceeds what one buffer holds (veth: about a page), so
 * Aggregator::attach falls back to this one there. It reads only the first buffer, like
 * yard_agg: a frame split over several buffers (longer than the first, which on veth holds
 * about 3.5 KB, more than the largest aggregation frame) fails the length check and is dropped,
 * counted AGG_BAD_HEADER, never summed in part; traffic that is not aggregation passes whole.
 */
SEC("xdp.frags")
int yard_agg_frags(struct xdp_md *ctx)
{
	return agg_xdp(ctx);
}

/*
 * yard_agg_fanout: TC ingress on the aggregator's interface. XDP can send a frame back only
 * where it came from, so a fresh result (kind AGG_FANOUT) comes here as an skb and is sent to
 * each worker of its job in turn. Workers whose MAC is not known yet (no frame of theirs
 * accepted) are skipped and counted: they get the result by resending their contribution.
 * Every other packet gets no verdict.
 *
 * The cost is in the copies (issue 26, docs/aggregation-cpu-profile.md): a clone shares the
 * frame's data, so rewriting the frame after a clone makes the kernel copy its whole head
 * first. Each copy's headers are therefore written in one store (one copy of the head at most
 * per store), and the last worker gets the original itself (bpf_redirect) instead of a clone
 * followed by a drop: N workers cost N - 1 clones and N - 1 head copies, not N clones.
 *
 * Only yard_agg's own results are sent, so nobody can make this host multiply a frame: yard_agg
 * drops every received frame of kind AGG_FANOUT (to AGG_PORT or any other port), and a frame
 * that reached TC ingress some other way lacks the job's fanout_tag, which only yard_agg writes
 * and which is replaced by the job's result token before any copy leaves (dropped and counted
 * AGG_FOREIGN).
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
	if (!job->fanout_tag || f.agg.token != job->fanout_tag) {
		count(AGG_FOREIGN, job_id, len);
		return TC_ACT_SHOT;
	}
	__u32 workers = job->workers;
	__u32 ifindex = skb->ifindex;
	/* What every copy carries: a RESULT with the result token. */
	f.agg.kind = AGG_RESULT;
	f.agg.token = job->result_token;
	/* A worker is sent its copy once the next one is known, so the last gets the original. */
	int pending = 0;

#pragma clang loop unroll(disable)
	for (__u32 w = 0; w < AGG_WORKERS_MAX; w++) {
		if (w >= workers)
			break;
		struct agg_peer_key key = { .job = job_id, .worker = w };
		struct agg_peer *peer = bpf_map_lookup_elem(&agg_peers, &key);
		__u8 mac[ETH_ALEN];

		if (!peer) {
			count(AGG_FANOUT_FAILED, job_id, len);
			continue;
		}
		__builtin_memcpy(mac, peer->mac, ETH_ALEN);
		if (!(mac[0] | mac[1] | mac[2] | mac[3] | mac[4] | mac[5])) {
			count(AGG_FANOUT_FAILED, job_id, len);
			continue;
		}
		if (pending) {
			/* The previous worker's headers are in the frame: a clone goes to it. */
			if (bpf_clone_redirect(skb, ifindex, 0) < 0)
				count(AGG_FANOUT_FAILED, job_id, len);
			else
				count(AGG_FANOUT_SENT, job_id, len);
		}
		struct iphdr ip = f.ip; /* aligned, for the checksum */

		ip.daddr = peer->ip;
		ip.check = ipv4_csum20(&ip);
		__builtin_memcpy(f.eth.h_dest, mac, ETH_ALEN);
		f.ip = ip;
		f.udp.dest = peer->port;
		if (bpf_skb_store_bytes(skb, 0, &f, sizeof(f), 0) < 0) {
			count(AGG_FANOUT_FAILED, job_id, len);
			return TC_ACT_SHOT;
		}
		pending = 1;
	}
	if (!pending)
		return TC_ACT_SHOT;
	count(AGG_FANOUT_SENT, job_id, len);
	return bpf_redirect(ifindex, 0);
}
