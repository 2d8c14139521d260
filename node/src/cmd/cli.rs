//! The command line, exactly as DESIGN.md's Interfaces section gives it.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use serde_json::json;
use yard::client::AdminClient;
use yard::rpc::{AdminReply, AdminRequest, Request};

use super::output::{print_members, print_status, Out};

#[derive(Debug, Parser)]
#[command(
    name = "yard",
    version,
    about = "Switchyard node daemon and cluster CLI"
)]
pub struct Args {
    /// Node(s) to talk to, `HOST:PORT`; a comma-separated list is tried in order.
    #[arg(
        long,
        global = true,
        env = "YARD_ENDPOINT",
        default_value = "127.0.0.1:7480"
    )]
    endpoint: String,
    /// Directory holding ca.crt, admin.crt and admin.key.
    #[arg(
        long,
        global = true,
        env = "YARD_TLS_DIR",
        default_value = "/var/lib/yard/tls"
    )]
    tls_dir: PathBuf,
    /// The cluster name certificates carry.
    #[arg(long, global = true, env = "YARD_CLUSTER", default_value = "yard")]
    cluster: String,
    /// Machine-readable output.
    #[arg(long, global = true)]
    json: bool,
    /// Per-request timeout in milliseconds.
    #[arg(long, global = true, default_value_t = 5000)]
    timeout_ms: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node daemon.
    Node {
        #[command(subcommand)]
        cmd: NodeCmd,
    },
    /// Manage the cluster CA.
    Ca {
        #[command(subcommand)]
        cmd: CaCmd,
    },
    /// Join tokens for nodes without certificates.
    Token {
        #[command(subcommand)]
        cmd: TokenCmd,
    },
    /// Leader, term, commit index, members and actors' health.
    Status,
    /// The release level of the node asked and the cluster level its tables hold: writes that
    /// need a higher cluster level are refused until every host runs a release of it.
    Version,
    /// The replicated key-value store.
    Kv {
        #[command(subcommand)]
        cmd: KvCmd,
    },
    /// The Raft leader: hand its leadership to another voter.
    Leader {
        #[command(subcommand)]
        cmd: LeaderCmd,
    },
    /// Every host's role (voter, replica, agent), zone, lag and liveness; or remove one.
    Members {
        #[command(subcommand)]
        cmd: Option<MembersCmd>,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        cmd: BenchCmd,
    },
    /// The gateway: VIP pool, endpoints, drains, data-plane stats.
    Gateway {
        #[command(subcommand)]
        cmd: super::gateway::GatewayCmd,
    },
    /// Gradient aggregation: jobs, their workers and aggregators, a node's aggregator.
    Agg {
        #[command(subcommand)]
        cmd: super::agg::AggCmd,
    },
    /// Slow or hung collectives: a live job's verdicts, or Flight Recorder dumps / a RAS
    /// report analyzed offline.
    Diagnose(super::diagnose::DiagnoseArgs),
    /// Simulated jobs with injected faults, and the analyzer's scorecard on them.
    Sim {
        #[command(subcommand)]
        cmd: super::sim::SimCmd,
    },
    /// SmartNIC offload of XDP programs: eligibility check of a BPF object, split plan.
    Offload {
        #[command(subcommand)]
        cmd: super::offload::OffloadCmd,
    },
    /// The service planner: where tenants' VIPs should live (offline, from files), and the
    /// live cluster's re-plans (`show`).
    Plan {
        #[command(subcommand)]
        cmd: super::plan::PlanCmd,
    },
    /// Back up the cluster's state to a file, check a file, restore one into a new cluster.
    Snapshot {
        #[command(subcommand)]
        cmd: super::snapshot::SnapshotCmd,
    },
}

#[derive(Debug, Subcommand)]
enum NodeCmd {
    /// Start the daemon; with no configuration at all, a one-node cluster on loopback.
    Start {
        #[arg(long)]
        config: Option<PathBuf>,
        /// Initialise a new one-node cluster (first node only).
        #[arg(long, conflicts_with = "join")]
        bootstrap: bool,
        /// Join the cluster through any member.
        #[arg(long, value_name = "HOST:PORT")]
        join: Option<String>,
        /// A join token from `yard token create`, for a node with no certificate yet.
        #[arg(long, requires = "join")]
        token: Option<String>,
        /// Log as JSON lines instead of human-readable text.
        #[arg(long)]
        log_json: bool,
    },
    /// Move every actor's work off node ID before maintenance: its VIPs, its aggregator seats
    /// and its vote or replica seat go to other hosts, and it is given none until undrained.
    /// Needs every host on a release of cluster level 1 (`yard version`).
    Drain { id: u64 },
    /// End node ID's drain: it may be given VIPs, aggregator seats and a vote again.
    Undrain { id: u64 },
}

