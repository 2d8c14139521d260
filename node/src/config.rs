//! Node configuration: embedded defaults < TOML file < `YARD_<SECTION>__<KEY>` environment
//! variables. Unknown keys and bad values are errors that name the key, so a typo never
//! silently falls back to a default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

/// The largest stream a bandwidth sink takes (a bigger count is refused): the bound of
/// `aggregation.probe_bytes`.
pub const MAX_PROBE_BYTES: u64 = 64 << 20;

/// The longest restart grace granted: a node gone longer than this should lose its VIPs.
pub const MAX_GRACE_MS: u64 = 600_000;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub node: NodeSection,
    pub tls: TlsSection,
    pub metrics: MetricsSection,
    pub raft: RaftSection,
    pub liveness: LivenessSection,
    pub transport: TransportSection,
    pub admin: AdminSection,
    pub log: LogSection,
    pub gateway: GatewaySection,
    pub probe: ProbeSection,
    pub analyzer: AnalyzerSection,
    pub aggregator: AggregatorSection,
    pub planner: PlannerSection,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeSection {
    pub id: u64,
    pub name: String,
    /// Certificates carry `node-<id>.<cluster>`; clusters with different names never mix.
    pub cluster: String,
    pub listen: SocketAddr,
    /// What other nodes dial; defaults to `listen`.
    pub advertise: Option<String>,
    pub data_dir: PathBuf,
    /// Threads of the async runtime that runs Raft, the transport and the leader's loops.
    /// One by default: it spends the least CPU per write on a busy host (measured with
    /// `kv-vs-etcd`: 3,300 puts/s against 2,440 with two). With one, the namespace test of a
    /// lossy control link once saw more VIP moves than its damping bound: the lossy node
    /// stood for election, deposed the leader and won; the pre-vote stops
    /// that with any number of threads.
    pub worker_threads: usize,
    /// The failure domain this host is in (a rack, a room); the voters are spread over zones.
    /// Empty: no zone.
    pub zone: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsSection {
    /// Holds ca.crt plus `<node.name>.crt`/`.key`; defaults to `<data_dir>/tls`, where a
    /// node with no configuration generates its own CA.
    pub dir: Option<PathBuf>,
    /// How long the node certificates this node signs are valid, in seconds (on a node that
    /// holds the CA key: token joins, renewals, its own certificate at start). Every node renews
    /// its own when a third of its validity is left.
    pub cert_validity_s: u64,
}

impl Default for TlsSection {
    fn default() -> Self {
        Self {
            dir: None,
            cert_validity_s: crate::tls::NODE_VALIDITY.as_secs(),
        }
    }
}

impl TlsSection {
    /// The validity of the node certificates this node signs.
    pub fn cert_validity(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.cert_validity_s)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    /// Prometheus text on `GET /metrics`; `None` turns the port off.
    pub listen: Option<SocketAddr>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RaftSection {
    pub heartbeat_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// Build a snapshot after this many log entries since the last one.
    pub snapshot_every: u64,
    /// Log entries kept behind the snapshot, so a briefly absent follower catches up from the
    /// log; one further behind gets the snapshot.
    pub logs_kept: u64,
    /// How many hosts vote (odd, 1 to 7). A write waits for a majority of the voters only, so
    /// a cluster of any size commits as fast as one of this many hosts; every host past the
    /// voters and replicas is an agent.
    pub voters: usize,
    /// How many non-voting Raft members (learners) stand by to replace a lost voter and serve
    /// agents' watches beside the voters.
    pub replicas: usize,
    /// How long a voter must be unreachable before the autopilot replaces it: longer than a
    /// restart, so a planned restart moves no vote.
    pub voter_grace_ms: u64,
    /// The shortest time between an agent's two watch polls that brought entries: under a
    /// stream of writes each poll carries this period's worth, so a member serving many
    /// agents answers at most `1000 / watch_pace_ms` polls a second per agent. It adds up to
    /// this much to the time a write takes to reach the agents.
    pub watch_pace_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LivenessSection {
    /// Probe period of the leader's liveness actor and renewal period of gateway leases.
    pub interval_ms: u64,
    pub misses: u32,
    /// How long a gateway node serves its VIPs after a renewal was sent: the fencing bound,
    /// and so the floor of failover time.
    pub lease_ms: u64,
    /// Extra wait before the leader takes a lapsed node's VIPs (clock-rate and scheduling slack).
    pub lease_margin_ms: u64,
    /// Hosts that hold no vote (agents): how long a member holds an agent's watch open when
    /// nothing changes. The poll is the agent's heartbeat; an idle agent costs one small round
    /// trip per this period.
    pub hold_ms: u64,
    /// How long an agent's member waits after its last poll before it reports it silent; the
    /// leader then commits it dead (unless another member has it attached).
    pub silent_ms: u64,
    /// How long an agent whose member was lost has to attach to another before it is dead.
    pub reattach_ms: u64,
    /// The longest step a member's judging clock takes between two events: a member that was
    /// paused or starved longer does not accuse its agents of its own silence.
    pub max_tick_gap_ms: u64,
    /// The share of a member's agents that may fall silent in one tick before it suspects its
    /// own link and waits one more `silent_ms`.
    pub mass_silence_fraction: f64,
}

impl LivenessSection {
    /// The host liveness cores' settings.
    pub fn hosts(&self) -> yard_control::host_liveness::LivenessConfig {
        yard_control::host_liveness::LivenessConfig {
            hold_ms: self.hold_ms,
            silent_ms: self.silent_ms,
            reattach_ms: self.reattach_ms,
            max_tick_gap_ms: self.max_tick_gap_ms,
            mass_silence_fraction: self.mass_silence_fraction,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TransportSection {
    pub max_frame_bytes: u32,
    pub rpc_timeout_ms: u64,
    /// How long a peer may take to send a request frame once it opened its stream: a stalled
    /// sender otherwise holds its buffer and task for good.
    pub read_timeout_ms: u64,
    /// Connections (handshakes included) the endpoint holds at once; more are refused.
    pub max_connections: usize,
    /// Connections (handshakes included) from one source address at once.
    pub max_connections_per_ip: usize,
    /// Concurrent request streams a peer with a certificate may open on one connection.
    pub max_streams_per_connection: u32,
    /// Connections from peers without a certificate (joiners redeeming a token) at once.
    pub anonymous_max_connections: usize,
    /// The largest frame a peer without a certificate may send: a token redemption is a few
    /// hundred bytes, and nothing larger is ever read from an unknown peer.
    pub anonymous_max_frame_bytes: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminSection {
    /// Management requests (status, membership, tokens) served at once; more are refused as
    /// busy, doing nothing.
    pub max_in_flight: usize,
    /// Take operator writes that hosts forward without the operator's signature
    /// (`yard::operator_proof`). Off: a compromised host could otherwise do any admin work by
    /// forwarding writes no operator made. Set it only while upgrading from a release whose
    /// CLI does not sign, and unset it once every node and CLI runs this release.
    pub unsigned_forwarding: bool,
}

impl Default for AdminSection {
    fn default() -> Self {
        Self {
            max_in_flight: 1024,
            unsigned_forwarding: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    pub format: LogFormat,
    /// A tracing filter such as `info` or `yard=debug,openraft=warn`.
    pub level: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum XdpMode {
    Native,
    Generic,
}

/// Where the gateway's forwarding function runs (issue 15, yard-offload's split).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Offload {
    /// The whole program on `interface`.
    None,
    /// Try the NIC part in hardware mode on `interface`; where that is refused (always, with
    /// this loader: it says why in one sentence) run the whole program, as `none`.
    Auto,
    /// The NIC part on an emulated NIC in front of `interface` (veths `offload_wire` and
    /// `offload_port`, which must exist), the host part on `interface`.
    Emulated,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatewaySection {
    pub enabled: bool,
    pub interface: String,
    pub xdp_mode: XdpMode,
    /// Where the XDP program's maps and link are pinned (a bpffs directory), so a restarted
    /// daemon re-adopts them and forwarding never stops.
    pub pin_dir: PathBuf,
    /// Largest outer IPv4 packet forwarded; bigger frames are dropped and counted.
    pub mtu: u16,
    /// Gratuitous ARPs sent when a VIP is taken (the first at once).
    pub garp_repeats: u32,
    /// Spacing of those; over 1 s so one lands after the neighbour lock time.
    pub garp_interval_ms: u64,
    /// How long a released VIP is still forwarded while caches move to the new owner.
    pub linger_ms: u64,
    /// On SIGTERM, ask the leader to keep this node's VIPs this long without renewals, so a
    /// planned restart moves nothing (0: no grace; the VIPs move after one lease).
    pub restart_grace_ms: u64,
    /// Whether the Raft leader owns VIPs too. By default it hands them to the other gateway
    /// nodes while any is live, so that losing the leader strands none (they would wait for
    /// an election and the new leader's takeover wait).
    pub leader_holds_vips: bool,
    /// Ownership damping: a node whose lease lapsed receives VIPs again only after this long
    /// of healthy renewals (its first lapse; each lapse soon after quadruples it).
    pub holddown_ms: u64,
    /// The longest hold-down however often a node lapses.
    pub holddown_max_ms: u64,
    /// Half-life of the lapse penalty: how fast a healthy node is forgiven.
    pub holddown_half_life_ms: u64,
    /// Whether to split the forwarding function between a NIC and the host.
    pub offload: Offload,
    /// With `offload = "emulated"`: the emulated NIC's wire port, the veth facing the fabric,
    /// where the NIC part runs.
    pub offload_wire: Option<String>,
    /// With `offload = "emulated"`: the emulated NIC's host port, the veth whose peer is
    /// `interface`; what the host sends leaves through it to the wire port.
    pub offload_port: Option<String>,
}

/// The probe: local ranks' events in, summaries out to the analyzer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProbeSection {
    pub enabled: bool,
    /// The Unix socket ranks report to (clients read `YARD_PROBE_SOCKET`); defaults to
    /// `<data_dir>/probe.sock`.
    pub socket: Option<PathBuf>,
    /// The socket's permission bits. Connecting needs write permission, and whoever connects
    /// can report for any job (and so raise verdicts and alerts), so by default only the
    /// daemon's user and the socket's group may. An integer (`0o660` in TOML) or a string of
    /// octal digits (`"0660"`, handy in `YARD_PROBE__SOCKET_MODE`).
    #[serde(deserialize_with = "octal_mode")]
    pub socket_mode: u32,
    /// The group owning the socket (a name or a numeric gid): the training users' group.
    /// None: the daemon's own group.
    pub socket_group: Option<String>,
    /// How often a summary goes to the analyzer.
    pub report_ms: u64,
    /// Events held between summaries; beyond this new ones are dropped and counted.
    pub buffer_events: usize,
    /// Interface whose traffic the eBPF per-peer counters watch ("" turns them off).
    pub interface: String,
    /// Ports of training traffic counted per peer, beside those ranks announce.
    pub ports: Vec<u16>,
}

/// A permission mode as TOML writes it (`0o660`, an integer) or as a string of octal digits
/// (`"0660"`, `"0o660"`), which is what an environment variable can carry.
fn octal_mode<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Mode {
        Int(u32),
        Str(String),
    }
    match Mode::deserialize(d)? {
        Mode::Int(m) => Ok(m),
        Mode::Str(s) => {
            let digits = s.strip_prefix("0o").unwrap_or(&s);
            u32::from_str_radix(digits, 8).map_err(|_| {
                serde::de::Error::custom(format!(
                    "{s:?} is not an octal mode like 0o660 or \"0660\""
                ))
            })
        }
    }
}

impl Default for ProbeSection {
    fn default() -> Self {
        Self {
            enabled: true,
            socket: None,
            socket_mode: yard_actors::probe::socket::DEFAULT_SOCKET_MODE,
            socket_group: None,
            report_ms: 100,
            buffer_events: 262_144,
            interface: String::new(),
            ports: Vec::new(),
        }
    }
}

/// The aggregator: gradient sums in XDP on this host, and the cluster's job limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AggregatorSection {
    /// Whether this host sums jobs (it registers itself with its memory budget).
    pub enabled: bool,
    /// The interface workers' frames arrive on.
    pub interface: String,
    pub xdp_mode: XdpMode,
    /// Kernel memory for gradients on this host (the slot map is allocated at start).
    pub memory_mb: u64,
    /// Cores this host gives to summing (softirq time on its receive queues): the leader
    /// places a job where it adds the least load per core.
    pub cpu_cores: f64,
    /// How often per-job counters are read for stats and metrics.
    pub stats_ms: u64,
    /// Aggregator memory one job may take (checked by the leader at creation).
    pub job_memory_mb: u64,
    /// Aggregator memory all jobs together may take.
    pub cluster_memory_mb: u64,
    /// How often the leader re-decides placements.
    pub place_ms: u64,
    /// How long a worker's node must stay unreachable before the worker is reported gone (its
    /// job fails, or an elastic one goes on without it).
    pub worker_gone_ms: u64,
    /// The Unix socket workers on this host join their jobs through (every node serves it,
    /// aggregating or not); defaults to `<data_dir>/agg.sock`.
    pub socket: Option<PathBuf>,
    /// The aggregation socket's own permission bits, apart from the probe socket's: whoever
    /// joins a job through it sends gradients into every other worker's sums, which is more
    /// than reporting probe events. The agent also checks each peer's credentials, so only
    /// the daemon's user and members of the socket's group are served whatever the mode.
    #[serde(deserialize_with = "octal_mode")]
    pub socket_mode: u32,
    /// The group owning the aggregation socket (a name or a numeric gid): the training users'
    /// group. None: the daemon's own group.
    pub socket_group: Option<String>,
    /// The TCP port of the bandwidth sink every aggregating host runs (the grouping measures
    /// each worker host's bandwidth to it).
    pub probe_port: u16,
    /// Bytes of one bandwidth probe.
    pub probe_bytes: u64,
    /// How often a node running a worker of a grouped job measures each host again.
    pub probe_every_ms: u64,
}

impl AggregatorSection {
    /// Entries of this host's slot map: its memory budget in slots.
    pub fn slots(&self) -> u32 {
        let slots =
            self.memory_mb.saturating_mul(1 << 20) / yard_raft_store::aggregation::SLOT_BYTES;
        u32::try_from(slots).unwrap_or(u32::MAX)
    }

    /// The CPU budget in thousandths of a core, as the tables carry it.
    pub fn cpu_millis(&self) -> u32 {
        // Validated to (0, 1024] cores, so the product fits.
        (self.cpu_cores * 1000.0).round() as u32
    }

    /// The limits a job creation is checked against.
    pub fn quota(&self) -> yard_raft_store::aggregation::Quota {
        yard_raft_store::aggregation::Quota {
            job_bytes: self.job_memory_mb.saturating_mul(1 << 20),
            cluster_bytes: self.cluster_memory_mb.saturating_mul(1 << 20),
        }
    }
}

impl Default for AggregatorSection {
    fn default() -> Self {
        Self {
            enabled: false,
            interface: "eth0".into(),
            xdp_mode: XdpMode::Native,
            memory_mb: 256,
            cpu_cores: 1.0,
            stats_ms: 1000,
            job_memory_mb: 256,
            cluster_memory_mb: 4096,
            place_ms: 100,
            worker_gone_ms: 5000,
            socket: None,
            socket_mode: yard_actors::probe::socket::DEFAULT_SOCKET_MODE,
            socket_group: None,
            probe_port: 7482,
            // 4 MiB: a third of a second at 100 Mbit/s, 3 ms at 10 Gbit/s; long enough that
            // TCP's slow start is a small part of it at the links the tests shape.
            probe_bytes: 4 << 20,
            probe_every_ms: 30_000,
        }
    }
}

/// The analyzer on the leader.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AnalyzerSection {
    /// How often verdicts are re-evaluated.
    pub evaluate_ms: u64,
    /// A collective with no progress for this long is a hang whatever its history.
    pub hang_floor_ms: u64,
    /// ... or for this many times the op's usual duration, if longer.
    pub hang_factor: f64,
    /// A rank silent this long is dead.
    pub heartbeat_timeout_ms: u64,
    /// An op this many times slower than its own baseline is slow.
    pub slow_factor: f64,
    /// A job with no event for this long is forgotten by the analyzer (its verdicts stay).
    pub job_idle_ms: u64,
    /// Run on each new verdict: `sh -c COMMAND` with the verdict JSON on stdin and in
    /// `YARD_VERDICT`.
    pub alert_command: Option<String>,
    /// POST each new verdict's JSON to this `https://host[:port]/path` (or `http://`).
    pub alert_webhook: Option<String>,
    /// PEM file of CA certificates trusted for the webhook besides the bundled public roots:
    /// for a receiver whose certificate a private CA signed.
    pub alert_webhook_ca: Option<PathBuf>,
    /// Most memory (MiB) one job's analyzer may hold on the leader; events past it are
    /// refused. 512 fits a 16,384-rank job with room.
    pub job_memory_mib: u64,
    /// Most memory (MiB) all jobs' analyzers may hold together; new jobs and events past it
    /// are refused. 2048: four such jobs, or many smaller ones.
    pub memory_mib: u64,
}

impl Default for AnalyzerSection {
    fn default() -> Self {
        let d = yard_diagnosis::analyzer::Config::default();
        Self {
            evaluate_ms: 100,
            hang_floor_ms: d.hang_floor_ns / 1_000_000,
            hang_factor: d.hang_factor,
            heartbeat_timeout_ms: d.heartbeat_timeout_ns / 1_000_000,
            slow_factor: d.slow_factor,
            job_idle_ms: 600_000,
            alert_command: None,
            alert_webhook: None,
            alert_webhook_ca: None,
            job_memory_mib: (yard_diagnosis::analyzer::DEFAULT_JOB_BUDGET >> 20) as u64,
            memory_mib: (crate::diagnosis_control::DEFAULT_TOTAL_BUDGET >> 20) as u64,
        }
    }
}

impl AnalyzerSection {
    /// The analyzer core's thresholds.
    pub fn to_core(&self) -> yard_diagnosis::analyzer::Config {
        yard_diagnosis::analyzer::Config {
            hang_floor_ns: self.hang_floor_ms * 1_000_000,
            hang_factor: self.hang_factor,
            heartbeat_timeout_ns: self.heartbeat_timeout_ms * 1_000_000,
            slow_factor: self.slow_factor,
            job_budget_bytes: mib(self.job_memory_mib),
            ..yard_diagnosis::analyzer::Config::default()
        }
    }

    /// The budget of all jobs' analyzers together, in bytes.
    pub fn total_budget_bytes(&self) -> usize {
        mib(self.memory_mib)
    }
}

fn mib(n: u64) -> usize {
    usize::try_from(n.saturating_mul(1 << 20)).unwrap_or(usize::MAX)
}

/// The service planner on the live gateway: the leader places VIPs by measured traffic and
/// node reliability (see `gateway::replan` in yard-actors).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlannerSection {
    pub enabled: bool,
    /// How often the leader re-plans (it also re-plans when the placeable nodes change).
    pub interval_ms: u64,
    /// How often each gateway node samples its per-VIP counters and reports rates.
    pub report_ms: u64,
    /// Weight of the newest interval in the rate EWMA, in (0, 1].
    pub smoothing: f64,
    /// VIP moves one re-plan may start: its churn cap.
    pub max_moves: usize,
    /// The least drop of the worst load (a fraction of capacity) worth moving VIPs for.
    pub min_gain: f64,
    /// Availability target of every tenant, in [0, 1).
    pub availability: f64,
    /// Least number of nodes per tenant.
    pub replicas: usize,
    /// What a gateway node carries: bytes/s and packets/s (overridden per node below).
    pub capacity_bps: f64,
    pub capacity_pps: f64,
    pub node_capacity: Vec<NodeCapacity>,
    /// Named groups of VIPs; VIPs no group names form the tenant `default`.
    pub tenants: Vec<TenantGroup>,
    /// The failure estimate's prior: as if every node had been watched this long and found
    /// down `prior_fail_prob` of the time.
    pub prior_ms: u64,
    pub prior_fail_prob: f64,
    /// Seed of the planner's randomized rounding.
    pub seed: u64,
}

/// `[[planner.node_capacity]]`: one node's capacity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeCapacity {
    pub node: u64,
    pub bps: f64,
    pub pps: f64,
}

/// `[[planner.tenants]]`: a named group of VIPs planned together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantGroup {
    pub name: String,
    pub vips: Vec<std::net::Ipv4Addr>,
}

impl Default for PlannerSection {
    fn default() -> Self {
        Self {
            enabled: false,
            interval_ms: 2_000,
            report_ms: 500,
            smoothing: 0.3,
            max_moves: 4,
            min_gain: 0.05,
            availability: 0.999,
            replicas: 2,
            // 10 Gbit/s and 1.5 Mpps.
            capacity_bps: 1.25e9,
            capacity_pps: 1.5e6,
            node_capacity: Vec::new(),
            tenants: Vec::new(),
            prior_ms: 3_600_000,
            prior_fail_prob: 0.01,
            seed: 1,
        }
    }
}

impl PlannerSection {
    fn validate(&self) -> Result<(), String> {
        let positive = |x: f64| x.is_finite() && x > 0.0;
        if self.interval_ms == 0 {
            return Err("planner.interval_ms: must be at least 1".into());
        }
        if self.report_ms == 0 {
            return Err("planner.report_ms: must be at least 1".into());
        }
        if !(positive(self.smoothing) && self.smoothing <= 1.0) {
            return Err("planner.smoothing: must be in (0, 1]".into());
        }
        if !(self.min_gain.is_finite() && self.min_gain >= 0.0) {
            return Err("planner.min_gain: must be a non-negative number".into());
        }
        if !(self.availability.is_finite() && (0.0..1.0).contains(&self.availability)) {
            return Err("planner.availability: must be in [0, 1)".into());
        }
        if self.replicas == 0 {
            return Err("planner.replicas: must be at least 1".into());
        }
        if !positive(self.capacity_bps) || !positive(self.capacity_pps) {
            return Err("planner.capacity_bps and capacity_pps: must be positive".into());
        }
        for c in &self.node_capacity {
            if !positive(c.bps) || !positive(c.pps) {
                return Err(format!(
                    "planner.node_capacity: node {}: bps and pps must be positive",
                    c.node
                ));
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for t in &self.tenants {
            if t.name.is_empty() {
                return Err("planner.tenants: a tenant needs a name".into());
            }
            for v in &t.vips {
                if !seen.insert(*v) {
                    return Err(format!("planner.tenants: vip {v} is in two tenants"));
                }
            }
        }
        if !(positive(self.prior_fail_prob) && self.prior_fail_prob <= 0.5) {
            return Err("planner.prior_fail_prob: must be in (0, 0.5]".into());
        }
        Ok(())
    }
}

impl Default for NodeSection {
    fn default() -> Self {
        Self {
            id: 1,
            name: "n1".into(),
            cluster: "yard".into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 7480)),
            advertise: None,
            data_dir: PathBuf::from("/var/lib/yard"),
            worker_threads: 1,
            zone: String::new(),
        }
    }
}

impl Default for MetricsSection {
    fn default() -> Self {
        Self {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 9480))),
        }
    }
}

