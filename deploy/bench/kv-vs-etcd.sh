#!/usr/bin/env bash
# yard's Raft KV against etcd on one 3-host network-namespace topology.
#
#   sudo deploy/bench/kv-vs-etcd.sh [flags]     # flags go to the kv-vs-etcd program, e.g.
#   sudo deploy/bench/kv-vs-etcd.sh --rounds 2 --ops 2000 --kill-trials 3 --json-out /tmp/kv.json
#   deploy/bench/kv-vs-etcd.sh --help           # every flag and its default
#
# Installs what it needs (Debian packages, only those missing), builds yard and the benchmark in
# release mode, and runs it. The benchmark makes test hosts yd<run>-1..4 (198.18.0.1-4 on a
# private bridge; nothing in the root namespace is touched), runs a yard node and an etcd member
# on each of hosts 1-3 and the client on host 4, and removes all of it when it ends. It prints
# one JSON object on stdout and a human table on stderr, and never fails on a number.
#
# Environment: CARGO_TARGET_DIR is honoured; YARD_KEEP_LOGS=1 keeps the run directory with the
# nodes' and members' logs (/tmp/yard-tests-<run>).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

die() {
    echo "kv-vs-etcd.sh: $*" >&2
    exit 1
}

help=0
for arg in "$@"; do
    [[ $arg == -h || $arg == --help ]] && help=1
done
if ((help == 0)) && [[ $EUID -ne 0 ]]; then
    die "network namespaces need root; run this script as root"
fi

# etcd-server: the baseline; protobuf-compiler: etcd-client's build script needs protoc;
# iproute2, ethtool: the test hosts; nftables: the harness's partitions; clang, libbpf-dev: the
# harness compiles its TC-BPF loss program at build time.
packages=(etcd-server protobuf-compiler iproute2 nftables clang libbpf-dev ethtool)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} > 0)); then
    [[ $EUID -eq 0 ]] || die "missing Debian packages: ${missing[*]}; run as root to install them"
    echo "kv-vs-etcd.sh: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >&2
fi

command -v cargo >/dev/null || die "cargo is not on PATH"
cargo build --release -p yard -p yard-bench >&2
target=${CARGO_TARGET_DIR:-target}
exec "$target/release/kv-vs-etcd" --yard-bin "$target/release/yard" "$@"
