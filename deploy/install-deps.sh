#!/usr/bin/env bash
# Installs, idempotently, every system package Switchyard's build, tests and benchmarks use on
# a Debian machine (as root). The Rust toolchain itself comes from rust-toolchain.toml via rustup.
# python3-torch (CPU, gloo) is for the Python client's tests against real torch.distributed; it
# installs for Debian's /usr/bin/python3, which those tests run explicitly.
set -euo pipefail

packages=(clang llvm libbpf-dev iproute2 nftables ethtool procps curl python3 gcc g++ make libc6-dev etcd-server etcd-client protobuf-compiler keepalived iputils-ping python3-torch)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    [[ $EUID -eq 0 ]] || { echo "install-deps: installing ${missing[*]} needs root" >&2; exit 1; }
    echo "install-deps: installing ${missing[*]}"
    apt-get update -qq
    # Packages are installed for their binaries only: the benchmark runs its own etcd and
    # keepalived on its own ports and namespaces, so the packages' services are not started
    # here (a policy-rc.d for the length of this install, unless the host already has one).
    # A service the host already runs is never touched.
    policy=/usr/sbin/policy-rc.d
    own_policy=false
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && own_policy=true
        trap '$own_policy && rm -f "$policy"' EXIT
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    if $own_policy; then rm -f "$policy"; own_policy=false; fi
fi
command -v cargo >/dev/null || { echo "install-deps: cargo not found; install rustup (the toolchain is pinned in rust-toolchain.toml)" >&2; exit 1; }
mkdir -p /sys/fs/bpf 2>/dev/null || true
mountpoint -q /sys/fs/bpf 2>/dev/null || mount -t bpf bpf /sys/fs/bpf 2>/dev/null || true
echo "install-deps: ok"