impl RaftSection {
    /// The roles core's settings (`raft.voters`, `raft.replicas`, `raft.voter_grace_ms`).
    pub fn roles(&self) -> yard_control::roles::RolesConfig {
        yard_control::roles::RolesConfig {
            voters: self.voters,
            replicas: self.replicas,
            voter_grace_ms: self.voter_grace_ms,
            ..yard_control::roles::RolesConfig::default()
        }
    }
}

impl Default for RaftSection {
    fn default() -> Self {
        // openraft waits `election_timeout_max` (the leader lease) plus a random timeout before a
        // follower stands for election, and times replication RPCs out after one heartbeat, so
        // these three set the failover time (160-330 ms here: the slower case is a candidate
        // whose log is shorter, which openraft makes wait longer) against tolerance of a slow
        // follower. etcd's defaults (100/1000 ms) take over a second.
        Self {
            heartbeat_ms: 20,
            election_timeout_min_ms: 50,
            election_timeout_max_ms: 80,
            snapshot_every: 10_000,
            logs_kept: 1_000,
            voters: 3,
            replicas: 2,
            voter_grace_ms: 5_000,
            watch_pace_ms: 25,
        }
    }
}

impl Default for LivenessSection {
    fn default() -> Self {
        Self {
            interval_ms: 20,
            misses: 3,
            lease_ms: 90,
            lease_margin_ms: 10,
            hold_ms: 250,
            silent_ms: 1_000,
            reattach_ms: 1_000,
            max_tick_gap_ms: 300,
            mass_silence_fraction: 0.5,
        }
    }
}

