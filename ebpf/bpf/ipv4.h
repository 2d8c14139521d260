/* SPDX-License-Identifier: GPL-2.0 */
/* IPv4 header arithmetic shared by the programs that rewrite addresses (gateway, aggregator). */
#ifndef YARD_IPV4_H
#define YARD_IPV4_H

#include <linux/ip.h>

/* Header checksum of a 20-byte (option-less) IPv4 header, computed with check = 0. */
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

#endif
