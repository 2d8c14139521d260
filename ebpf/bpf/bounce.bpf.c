// SPDX-License-Identifier: GPL-2.0
/*
 * yard_bounce: swaps the Ethernet addresses and sends the frame back (XDP_TX). It does the least
 * any forwarding program must do, so its per-packet cost measured with BPF_PROG_TEST_RUN is the
 * floor that every other program's cost is reported against (DESIGN.md, "Benchmarks").
 */
#include <linux/if_ether.h>

#include "yard.h"

char LICENSE[] SEC("license") = "GPL";

SEC("xdp")
int yard_bounce(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	__u8 tmp[ETH_ALEN];

	if ((void *)(eth + 1) > data_end)
		return XDP_DROP;
	__builtin_memcpy(tmp, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, tmp, ETH_ALEN);
	return XDP_TX;
}