#[derive(Debug, Subcommand)]
enum LeaderCmd {
    /// Hand the leadership to voter NODE (default: the most caught-up voter), e.g. before the
    /// leader's host is stopped: writes go on meanwhile.
    Transfer { node: Option<u64> },
}

#[derive(Debug, Subcommand)]
enum CaCmd {
    /// Create ca.crt/ca.key (valid ten years) and admin.crt/admin.key in DIR.
    Init {
        #[arg(long)]
        dir: PathBuf,
        /// How long the admin certificate is valid.
        #[arg(long, default_value = "365d", value_parser = humantime::parse_duration)]
        admin_validity: Duration,
    },
    /// Issue a node certificate NAME.crt/NAME.key signed by DIR's CA. The node renews it
    /// itself when a third of its validity is left.
    Issue {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        name: String,
        #[arg(long)]
        id: u64,
        #[arg(long = "ip")]
        ips: Vec<IpAddr>,
        /// How long the certificate is valid.
        #[arg(long, default_value = "90d", value_parser = humantime::parse_duration)]
        validity: Duration,
    },
    /// Issue a new admin certificate admin.crt/admin.key signed by DIR's CA (before the old
    /// one expires: nothing renews it).
    Admin {
        #[arg(long)]
        dir: PathBuf,
        /// How long the certificate is valid.
        #[arg(long, default_value = "365d", value_parser = humantime::parse_duration)]
        validity: Duration,
    },
    /// Move the cluster to a new CA with no failed request: begin, switch, finish (README,
    /// Operations: certificate rotation).
    Rotate {
        #[command(subcommand)]
        step: super::ca_rotate::RotateCmd,
    },
}

#[derive(Debug, Subcommand)]
enum TokenCmd {
    /// Create a join token (secret, TTL, CA hash) for one node: it is redeemed once, and only
    /// by a node starting with that id and name.
    Create {
        #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
        ttl: Duration,
        /// The id (`node.id`) of the node the token is for; no host may have it yet.
        #[arg(long, value_name = "N")]
        node_id: u64,
        /// The name (`node.name`) of the node the token is for.
        #[arg(long, value_name = "NAME")]
        name: String,
    },
}

