#!/usr/bin/env bash
# A local yard cluster of N nodes, each in its own network namespace, for trying things by hand.
#
#   deploy/local-cluster.sh up N       # (re)start an N-node cluster; runs `down` first
#   deploy/local-cluster.sh status     # `yard status` against node 1 (extra args passed on)
#   deploy/local-cluster.sh down       # stop the nodes, delete the namespaces
#
# Layout (as the test harness in cluster-tests/, under its own prefix so the two never collide,
# and which the harness's stale-run sweep never touches):
#   ydlc-f          fabric namespace with bridge br0 and ports h1..hN
#   ydlc-<i>        host i: eth0 198.18.0.<i>/16, yard listening on 198.18.0.<i>:7480 (QUIC)
#                   and metrics on 198.18.0.<i>:9480; no default route, nothing in the root
#                   namespace is touched
#
# Environment:
#   YARD_BIN   the yard binary (default target/release/yard); this script builds nothing
#   STATE      state, certificates, configs and logs (default /tmp/yard-local-cluster); wiped by
#              `up`, kept by `down` so the logs can be read
#   JOIN_TIMEOUT  seconds to wait for each node to join (default 60)
#
# Past raft.voters (3) voters and raft.replicas (2) replicas, hosts join as agents: `yard
# members` shows each host's role.
#
# Inspect a node by hand with e.g.
#   ip netns exec ydlc-2 curl -s 198.18.0.2:9480/metrics
#   ip netns exec ydlc-2 curl -s 198.18.0.2:9480/readyz     # 503 and the reason until it is ready
set -euo pipefail

YARD_BIN=${YARD_BIN:-target/release/yard}
STATE=${STATE:-/tmp/yard-local-cluster}
JOIN_TIMEOUT=${JOIN_TIMEOUT:-60}
PREFIX=ydlc
FABRIC=${PREFIX}-f
RAFT_PORT=7480
METRICS_PORT=9480
MAX_NODES=250
# Marks a STATE directory as this script's, so `up` never wipes a directory it did not make.
MARKER=.yard-local-cluster

die() {
    echo "local-cluster: $*" >&2
    exit 1
}

say() {
    echo "local-cluster: $*"
}

usage() {
    echo "usage: $0 up N | down | status [yard status flags...]" >&2
    exit 2
}

require_root() {
    [[ $EUID -eq 0 ]] || die "network namespaces need root; run this script as root"
}

require_tools() {
    local tool
    for tool in ip ethtool; do
        command -v "$tool" >/dev/null || die "$tool is not installed (Debian: iproute2, ethtool)"
    done
}