impl Default for TransportSection {
    fn default() -> Self {
        Self {
            max_frame_bytes: crate::frame::DEFAULT_MAX_FRAME,
            rpc_timeout_ms: 2_000,
            read_timeout_ms: 5_000,
            max_connections: 4_096,
            max_connections_per_ip: 64,
            max_streams_per_connection: 1_024,
            anonymous_max_connections: 64,
            anonymous_max_frame_bytes: 8 * 1024,
        }
    }
}

impl Default for LogSection {
    fn default() -> Self {
        Self {
            format: LogFormat::Human,
            level: "info,openraft=warn".into(),
        }
    }
}

impl Default for GatewaySection {
    fn default() -> Self {
        Self {
            enabled: false,
            interface: "eth0".into(),
            xdp_mode: XdpMode::Native,
            pin_dir: PathBuf::from("/sys/fs/bpf/yard/gateway"),
            mtu: 1500,
            garp_repeats: 3,
            garp_interval_ms: 1_100,
            linger_ms: 3_000,
            restart_grace_ms: 10_000,
            leader_holds_vips: false,
            holddown_ms: 3_000,
            holddown_max_ms: 60_000,
            holddown_half_life_ms: 30_000,
            offload: Offload::None,
            offload_wire: None,
            offload_port: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {0} does not exist")]
    Missing(PathBuf),
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl Config {
    /// Loads defaults < `file` < environment `YARD_<SECTION>__<KEY>`.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_with_env(file, Env::prefixed("YARD_"))
    }

    fn load_with_env(file: Option<&Path>, env: Env) -> Result<Self, ConfigError> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError::Missing(path.to_owned()));
            }
            fig = fig.merge(Toml::file(path));
        }
        // Only `SECTION__KEY` variables are config; `YARD_ENDPOINT` and friends belong to the CLI.
        fig = fig.merge(env.filter(|k| k.as_str().contains("__")).split("__"));
        let cfg: Config = fig
            .extract()
            .map_err(|e| ConfigError::Invalid(describe(&e)))?;
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.planner.validate().map_err(ConfigError::Invalid)?;
        let bad = |key: &str, why: &str| Err(ConfigError::Invalid(format!("{key}: {why}")));
        if self.node.id == 0 {
            return bad("node.id", "must be at least 1");
        }
        if self.tls.cert_validity() < crate::tls::MIN_VALIDITY {
            return bad("tls.cert_validity_s", "must be at least 10");
        }
        if self.node.name.is_empty()
            || !self
                .node
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            return bad("node.name", "use letters, digits and '-'");
        }
        if self.raft.heartbeat_ms == 0
            || self.raft.heartbeat_ms >= self.raft.election_timeout_min_ms
        {
            return bad(
                "raft.heartbeat_ms",
                "must be above 0 and below raft.election_timeout_min_ms",
            );
        }
        let agg = &self.aggregator;
        if agg.enabled && agg.memory_mb == 0 {
            return bad(
                "aggregator.memory_mb",
                "must be at least 1 on an aggregating host",
            );
        }
        if agg.memory_mb.saturating_mul(1 << 20) / yard_raft_store::aggregation::SLOT_BYTES
            > u64::from(u32::MAX)
        {
            return bad(
                "aggregator.memory_mb",
                "is more than the slot map can index",
            );
        }
        if !(agg.cpu_cores >= 0.001 && agg.cpu_cores <= 1024.0) {
            return bad("aggregator.cpu_cores", "must be between 0.001 and 1024");
        }
        if agg.enabled && self.gateway.enabled && agg.interface == self.gateway.interface {
            return bad(
                "aggregator.interface",
                "must differ from gateway.interface: both attach an XDP program",
            );
        }
        if agg.stats_ms == 0 || agg.place_ms == 0 {
            return bad(
                "aggregator.stats_ms",
                "and aggregator.place_ms must be above 0",
            );
        }
        if agg.probe_bytes == 0 || agg.probe_bytes > MAX_PROBE_BYTES {
            return bad(
                "aggregator.probe_bytes",
                "must be between 1 and 67108864 (64 MiB)",
            );
        }
        if agg.probe_every_ms == 0 || agg.probe_port == 0 {
            return bad(
                "aggregator.probe_every_ms",
                "and aggregator.probe_port must be above 0",
            );
        }
        if agg.job_memory_mb > agg.cluster_memory_mb {
            return bad(
                "aggregator.job_memory_mb",
                "must not exceed aggregator.cluster_memory_mb",
            );
        }
        if self.raft.election_timeout_min_ms >= self.raft.election_timeout_max_ms {
            return bad(
                "raft.election_timeout_max_ms",
                "must exceed raft.election_timeout_min_ms",
            );
        }
        if self.raft.snapshot_every == 0 {
            return bad("raft.snapshot_every", "must be at least 1");
        }
        self.raft
            .roles()
            .validate()
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        if self.raft.watch_pace_ms > 1_000 {
            return bad("raft.watch_pace_ms", "must be at most 1000");
        }
        if self.raft.replicas > 16 {
            return bad("raft.replicas", "must be at most 16");
        }
        if self.liveness.hold_ms > 5_000 {
            return bad("liveness.hold_ms", "must be at most 5000");
        }
        self.liveness
            .hosts()
            .validate()
            .map_err(ConfigError::Invalid)?;
        if self.liveness.interval_ms == 0 || self.liveness.misses == 0 {
            return bad(
                "liveness.interval_ms",
                "interval and misses must be at least 1",
            );
        }
        if self.liveness.lease_ms < 2 * self.liveness.interval_ms {
            return bad(
                "liveness.lease_ms",
                "must be at least twice liveness.interval_ms, so renewals overlap",
            );
        }
        if self.gateway.mtu < 576 {
            return bad("gateway.mtu", "must be at least 576");
        }
        if self.gateway.restart_grace_ms > MAX_GRACE_MS {
            return bad(
                "gateway.restart_grace_ms",
                "must be at most 600000 (ten minutes)",
            );
        }
        if self.gateway.garp_repeats == 0 {
            return bad("gateway.garp_repeats", "must be at least 1");
        }
        if self.gateway.holddown_max_ms < self.gateway.holddown_ms {
            return bad(
                "gateway.holddown_max_ms",
                "must be at least gateway.holddown_ms",
            );
        }
        if self.gateway.holddown_max_ms > 3_600_000 {
            return bad(
                "gateway.holddown_max_ms",
                "must be at most 3600000 (one hour)",
            );
        }
        if self.gateway.holddown_half_life_ms == 0 {
            return bad("gateway.holddown_half_life_ms", "must be at least 1");
        }
        let g = &self.gateway;
        if g.offload == Offload::Emulated {
            for (key, value) in [
                ("gateway.offload_wire", &g.offload_wire),
                ("gateway.offload_port", &g.offload_port),
            ] {
                match value.as_deref() {
                    None | Some("") => {
                        return bad(key, "must name a veth when gateway.offload is \"emulated\"")
                    }
                    Some(v) if v == g.interface => {
                        return bad(key, "must differ from gateway.interface")
                    }
                    _ => {}
                }
            }
            if g.offload_wire == g.offload_port {
                return bad(
                    "gateway.offload_port",
                    "must differ from gateway.offload_wire",
                );
            }
        }
        if self.probe.report_ms == 0 || self.probe.report_ms > 10_000 {
            return bad("probe.report_ms", "must be between 1 and 10000");
        }
        if self.probe.buffer_events == 0 {
            return bad("probe.buffer_events", "must be at least 1");
        }
        if self.probe.socket_mode > 0o777 {
            return bad(
                "probe.socket_mode",
                "must be permission bits of at most 0o777, like 0o660 (in TOML write the 0o)",
            );
        }
        if self.probe.socket_mode & 0o222 == 0 {
            return bad(
                "probe.socket_mode",
                "grants nobody write permission, which connecting needs",
            );
        }
        if let Some(group) = &self.probe.socket_group {
            if let Err(e) = yard_actors::probe::socket::resolve_group(group) {
                return bad("probe.socket_group", &e.to_string());
            }
        }
        if self.aggregator.socket_mode > 0o777 {
            return bad(
                "aggregator.socket_mode",
                "must be permission bits of at most 0o777, like 0o660 (in TOML write the 0o)",
            );
        }
        if self.aggregator.socket_mode & 0o222 == 0 {
            return bad(
                "aggregator.socket_mode",
                "grants nobody write permission, which connecting needs",
            );
        }
        if let Some(group) = &self.aggregator.socket_group {
            if let Err(e) = yard_actors::probe::socket::resolve_group(group) {
                return bad("aggregator.socket_group", &e.to_string());
            }
        }
        let a = &self.analyzer;
        if a.evaluate_ms == 0 || a.hang_floor_ms == 0 || a.heartbeat_timeout_ms == 0 {
            return bad(
                "analyzer.evaluate_ms",
                "evaluate_ms, hang_floor_ms and heartbeat_timeout_ms must be at least 1",
            );
        }
        if !(a.hang_factor >= 1.0 && a.slow_factor > 1.0) {
            return bad(
                "analyzer.slow_factor",
                "hang_factor must be at least 1 and slow_factor above 1",
            );
        }
        if a.job_memory_mib == 0 || a.memory_mib < a.job_memory_mib {
            return bad(
                "analyzer.memory_mib",
                "job_memory_mib must be at least 1 and memory_mib at least job_memory_mib",
            );
        }
        if let Some(url) = &a.alert_webhook {
            if crate::alert::parse_webhook(url).is_err() {
                return bad(
                    "analyzer.alert_webhook",
                    "must be an https:// or http:// url with a host, like https://host:port/path",
                );
            }
        }
        if let Some(ca) = &a.alert_webhook_ca {
            if a.alert_webhook.is_none() {
                return bad(
                    "analyzer.alert_webhook_ca",
                    "is only used with analyzer.alert_webhook, which is not set",
                );
            }
            if let Err(e) = crate::alert::load_ca_file(ca) {
                return bad("analyzer.alert_webhook_ca", &e.to_string());
            }
        }
        if !(1..=256).contains(&self.node.worker_threads) {
            return bad("node.worker_threads", "must be between 1 and 256");
        }
        if self.admin.max_in_flight == 0 {
            return bad("admin.max_in_flight", "must be at least 1");
        }
        if self.transport.max_frame_bytes < 4096 {
            return bad("transport.max_frame_bytes", "must be at least 4096");
        }
        let t = &self.transport;
        if t.read_timeout_ms == 0 {
            return bad("transport.read_timeout_ms", "must be at least 1");
        }
        if t.max_connections == 0 {
            return bad("transport.max_connections", "must be at least 1");
        }
        if t.max_connections_per_ip == 0 {
            return bad("transport.max_connections_per_ip", "must be at least 1");
        }
        if t.max_streams_per_connection == 0 {
            return bad("transport.max_streams_per_connection", "must be at least 1");
        }
        if !(1024..=t.max_frame_bytes).contains(&t.anonymous_max_frame_bytes) {
            return bad(
                "transport.anonymous_max_frame_bytes",
                "must be between 1024 and transport.max_frame_bytes",
            );
        }
        Ok(())
    }

    /// The address other nodes dial.
    pub fn advertise(&self) -> String {
        self.node
            .advertise
            .clone()
            .unwrap_or_else(|| self.node.listen.to_string())
    }

    /// The IP other nodes reach this one at (the advertised address without its port).
    pub fn advertise_ip(&self) -> String {
        let adv = self.advertise();
        match adv.parse::<SocketAddr>() {
            Ok(a) => a.ip().to_string(),
            Err(_) => adv
                .rsplit_once(':')
                .map_or(adv.clone(), |(host, _)| host.to_owned()),
        }
    }

    /// The probe socket in force.
    pub fn probe_socket(&self) -> PathBuf {
        self.probe
            .socket
            .clone()
            .unwrap_or_else(|| self.node.data_dir.join("probe.sock"))
    }

    /// The aggregation agent's socket.
    pub fn agg_socket(&self) -> PathBuf {
        self.aggregator
            .socket
            .clone()
            .unwrap_or_else(|| self.node.data_dir.join("agg.sock"))
    }

    /// Who may connect to the probe socket.
    pub fn probe_socket_access(
        &self,
    ) -> Result<yard_actors::probe::socket::SocketAccess, ConfigError> {
        let group = match &self.probe.socket_group {
            Some(g) => Some(
                yard_actors::probe::socket::resolve_group(g)
                    .map_err(|e| ConfigError::Invalid(format!("probe.socket_group: {e}")))?,
            ),
            None => None,
        };
        Ok(yard_actors::probe::socket::SocketAccess {
            mode: self.probe.socket_mode,
            group,
        })
    }

    /// Who may connect to the aggregation socket (its own mode and group).
    pub fn agg_socket_access(
        &self,
    ) -> Result<yard_actors::probe::socket::SocketAccess, ConfigError> {
        let group = match &self.aggregator.socket_group {
            Some(g) => Some(
                yard_actors::probe::socket::resolve_group(g)
                    .map_err(|e| ConfigError::Invalid(format!("aggregator.socket_group: {e}")))?,
            ),
            None => None,
        };
        Ok(yard_actors::probe::socket::SocketAccess {
            mode: self.aggregator.socket_mode,
            group,
        })
    }

    /// The TLS directory in force.
    pub fn tls_dir(&self) -> PathBuf {
        self.tls
            .dir
            .clone()
            .unwrap_or_else(|| self.node.data_dir.join("tls"))
    }
}

