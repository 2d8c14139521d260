#!/usr/bin/env bash
# yard's XDP gateway against its baselines on network-namespace test hosts:
#   1. gateway-forward: small-UDP packet rate tenant A -> gateway -> tenant B, yard's XDP
#      gateway vs the Linux kernel (bridge + VXLAN), interleaved rounds;
#   2. gateway-failover: the loss window of a 1 kpps probe stream through a VIP when the owning
#      gateway host's link goes down, yard (default and tight timings) vs keepalived (VRRPv2
#      default and VRRPv3 fastest), 20 runs each.
#
#   sudo deploy/bench/gateway.sh                      # both, with their defaults
#   sudo deploy/bench/gateway.sh --out DIR            # also keep the JSON in DIR
#   FORWARD_ARGS="--rounds 3" FAILOVER_ARGS="--runs 5 --fault kill9" sudo -E deploy/bench/gateway.sh
#   target/release/gateway-forward --help; target/release/gateway-failover --help
#
# Installs what it needs (Debian packages, only those missing), builds yard and the benchmarks
# in release mode, and runs them. They make test hosts yd<run>-* (198.18.0.0/16 on a private
# bridge, VIPs and tenants in 198.19.0.0/16; nothing in the root namespace is touched) and remove
# all of it when they end. Each prints one JSON object on stdout and a table on stderr, and never
# fails on a number.
#
# Environment: CARGO_TARGET_DIR is honoured; YARD_KEEP_LOGS=1 keeps the run directories with the
# nodes' and keepalived's logs (/tmp/yard-tests-<run>).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

die() {
    echo "gateway.sh: $*" >&2
    exit 1
}

out=""
while (($#)); do
    case $1 in
        --out) out=${2:?--out needs a directory}; shift 2 ;;
        -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done
[[ $EUID -eq 0 ]] || die "network namespaces need root; run this script as root"

# keepalived: the failover baseline; iputils-ping: reachability checks in tenants; iproute2,
# ethtool, nftables: the test hosts; clang, libbpf-dev: the XDP programs and the harness's
# TC-BPF loss program are compiled at build time.
packages=(keepalived iputils-ping iproute2 ethtool nftables clang llvm libbpf-dev)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} > 0)); then
    echo "gateway.sh: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
# Debian's keepalived package may start a system keepalived; the benchmark runs its own.
if command -v systemctl >/dev/null && systemctl is-active --quiet keepalived 2>/dev/null; then
    systemctl stop keepalived || true
fi

command -v cargo >/dev/null || die "cargo is not on PATH"
cargo build --release -p yard -p yard-bench >&2
target=${CARGO_TARGET_DIR:-target}
[[ -n $out ]] && mkdir -p "$out"

status=0
# shellcheck disable=SC2086 # the *_ARGS variables are word-split on purpose
"$target/release/gateway-forward" --yard-bin "$target/release/yard" \
    ${out:+--json-out "$out/gateway-forward.json"} ${FORWARD_ARGS:-} || status=1
# shellcheck disable=SC2086
"$target/release/gateway-failover" --yard-bin "$target/release/yard" \
    ${out:+--json-out "$out/gateway-failover.json"} ${FAILOVER_ARGS:-} || status=1
exit $status
