// SPDX-License-Identifier: GPL-2.0
/*
 * emunic_port: the emulated NIC's host port (ebpf/src/emunic.rs). Everything the host sends
 * out of its interface arrives here and leaves through the NIC's wire port, as a SmartNIC
 * transmits what its host hands it; slot 0 of emunic_wire is the wire port, set by the loader.
 * An empty slot drops: a frame with nowhere to go must not reach this veth's own stack.
 */
#include "yard.h"

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} emunic_wire SEC(".maps");

SEC("xdp")
int emunic_port(struct xdp_md *ctx)
{
	return bpf_redirect_map(&emunic_wire, 0, XDP_DROP);
}