/// One sentence naming the key and what was wrong with it.
fn describe(e: &figment::Error) -> String {
    let mut parts = Vec::new();
    for err in e.clone() {
        let key = err.path.join(".").to_lowercase();
        let origin = err
            .metadata
            .as_ref()
            .map(|m| format!(" (from {})", m.name))
            .unwrap_or_default();
        let what = match &err.kind {
            figment::error::Kind::UnknownField(field, _) if key.ends_with(field.as_str()) => {
                format!("unknown key `{key}`{origin}")
            }
            figment::error::Kind::UnknownField(field, _) => {
                format!("unknown key `{}`{origin}", join_key(&key, field))
            }
            kind => format!("{key}: {kind}{origin}"),
        };
        parts.push(what);
    }
    parts.join("; ")
}

fn join_key(prefix: &str, field: &str) -> String {
    if prefix.is_empty() {
        field.to_owned()
    } else {
        format!("{prefix}.{field}")
    }
}

impl RaftSection {
    /// The openraft configuration these settings describe.
    pub fn to_openraft(&self, cluster: &str) -> Result<openraft::Config, ConfigError> {
        self.to_openraft_within(cluster, crate::frame::DEFAULT_MAX_FRAME)
    }

    /// The openraft configuration for a transport whose frames carry at most `max_frame` body
    /// bytes: snapshot chunks stay well below it (`crate::limits`; AppendEntries payloads are
    /// bounded by the log store's reader).
    pub fn to_openraft_within(
        &self,
        cluster: &str,
        max_frame: u32,
    ) -> Result<openraft::Config, ConfigError> {
        let budgets = crate::limits::RaftBudgets::for_frame(max_frame);
        openraft::Config {
            snapshot_max_chunk_size: budgets.snapshot_chunk_bytes,
            cluster_name: cluster.to_owned(),
            heartbeat_interval: self.heartbeat_ms,
            election_timeout_min: self.election_timeout_min_ms,
            election_timeout_max: self.election_timeout_max_ms,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.snapshot_every),
            max_in_snapshot_log_to_keep: self.logs_kept,
            install_snapshot_timeout: 2_000,
            ..Default::default()
        }
        .validate()
        .map_err(|e| ConfigError::Invalid(format!("raft: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_toml(toml: &str) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("yard.toml");
        std::fs::write(&path, toml).unwrap();
        Config::load_with_env(Some(&path), Env::prefixed("YARD_TEST_NONE_"))
    }

    #[test]
    fn defaults_are_a_loopback_single_node() {
        let cfg = Config::load_with_env(None, Env::prefixed("YARD_TEST_NONE_")).unwrap();
        assert_eq!(cfg.node.listen.to_string(), "127.0.0.1:7480");
        assert_eq!(cfg.advertise(), "127.0.0.1:7480");
    }

    #[test]
    fn unknown_key_is_named() {
        let err = load_toml("[node]\nlisten_addr = \"127.0.0.1:1\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("node.listen_addr"), "{err}");
    }

    #[test]
    fn unknown_section_is_named() {
        let err = load_toml("[nod]\nid = 2\n").unwrap_err().to_string();
        assert!(err.contains("nod"), "{err}");
    }

    #[test]
    fn bad_value_is_named() {
        let err = load_toml("[raft]\nheartbeat_ms = \"fast\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("raft.heartbeat_ms"), "{err}");
        let err = load_toml("[gateway]\nxdp_mode = \"turbo\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("gateway.xdp_mode"), "{err}");
    }

    #[test]
    fn offload_is_validated() {
        let err = load_toml("[gateway]\noffload = \"smartnic\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("gateway.offload"), "{err}");
        assert_eq!(
            load_toml("").unwrap().gateway.offload,
            Offload::None,
            "the default keeps today's whole program"
        );
        assert_eq!(
            load_toml("[gateway]\noffload = \"auto\"\n")
                .unwrap()
                .gateway
                .offload,
            Offload::Auto
        );
        let err = load_toml("[gateway]\noffload = \"emulated\"\noffload_wire = \"nicw\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("gateway.offload_port"), "{err}");
        let err = load_toml(
            "[gateway]\noffload = \"emulated\"\noffload_wire = \"eth0\"\noffload_port = \"nicp\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("gateway.offload_wire"), "{err}");
        let ok = load_toml(
            "[gateway]\noffload = \"emulated\"\noffload_wire = \"nicw\"\noffload_port = \"nicp\"\n",
        )
        .unwrap();
        assert_eq!(ok.gateway.offload, Offload::Emulated);
        assert_eq!(ok.gateway.offload_port.as_deref(), Some("nicp"));
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's own Jail signature
    fn env_overrides_file() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("yard.toml", "[node]\nid = 2\nname = \"a\"\n")?;
            jail.set_env("YARD_NODE__ID", "3");
            jail.set_env("YARD_ENDPOINT", "ignored:1");
            let cfg = Config::load(Some(Path::new("yard.toml"))).map_err(|e| e.to_string())?;
            assert_eq!(cfg.node.id, 3);
            assert_eq!(cfg.node.name, "a");
            Ok(())
        });
    }

    #[test]
    fn bad_holddowns_are_named() {
        let cfg = load_toml("[gateway]\nholddown_ms = 500\nholddown_max_ms = 8000\n").unwrap();
        assert_eq!(cfg.gateway.holddown_ms, 500);
        assert_eq!(cfg.gateway.holddown_half_life_ms, 30_000);
        for (toml, key) in [
            (
                "holddown_ms = 5000\nholddown_max_ms = 4000",
                "gateway.holddown_max_ms",
            ),
            ("holddown_max_ms = 7200000", "gateway.holddown_max_ms"),
            ("holddown_half_life_ms = 0", "gateway.holddown_half_life_ms"),
            ("holddown_ms = -1", "gateway.holddown_ms"),
        ] {
            let err = load_toml(&format!("[gateway]\n{toml}\n"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{toml}: {err}");
        }
    }

    #[test]
    fn the_aggregator_and_the_gateway_cannot_share_an_interface() {
        let both =
            "[gateway]\nenabled = true\ninterface = \"eth0\"\n[aggregator]\nenabled = true\n";
        let err = load_toml(&format!("{both}interface = \"eth0\"\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("aggregator.interface"), "{err}");
        let cfg = load_toml(&format!("{both}interface = \"eth1\"\n")).unwrap();
        assert_eq!(cfg.aggregator.interface, "eth1");
    }

    #[test]
    fn bandwidth_probe_keys_are_read_and_bad_ones_named() {
        let cfg =
            load_toml("[aggregator]\nprobe_bytes = 1048576\nprobe_every_ms = 5000\n").unwrap();
        assert_eq!(
            (
                cfg.aggregator.probe_port,
                cfg.aggregator.probe_bytes,
                cfg.aggregator.probe_every_ms
            ),
            (7482, 1 << 20, 5000)
        );
        for (toml, key) in [
            ("probe_bytes = 0", "aggregator.probe_bytes"),
            ("probe_bytes = 67108865", "aggregator.probe_bytes"),
            ("probe_every_ms = 0", "aggregator.probe_every_ms"),
        ] {
            let err = load_toml(&format!("[aggregator]\n{toml}\n"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{toml}: {err}");
        }
    }

    #[test]
    fn planner_keys_are_read_and_bad_ones_named() {
        let cfg = load_toml(
            "[planner]\nenabled = true\nmax_moves = 2\n\
             [[planner.node_capacity]]\nnode = 3\nbps = 5e8\npps = 1e5\n\
             [[planner.tenants]]\nname = \"blue\"\nvips = [\"198.19.0.1\", \"198.19.0.2\"]\n",
        )
        .unwrap();
        assert!(cfg.planner.enabled);
        assert_eq!(cfg.planner.max_moves, 2);
        assert_eq!(cfg.planner.interval_ms, 2_000);
        assert_eq!(cfg.planner.node_capacity[0].node, 3);
        assert_eq!(cfg.planner.tenants[0].vips.len(), 2);
        for (toml, key) in [
            ("smoothing = 0.0", "planner.smoothing"),
            ("smoothing = 1.5", "planner.smoothing"),
            ("availability = 1.0", "planner.availability"),
            ("replicas = 0", "planner.replicas"),
            ("interval_ms = 0", "planner.interval_ms"),
            ("capacity_bps = 0.0", "planner.capacity_bps"),
            ("prior_fail_prob = 0.9", "planner.prior_fail_prob"),
            (
                "[[planner.tenants]]\nname = \"a\"\nvips = [\"198.19.0.1\"]\n\
                 [[planner.tenants]]\nname = \"b\"\nvips = [\"198.19.0.1\"]",
                "198.19.0.1 is in two tenants",
            ),
        ] {
            let err = load_toml(&format!("[planner]\n{toml}\n"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{toml}: {err}");
        }
    }

    #[test]
    fn runtime_threads_default_to_two_and_are_bounded() {
        assert_eq!(load_toml("").unwrap().node.worker_threads, 1);
        assert_eq!(
            load_toml("[node]\nworker_threads = 4\n")
                .unwrap()
                .node
                .worker_threads,
            4
        );
        for n in ["0", "257"] {
            let err = load_toml(&format!("[node]\nworker_threads = {n}\n"))
                .unwrap_err()
                .to_string();
            assert_eq!(
                err,
                "invalid configuration: node.worker_threads: must be between 1 and 256"
            );
        }
    }

    /// The aggregation socket has its own mode and group: configuring the probe socket's
    /// does not open the one through which workers join jobs.
    #[test]
    fn the_aggregation_socket_has_its_own_mode_and_group() {
        let cfg = load_toml("[probe]\nsocket_mode = 0o666\nsocket_group = \"1234\"\n").unwrap();
        assert_eq!(
            cfg.agg_socket_access().unwrap(),
            yard_actors::probe::socket::SocketAccess {
                mode: 0o660,
                group: None
            }
        );
        let cfg =
            load_toml("[aggregator]\nsocket_mode = 0o600\nsocket_group = \"4321\"\n").unwrap();
        assert_eq!(
            cfg.agg_socket_access().unwrap(),
            yard_actors::probe::socket::SocketAccess {
                mode: 0o600,
                group: Some(4321)
            }
        );
        assert_eq!(cfg.probe_socket_access().unwrap().mode, 0o660);
        let err = load_toml("[aggregator]\nsocket_mode = 0o444\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "invalid configuration: aggregator.socket_mode: grants nobody write permission, which connecting needs"
        );
    }

    #[test]
    fn the_probe_socket_is_for_its_user_and_group_unless_configured() {
        let cfg = load_toml("").unwrap();
        assert_eq!(cfg.probe.socket_mode, 0o660);
        assert_eq!(cfg.probe.socket_group, None);
        assert_eq!(
            cfg.probe_socket_access().unwrap(),
            yard_actors::probe::socket::SocketAccess {
                mode: 0o660,
                group: None
            }
        );
        let cfg = load_toml("[probe]\nsocket_mode = 0o640\nsocket_group = \"root\"\n").unwrap();
        assert_eq!(cfg.probe.socket_mode, 0o640);
        assert_eq!(cfg.probe_socket_access().unwrap().group, Some(0));
        assert_eq!(
            load_toml("[probe]\nsocket_mode = \"0600\"\nsocket_group = \"1234\"\n")
                .unwrap()
                .probe_socket_access()
                .unwrap(),
            yard_actors::probe::socket::SocketAccess {
                mode: 0o600,
                group: Some(1234)
            }
        );
        for (toml, want) in [
            (
                "socket_mode = 660",
                "invalid configuration: probe.socket_mode: must be permission bits of at most 0o777, like 0o660 (in TOML write the 0o)",
            ),
            (
                "socket_mode = 0o444",
                "invalid configuration: probe.socket_mode: grants nobody write permission, which connecting needs",
            ),
            (
                "socket_group = \"no-such-group-yard\"",
                "invalid configuration: probe.socket_group: no group named no-such-group-yard on this host",
            ),
        ] {
            let err = load_toml(&format!("[probe]\n{toml}\n"))
                .unwrap_err()
                .to_string();
            assert_eq!(err, want, "{toml}");
        }
        let err = load_toml("[probe]\nsocket_mode = \"rw-rw----\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("probe.socket_mode"), "{err}");
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's own Jail signature
    fn the_probe_socket_mode_can_come_from_the_environment() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("YARD_PROBE__SOCKET_MODE", "0o600");
            let cfg = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(cfg.probe.socket_mode, 0o600);
            Ok(())
        });
    }

    #[test]
    fn inconsistent_timeouts_are_refused() {
        let err = load_toml("[raft]\nheartbeat_ms = 500\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("raft.heartbeat_ms"), "{err}");
    }

    #[test]
    fn webhook_urls_and_ca_files_are_checked() {
        let cfg = load_toml("[analyzer]\nalert_webhook = \"https://alerts.example:8443/hook\"\n")
            .unwrap();
        assert_eq!(
            cfg.analyzer.alert_webhook.as_deref(),
            Some("https://alerts.example:8443/hook")
        );
        assert!(load_toml("[analyzer]\nalert_webhook = \"http://127.0.0.1:9/x\"\n").is_ok());
        let err = load_toml("[analyzer]\nalert_webhook = \"ftp://alerts/x\"\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "invalid configuration: analyzer.alert_webhook: must be an https:// or http:// url with a host, like https://host:port/path"
        );

        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(
            &ca,
            crate::tls::CertAuthority::generate("t").unwrap().cert_pem,
        )
        .unwrap();
        let with_ca = format!(
            "[analyzer]\nalert_webhook = \"https://alerts/x\"\nalert_webhook_ca = \"{}\"\n",
            ca.display()
        );
        assert_eq!(
            load_toml(&with_ca).unwrap().analyzer.alert_webhook_ca,
            Some(ca.clone())
        );
        let err = load_toml(&format!(
            "[analyzer]\nalert_webhook_ca = \"{}\"\n",
            ca.display()
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("analyzer.alert_webhook_ca"), "{err}");
        std::fs::write(&ca, "garbage").unwrap();
        let err = load_toml(&with_ca).unwrap_err().to_string();
        assert!(
            err.contains("analyzer.alert_webhook_ca") && err.contains("no pem certificate"),
            "{err}"
        );
    }
}