# Resolves YARD_BIN to an absolute path, or dies before anything has been created.
resolve_yard() {
    local bin=$YARD_BIN
    if [[ $bin != */* ]]; then
        bin=$(command -v "$bin" || true)
        [[ -n $bin ]] || die "yard binary '$YARD_BIN' is not on PATH; set YARD_BIN to its path"
    fi
    [[ -f $bin ]] || die "yard binary not found at '$YARD_BIN'; build it with 'cargo build --release -p yard' or set YARD_BIN"
    [[ -x $bin ]] || die "yard binary '$YARD_BIN' is not executable"
    YARD=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
}

addr() { echo "198.18.0.$1"; }

# Namespaces of the local cluster that exist now, hosts before the fabric.
cluster_namespaces() {
    ip netns list | awk '{print $1}' | grep -E "^${PREFIX}-[0-9]+$" | sort -t- -k2,2n || true
    ip netns list | awk '{print $1}' | grep -Fx "$FABRIC" || true
}

# Waits until a link reports operational state UP: a veth drops what it is given until the
# kernel has seen its carrier, which can take a second on a busy machine.
wait_link_up() {
    local ns=$1 dev=$2 tries=0
    until ip -n "$ns" -o link show dev "$dev" | grep -q "state UP"; do
        ((++tries > 250)) && die "$dev in $ns did not come up within 5 s"
        sleep 0.02
    done
}

make_hosts() {
    local n=$1 i ns
    say "creating fabric $FABRIC and hosts ${PREFIX}-1..${PREFIX}-$n"
    ip netns add "$FABRIC"
    ip -n "$FABRIC" link set lo up
    ip -n "$FABRIC" link add br0 type bridge
    ip -n "$FABRIC" link set br0 up
    for ((i = 1; i <= n; i++)); do
        ns=${PREFIX}-$i
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        # Made from the fabric side with the peer placed straight into the host namespace, so
        # no interface ever exists in the root namespace.
        ip -n "$FABRIC" link add "h$i" type veth peer name eth0 netns "$ns"
        ip -n "$FABRIC" link set "h$i" master br0 up
        ip -n "$ns" link set eth0 address "$(printf '02:59:44:00:00:%02x' "$i")"
        ip -n "$ns" addr add "$(addr "$i")/16" dev eth0
        ip -n "$ns" link set eth0 up
        # veth carries unfinished checksums that native XDP cannot finish; a real NIC would
        # finish them, so hosts standing for real machines turn TX offload off.
        ip netns exec "$ns" ethtool -K eth0 tx off >/dev/null
    done
    for ((i = 1; i <= n; i++)); do
        wait_link_up "${PREFIX}-$i" eth0
        wait_link_up "$FABRIC" "h$i"
    done
}

write_config() {
    local i=$1 dir=$STATE/n$1
    mkdir -p "$dir/data"
    cat >"$dir/yard.toml" <<EOF
# Written by deploy/local-cluster.sh for node $i of the local cluster.
[node]
id = $i
name = "n$i"
listen = "$(addr "$i"):$RAFT_PORT"
data_dir = "$dir/data"

[tls]
dir = "$STATE/tls"

[metrics]
listen = "$(addr "$i"):$METRICS_PORT"
EOF
}

# Starts node i in its namespace in the background; its pid (yard's own: `ip netns exec` execs
# it in place) goes to n<i>/yard.pid.
start_node() {
    local i=$1 dir=$STATE/n$1
    shift
    say "starting n$i at $(addr "$i"):$RAFT_PORT $*"
    nohup ip netns exec "${PREFIX}-$i" "$YARD" node start --config "$dir/yard.toml" "$@" \
        </dev/null >>"$dir/yard.log" 2>&1 &
    echo $! >"$dir/yard.pid"
}

# yard status against node 1, from inside node 1's namespace.
yard_status() {
    ip netns exec "${PREFIX}-1" "$YARD" status --endpoint "$(addr 1):$RAFT_PORT" \
        --tls-dir "$STATE/tls" "$@"
}

# Hosts the leader sees reachable, of any role (voter, learner, agent).
hosts_up() {
    local out
    out=$(yard_status --json 2>/dev/null) || {
        echo 0
        return
    }
    { grep -o '"reachable": *true' <<<"$out" || true; } | wc -l
}

# Waits until the cluster has `want` reachable hosts, failing early if a node has died.
wait_hosts() {
    local want=$1 n=$2 deadline=$((SECONDS + JOIN_TIMEOUT)) have i
    while :; do
        have=$(hosts_up)
        ((have >= want)) && return 0
        for ((i = 1; i <= n; i++)); do
            local pidfile=$STATE/n$i/yard.pid
            if [[ -f $pidfile ]] && ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
                echo "--- last lines of $STATE/n$i/yard.log:" >&2
                tail -n 20 "$STATE/n$i/yard.log" >&2 || true
                die "node n$i exited while waiting for $want hosts"
            fi
        done
        if ((SECONDS >= deadline)); then
            echo "--- yard status:" >&2
            yard_status >&2 || true
            die "the cluster has $have reachable hosts, not $want, after ${JOIN_TIMEOUT} s; logs are in $STATE/n*/yard.log"
        fi
        sleep 0.5
    done
}

# Starts from an empty STATE, refusing to wipe a directory this script did not make.
fresh_state() {
    if [[ -e $STATE ]]; then
        [[ -d $STATE ]] || die "STATE=$STATE exists and is not a directory"
        if [[ -n $(ls -A "$STATE") && ! -e $STATE/$MARKER ]]; then
            die "STATE=$STATE is not empty and was not made by this script; remove it or choose another STATE"
        fi
        rm -rf "$STATE"
    fi
    mkdir -p "$STATE"
    touch "$STATE/$MARKER"
}

cmd_up() {
    local n=${1:-}
    if ! [[ $n =~ ^[0-9]+$ ]] || ((n < 1 || n > MAX_NODES)); then
        die "up needs a node count between 1 and $MAX_NODES, e.g. '$0 up 3'"
    fi
    require_root
    require_tools
    resolve_yard
    cmd_down quiet
    fresh_state
    make_hosts "$n"

    say "making the cluster CA and node certificates in $STATE/tls"
    "$YARD" ca init --dir "$STATE/tls" >/dev/null
    local i
    for ((i = 1; i <= n; i++)); do
        "$YARD" ca issue --dir "$STATE/tls" --name "n$i" --id "$i" --ip "$(addr "$i")" >/dev/null
        write_config "$i"
    done

    start_node 1 --bootstrap
    wait_hosts 1 "$n"
    # One join at a time: a voter's or replica's is a membership change, and the leader runs
    # one at a time.
    for ((i = 2; i <= n; i++)); do
        start_node "$i" --join "$(addr 1):$RAFT_PORT"
        wait_hosts "$i" "$n"
    done
    say "$n hosts are up; state and logs in $STATE"
    yard_status
}

cmd_down() {
    local quiet=${1:-} pidfile pid ns
    require_root
    # Graceful first (SIGTERM, up to 5 s), as systemd would stop a node.
    local pids=()
    for pidfile in "$STATE"/n*/yard.pid; do
        [[ -f $pidfile ]] || continue
        pid=$(cat "$pidfile")
        if [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
        fi
        rm -f "$pidfile"
    done
    local tries=0
    for pid in "${pids[@]}"; do
        while kill -0 "$pid" 2>/dev/null && ((tries++ < 50)); do sleep 0.1; done
    done
    # Anything still inside a namespace keeps it alive: kill it, then delete the namespaces.
    local removed=0
    for ns in $(cluster_namespaces); do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do
            kill -CONT "$pid" 2>/dev/null || true
            kill -KILL "$pid" 2>/dev/null || true
        done
        ip netns del "$ns"
        removed=$((removed + 1))
    done
    if [[ -z $quiet ]]; then
        if ((removed > 0)); then
            say "stopped the nodes and deleted $removed namespaces; logs kept in $STATE"
        else
            say "no local cluster was up"
        fi
    fi
}

cmd_status() {
    require_root
    ip netns list | awk '{print $1}' | grep -qx "${PREFIX}-1" ||
        die "no local cluster is up; start one with '$0 up N'"
    resolve_yard
    yard_status "$@"
}

case ${1:-} in
up)
    shift
    [[ $# -eq 1 ]] || usage
    cmd_up "$1"
    ;;
down)
    [[ $# -eq 1 ]] || usage
    cmd_down
    ;;
status)
    shift
    cmd_status "$@"
    ;;
*) usage ;;
esac
