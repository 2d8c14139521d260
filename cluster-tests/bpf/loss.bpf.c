// SPDX-License-Identifier: GPL-2.0
/*
 * Random packet loss for test hosts: this kernel has no netem, so a TC (clsact, direct-action)
 * program drops each packet whose random draw falls below a threshold.
 *
 * The threshold lives in .rodata so that one object compiled at build time serves every loss
 * percentage: the harness patches `drop_below` in a copy of the object before `tc` loads it
 * (libbpf turns .rodata into a frozen map initialised from the section's bytes).
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

/*
 * Drop when a uniform u32 draw is below this. 64 bits wide so that 2^32 means "drop all" and 0
 * means "drop none" without special cases. Percent p is stored as round(p / 100 * 2^32).
 */
const volatile __u64 drop_below = 0;

SEC("tc")
int loss(struct __sk_buff *skb)
{
	if ((__u64)bpf_get_prandom_u32() < drop_below)
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "GPL";