#[derive(Debug, Subcommand)]
enum KvCmd {
    Put {
        key: String,
        value: String,
    },
    Get {
        key: String,
    },
    Delete {
        key: String,
    },
    /// Set KEY to VALUE only if it holds OLD (or, with --expect-absent, does not exist).
    Cas {
        key: String,
        #[arg(long, required_unless_present = "expect_absent")]
        expect: Option<String>,
        #[arg(long, conflicts_with = "expect")]
        expect_absent: bool,
        value: String,
    },
    List {
        prefix: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum MembersCmd {
    /// Every host's role, zone, lag and liveness, and the autopilot's latest reason (the
    /// default).
    List,
    /// Remove a node from the cluster.
    Remove { id: u64 },
}

#[derive(Debug, Subcommand)]
enum BenchCmd {
    /// Concurrent puts: throughput and latency percentiles.
    Kv {
        #[arg(long, default_value_t = 16)]
        clients: usize,
        #[arg(long, default_value_t = 10_000)]
        ops: usize,
        #[arg(long, default_value_t = 256)]
        value_size: usize,
    },
}

impl Args {
    fn endpoints(&self) -> Vec<String> {
        self.endpoint
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect()
    }

    fn client(&self) -> anyhow::Result<AdminClient> {
        AdminClient::new(
            &self.endpoints(),
            &self.tls_dir,
            &self.cluster,
            Duration::from_millis(self.timeout_ms),
        )
        .with_context(|| {
            format!(
                "cannot use the admin credentials in {}",
                self.tls_dir.display()
            )
        })
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let out = Out { json: args.json };
    match &args.command {
        Command::Node {
            cmd:
                NodeCmd::Start {
                    config,
                    bootstrap,
                    join,
                    token,
                    log_json,
                },
        } => {
            super::daemon::start(super::daemon::StartArgs {
                config: config.clone(),
                bootstrap: *bootstrap,
                join: join.clone(),
                token: token.clone(),
                log_json: *log_json,
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Ca {
            cmd: CaCmd::Init {
                dir,
                admin_validity,
            },
        } => {
            yard::tls::init_ca_dir(dir, &args.cluster, *admin_validity)?;
            out.line(
                json!({"dir": dir, "ca": dir.join("ca.crt"), "admin": dir.join("admin.crt")}),
                || format!("created a CA and an admin certificate in {}", dir.display()),
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Ca {
            cmd:
                CaCmd::Issue {
                    dir,
                    name,
                    id,
                    ips,
                    validity,
                },
        } => {
            if *id == 0 {
                bail!("node id must be at least 1");
            }
            yard::tls::issue_node_cert(dir, &args.cluster, name, *id, ips, *validity)?;
            let san = yard::tls::node_san(&args.cluster, *id);
            out.line(json!({"name": name, "id": id, "san": san}), || {
                format!("issued {}/{name}.crt for {san}", dir.display())
            });
            Ok(ExitCode::SUCCESS)
        }
        Command::Ca {
            cmd: CaCmd::Admin { dir, validity },
        } => {
            yard::tls::issue_admin_cert(dir, &args.cluster, *validity)?;
            out.line(json!({"admin": dir.join("admin.crt")}), || {
                format!("issued {}/admin.crt", dir.display())
            });
            Ok(ExitCode::SUCCESS)
        }
        Command::Ca {
            cmd: CaCmd::Rotate { step },
        } if step.is_offline() => super::ca_rotate::offline(step, &args.cluster, out),
        Command::Diagnose(d) if d.is_offline() => super::diagnose::offline(d, out),
        Command::Sim { cmd } => super::sim::run(cmd, out),
        Command::Offload { cmd } => super::offload::run(cmd, out),
        Command::Plan { cmd } if cmd.is_offline() => super::plan::run(cmd, out),
        Command::Snapshot { cmd } if cmd.is_offline() => super::snapshot::run(cmd, out),
        _ => runtime()?.block_on(client_command(&args, out)),
    }
}

async fn client_command(args: &Args, out: Out) -> anyhow::Result<ExitCode> {
    if let Command::Bench {
        cmd: BenchCmd::Kv {
            clients,
            ops,
            value_size,
        },
    } = &args.command
    {
        if *clients == 0 || *ops == 0 {
            bail!("--clients and --ops must be at least 1");
        }
        let report = super::bench::kv(|| args.client(), *clients, *ops, *value_size).await?;
        out.line(serde_json::to_value(&report)?, || report.human());
        return Ok(ExitCode::SUCCESS);
    }
    let client = args.client()?;
    if let Command::Gateway { cmd } = &args.command {
        return super::gateway::run(&client, cmd, out).await;
    }
    if let Command::Diagnose(d) = &args.command {
        return super::diagnose::live(&client, d, out).await;
    }
    if let Command::Ca {
        cmd: CaCmd::Rotate { step },
    } = &args.command
    {
        let connect = super::ca_rotate::connector(
            args.tls_dir.clone(),
            args.cluster.clone(),
            Duration::from_millis(args.timeout_ms),
        );
        return super::ca_rotate::online(step, &client, connect, &args.cluster, out).await;
    }
    if let Command::Version = &args.command {
        return super::output::print_version(client.call(Request::Level).await?, out);
    }
    if let Command::Agg { cmd } = &args.command {
        return super::agg::run(&client, cmd, out).await;
    }
    if let Command::Plan { .. } = &args.command {
        return super::plan::show(&client, out).await;
    }
    if let Command::Snapshot {
        cmd: super::snapshot::SnapshotCmd::Save { file },
    } = &args.command
    {
        return super::snapshot::save(&client, file, out).await;
    }
    let req = match &args.command {
        Command::Status => AdminRequest::Status,
        Command::Token {
            cmd: TokenCmd::Create { ttl, node_id, name },
        } => AdminRequest::TokenCreateBound {
            ttl_secs: ttl.as_secs(),
            node_id: *node_id,
            name: name.clone(),
        },
        Command::Kv { cmd } => match cmd {
            KvCmd::Put { key, value } => AdminRequest::KvPut {
                key: key.clone(),
                value: value.clone(),
            },
            KvCmd::Get { key } => AdminRequest::KvGet { key: key.clone() },
            KvCmd::Delete { key } => AdminRequest::KvDelete { key: key.clone() },
            KvCmd::Cas {
                key, expect, value, ..
            } => AdminRequest::KvCas {
                key: key.clone(),
                expect: expect.clone(),
                value: value.clone(),
            },
            KvCmd::List { prefix } => AdminRequest::KvList {
                prefix: prefix.clone().unwrap_or_default(),
            },
        },
        Command::Members {
            cmd: Some(MembersCmd::Remove { id }),
        } => AdminRequest::MembersRemove { id: *id },
        Command::Members {
            cmd: None | Some(MembersCmd::List),
        } => AdminRequest::Members,
        Command::Node {
            cmd: NodeCmd::Drain { id },
        } => AdminRequest::NodeDrain {
            id: *id,
            drained: true,
        },
        Command::Node {
            cmd: NodeCmd::Undrain { id },
        } => AdminRequest::NodeDrain {
            id: *id,
            drained: false,
        },
        Command::Leader {
            cmd: LeaderCmd::Transfer { node },
        } => AdminRequest::LeaderTransfer { to: *node },
        Command::Node {
            cmd: NodeCmd::Start { .. },
        }
        | Command::Ca { .. }
        | Command::Bench { .. }
        | Command::Gateway { .. }
        | Command::Agg { .. }
        | Command::Diagnose(_)
        | Command::Sim { .. }
        | Command::Offload { .. }
        | Command::Plan { .. }
        | Command::Snapshot { .. }
        | Command::Version => {
            unreachable!("handled above")
        }
    };
    let reply = client.admin(req.clone()).await;
    // A request this process gave up on may still be held up at a node: telling the nodes
    // before exiting makes them drop it. (An answered request left nothing behind, and closing
    // waits for the nodes to hear it, so a success exits at once.)
    if reply.is_err() {
        client.close().await;
    }
    Ok(render(&req, reply?, out))
}

fn render(req: &AdminRequest, reply: AdminReply, out: Out) -> ExitCode {
    match (req, reply) {
        (_, AdminReply::Status(s)) => print_status(&s, out),
        (_, AdminReply::Members(m)) => print_members(&m, out),
        (_, AdminReply::Snapshot(_)) => unreachable!("a snapshot is saved by `yard snapshot save`"),
        (AdminRequest::KvGet { key }, AdminReply::Value(None)) => {
            eprintln!("key not found: {key}");
            return ExitCode::FAILURE;
        }
        (_, AdminReply::Value(Some(e))) => out.line(
            json!({"key": e.key, "value": e.value, "revision": e.revision}),
            || e.value.clone(),
        ),
        (_, AdminReply::List(entries)) => {
            let v: Vec<_> = entries
                .iter()
                .map(|e| json!({"key": e.key, "value": e.value, "revision": e.revision}))
                .collect();
            out.line(serde_json::Value::Array(v), || {
                entries
                    .iter()
                    .map(|e| format!("{}\t{}", e.key, e.value))
                    .collect::<Vec<_>>()
                    .join("\n")
            });
        }
        (AdminRequest::NodeDrain { id, drained }, AdminReply::Written { revision }) => out.line(
            json!({"node": id, "drained": drained, "revision": revision}),
            || {
                if *drained {
                    format!("node {id} drained at revision {revision}: its VIPs, aggregator seats and raft role move to other hosts (yard members, yard gateway vip list)")
                } else {
                    format!("node {id} undrained at revision {revision}")
                }
            },
        ),
        (_, AdminReply::Written { revision }) => out.line(json!({"revision": revision}), || {
            format!("revision {revision}")
        }),
        (_, AdminReply::Deleted { revision, existed }) => {
            out.line(json!({"revision": revision, "deleted": existed}), || {
                if existed {
                    format!("deleted at revision {revision}")
                } else {
                    "no such key".into()
                }
            })
        }
        (
            AdminRequest::KvCas { key, .. },
            AdminReply::Cas {
                succeeded,
                revision,
                current,
            },
        ) => {
            out.line(
                json!({"succeeded": succeeded, "revision": revision, "current": current.as_ref().map(|c| &c.value)}),
                || {
                    if succeeded {
                        format!("revision {revision}")
                    } else {
                        format!("compare failed: {key} holds {}", current.as_ref().map_or("nothing".into(), |c| format!("{:?}", c.value)))
                    }
                },
            );
            if !succeeded {
                return ExitCode::from(2);
            }
        }
        (_, AdminReply::Cas { .. }) => {}
        (_, AdminReply::Removed { id }) => {
            out.line(json!({"removed": id}), || format!("removed node {id}"))
        }
        (
            _,
            AdminReply::Token {
                token,
                expires_unix_ms,
            },
        ) => out.line(
            json!({"token": token, "expires_unix_ms": expires_unix_ms}),
            || token.clone(),
        ),
        (_, AdminReply::LeaderMoved { from, to }) => out.line(
            json!({"from": from, "to": to}),
            || format!("node {to} leads (was node {from})"),
        ),
        (_, AdminReply::Value(None)) => {}
        // Gateway replies are rendered by `yard gateway`.
        (_, AdminReply::Vips(_) | AdminReply::Endpoints(_) | AdminReply::GatewayStats(_)) => {}
        // Diagnoses are rendered by `yard diagnose`, aggregation by `yard agg`, plans by
        // `yard plan show`.
        (
            _,
            AdminReply::Diagnosis(_)
            | AdminReply::AggJobs(_)
            | AdminReply::AggStats(_)
            | AdminReply::Plan(_),
        ) => {}
    }
    ExitCode::SUCCESS
}
