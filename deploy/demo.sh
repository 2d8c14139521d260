#!/usr/bin/env bash
# The main job: a local 3-node cluster in network namespaces doing real work — replicated
# writes, compare-and-swap, a leader killed with -9 and replaced, the benchmark — then torn down
# (KEEP=1 leaves it running; `deploy/local-cluster.sh down` stops it); then the gateway: three
# XDP gateway nodes owning six VIPs, tenants on two compute hosts talking over VXLAN through
# them, an owner's link cut under a probe stream (the loss window is printed) and a drain; then
# the probe: a training job's ranks doing a real ring all-reduce on three hosts, diagnosed by
# `yard diagnose` through a throttled link and a SIGSTOPped rank; then the aggregator: a real
# PyTorch DDP job of four ranks summing its gradients in XDP through `yard_agg.hook`, the
# aggregating node killed with -9 mid-training and the job moved (checked, or agg-demo fails:
# every rank had steps left at the kill, another node took the job, its own counters show it
# summed the steps after), the parameters compared with gloo's; and offline, a simulated 64-rank job with a skipped collective diagnosed from its
# Flight Recorder dumps.
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/install-deps.sh
cargo build --release -p yard -p yard-cluster-tests --bin yard --bin gateway-demo --bin probe-demo --bin ring-rank --bin agg-demo
export YARD_BIN=$PWD/target/release/yard STATE=${STATE:-/tmp/yard-local-cluster}
./deploy/local-cluster.sh up 3
yard() { ip netns exec ydlc-1 "$YARD_BIN" --endpoint 198.18.0.1:7480,198.18.0.2:7480,198.18.0.3:7480 --tls-dir "$STATE/tls" "$@"; }
yard status
yard kv put demo/greeting hello
yard kv cas demo/greeting --expect hello world
yard kv get demo/greeting --json
leader=$(yard status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["leader"])')
echo "demo: kill -9 of the leader, node $leader"
kill -9 "$(cat "$STATE/n$leader/yard.pid")"
start=$(date +%s%N)
# One write, the CLI at its default timeout, sent to a survivor as a user would: the survivor
# retries it on the new leader as soon as one is elected (the write carries its client session,
# so a retry never applies twice), and the user sees no error.
survivor=$(( leader % 3 + 1 ))
ip netns exec ydlc-1 "$YARD_BIN" --endpoint "198.18.0.$survivor:7480" --tls-dir "$STATE/tls" kv put demo/after-failover ok
echo "demo: write through survivor node $survivor acknowledged $(( ($(date +%s%N) - start) / 1000000 )) ms after the kill (CLI at its default 5 s timeout, one attempt)"
yard kv get demo/greeting
yard bench kv --clients 8 --ops 4000 --value-size 256
yard status
[[ ${KEEP:-0} == 1 ]] || ./deploy/local-cluster.sh down
./target/release/gateway-demo "$YARD_BIN"
./target/release/probe-demo "$YARD_BIN" "$PWD/target/release/ring-rank" "${STATE%/*}/yard-hang.svg"
./target/release/agg-demo "$YARD_BIN"
sim=$(mktemp -d /tmp/yard-sim.XXXXXX)
"$YARD_BIN" sim ccl --scale small --scenario skip_collective-s1-clean --out "$sim"
"$YARD_BIN" diagnose --fr-dumps "$sim/fr" --svg "$sim/timeline.svg"
rm -rf "$sim"
