#!/usr/bin/env bash
# The main job: a local 6-host cluster in network namespaces doing real work — three voters,
# two replicas and an agent (checked in `yard members`), replicated writes, compare-and-swap,
# a write and a read through the agent, a leader killed with -9 and replaced, the agent
# forwarding to the new one, the benchmark — then torn down
# (KEEP=1 leaves it running; `deploy/local-cluster.sh down` stops it); then the gateway: three
# XDP gateway nodes owning six VIPs, tenants on two compute hosts talking over VXLAN through
# them, an owner's link cut under a probe stream (the loss window is printed) and a drain; then
# the probe: a training job's ranks doing a real ring all-reduce on three hosts, diagnosed by
# `yard diagnose` through a throttled link and a SIGSTOPped rank; then the aggregator: a real
# PyTorch DDP job of four ranks summing its gradients in XDP through `yard_agg.hook`, the
# aggregating node killed with -9 mid-training and the job moved (checked, or agg-demo fails:
# every rank had steps left at the kill, another node took the job, its own counters show it
# completed every round begun after the kill), the parameters compared with gloo's; and offline, a simulated 64-rank job with a skipped collective diagnosed from its
# Flight Recorder dumps.
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/install-deps.sh
cargo build --release -p yard -p yard-cluster-tests --bin yard --bin gateway-demo --bin probe-demo --bin ring-rank --bin agg-demo
export YARD_BIN=$PWD/target/release/yard STATE=${STATE:-/tmp/yard-local-cluster}
./deploy/local-cluster.sh up 6
yard() { ip netns exec ydlc-1 "$YARD_BIN" --endpoint 198.18.0.1:7480,198.18.0.2:7480,198.18.0.3:7480 --tls-dir "$STATE/tls" "$@"; }
# `yard` through one host only, e.g. the agent.
yard_via() { local host=$1; shift; ip netns exec ydlc-1 "$YARD_BIN" --endpoint "198.18.0.$host:7480" --tls-dir "$STATE/tls" "$@"; }
yard status
yard members
# Past raft.voters (3) and raft.replicas (2) a host joins as an agent: no vote, the tables
# followed through a watch, writes forwarded to the leader.
agent=$(yard members --json | python3 -c 'import json,sys; hs=json.load(sys.stdin)["hosts"]; print(next(h["id"] for h in hs if h["role"]=="agent"))')
echo "demo: host $agent is an agent"
yard kv put demo/greeting hello
yard kv cas demo/greeting --expect hello world
yard kv get demo/greeting --json
yard_via "$agent" kv put demo/through-agent forwarded
got=$(yard_via "$agent" kv get demo/through-agent --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["value"])')
[[ $got == forwarded ]] || { echo "demo: the agent read back '$got', not the write it forwarded" >&2; exit 1; }
echo "demo: a write through agent $agent was forwarded to the leader and read back through the agent"
leader=$(yard status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["leader"])')
echo "demo: kill -9 of the leader, node $leader"
kill -9 "$(cat "$STATE/n$leader/yard.pid")"
start=$(date +%s%N)
# One write, the CLI at its default timeout, sent to a survivor as a user would: the survivor
# retries it on the new leader as soon as one is elected (the write carries its client session,
# so a retry never applies twice), and the user sees no error.
survivor=$(( leader % 3 + 1 ))
yard_via "$survivor" kv put demo/after-failover ok
echo "demo: write through survivor node $survivor acknowledged $(( ($(date +%s%N) - start) / 1000000 )) ms after the kill (CLI at its default 5 s timeout, one attempt)"
yard kv get demo/greeting
yard_via "$agent" kv put demo/through-agent after-failover
echo "demo: agent $agent forwarded a write to the new leader"
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
