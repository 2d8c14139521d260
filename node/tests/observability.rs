//! The node's observability surface on a real one-node cluster (in-memory transport): the HTTP
//! port's `/metrics`, `/healthz` and `/readyz` from a listener bound on 127.0.0.1, and the
//! Grafana dashboard's queries against what the node exports.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use yard::config::RaftSection;
use yard::diagnosis_control::{DiagnosisControl, DiagnosisSettings};
use yard::gateway_control::GatewayControl;
use yard::gauges::RaftGauges;
use yard::http::{Endpoints, NodeReadiness};
use yard::rpc::{AdminReply, AdminRequest, Reply, Request};
use yard::service::{Node, NodeParts};
use yard::tls::PeerRole;
use yard::transport::{MemNetwork, Target};
use yard_actors::gateway::actor::{GatewaySnapshot, GatewayView};
use yard_actors::gateway::lease::LeaseConfig;
use yard_actors::health::HealthRegistry;
use yard_actors::liveness::Reachability;
use yard_actors::probe::socket::SharedProbe;

const ADDR: &str = "198.18.0.1:7480";

struct OneNode {
    node: Node,
    health: HealthRegistry,
    net: MemNetwork,
    _dir: tempfile::TempDir,
}

/// A one-node cluster, not yet bootstrapped (so it knows no leader).
async fn one_node() -> OneNode {
    let dir = tempfile::tempdir().unwrap();
    let (log, sm) = yard_raft_store::open(dir.path()).unwrap();
    let feed = sm.feed();
    let net = MemNetwork::default();
    let transport = net.transport(ADDR, PeerRole::Node(1));
    let raft_cfg = RaftSection {
        heartbeat_ms: 50,
        election_timeout_min_ms: 200,
        election_timeout_max_ms: 400,
        snapshot_every: 10_000,
        logs_kept: 1_000,
        ..RaftSection::default()
    };
    let handover = yard::raft_network::Handover::default();
    let raft = yard_raft_store::Raft::new(
        1,
        Arc::new(raft_cfg.to_openraft("test").unwrap()),
        yard::raft_network::RaftNet {
            transport: transport.clone(),
            id: 1,
            retry_after: Duration::from_millis(50),
            handover: handover.clone(),
        },
        log,
        sm,
    )
    .await
    .unwrap();
    let health = HealthRegistry::default();
    let node = Node::new(NodeParts {
        id: 1,
        name: "n1".into(),
        cluster: "test".into(),
        addr: ADDR.into(),
        raft,
        feed,
        transport,
        pki: Arc::new(yard::pki::PkiCell::new(yard::pki::Pki::without_files(
            None, "cafe",
        ))),
        cert_validity: yard::tls::NODE_VALIDITY,
        handover,
        rpc_timeout: Duration::from_millis(500),
        leader_wait: Duration::from_secs(3),
        health: health.clone(),
        reachability: Reachability::default(),
        gateway: Arc::new(GatewayControl::new(
            LeaseConfig {
                lease_ms: 200,
                margin_ms: 20,
            },
            Duration::from_millis(40),
            true,
        )),
        diagnosis: Arc::new(DiagnosisControl::new(DiagnosisSettings {
            analyzer: yard_diagnosis::analyzer::Config::default(),
            evaluate_every: Duration::from_millis(50),
            job_idle: Duration::from_secs(60),
            hook: Default::default(),
            total_budget_bytes: yard::diagnosis_control::DEFAULT_TOTAL_BUDGET,
        })),
        zone: String::new(),
        host_liveness: Default::default(),
        max_frame: yard::frame::DEFAULT_MAX_FRAME,
        // No CA here: forwarded operator writes are taken unsigned.
        operator_proofs: None,
        roles: yard_control::roles::RolesConfig::default(),
    });
    net.register(ADDR, Arc::new(node.clone()));
    let (ctl, raft, feed) = (
        node.diagnosis().clone(),
        node.raft().clone(),
        node.feed().clone(),
    );
    tokio::spawn(ctl.run(raft, feed));
    OneNode {
        node,
        health,
        net,
        _dir: dir,
    }
}

impl OneNode {
    async fn lead(&self) {
        self.node.bootstrap().await.unwrap();
        let start = Instant::now();
        while self.node.raft().metrics().borrow().current_leader != Some(1) {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no leader within 10 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn put(&self, key: &str, value: &str) {
        let admin = self.net.transport("198.18.1.1:1", PeerRole::Admin);
        let reply = admin
            .call(
                Target::any(ADDR),
                Request::Admin(AdminRequest::KvPut {
                    key: key.into(),
                    value: value.into(),
                }),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        assert!(
            matches!(reply, Reply::Admin(AdminReply::Written { .. })),
            "{reply:?}"
        );
    }
}

/// GET `path` on 127.0.0.1:`port`: status and body.
async fn get(port: u16, path: &str) -> (u16, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let uri = format!("http://127.0.0.1:{port}{path}").parse().unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), client.get(uri))
        .await
        .expect("the metrics port did not answer within 10 s")
        .unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_port_serves_metrics_health_and_readiness() {
    let n = one_node().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let endpoints = Endpoints {
        gauges: Arc::new(RaftGauges(n.node.clone())),
        readiness: Arc::new(NodeReadiness {
            node: n.node.clone(),
            expected_actors: vec!["admin", "liveness"],
        }),
    };
    let server = tokio::spawn(yard::http::serve(listener, endpoints));

    assert_eq!(get(port, "/healthz").await, (200, "ok\n".to_owned()));
    // No cluster yet: alive but not ready, and the body says why.
    assert_eq!(
        get(port, "/readyz").await,
        (503, "not ready: no raft leader is known yet\n".to_owned())
    );

    n.lead().await;
    assert_eq!(
        get(port, "/readyz").await,
        (
            503,
            "not ready: actor admin has not reported yet\n".to_owned()
        )
    );
    n.health.report("admin", true, "0 in flight");
    n.health.report("liveness", true, "started");
    assert_eq!(get(port, "/readyz").await, (200, "ready\n".to_owned()));
    n.health.report("liveness", false, "stopped");
    assert_eq!(
        get(port, "/readyz").await,
        (
            503,
            "not ready: actor liveness is unhealthy: stopped\n".to_owned()
        )
    );

    n.put("k", "v").await;
    let (status, text) = get(port, "/metrics").await;
    assert_eq!(status, 200);
    let lines: Vec<&str> = text.lines().collect();
    for want in [
        "# TYPE yard_kv_put_duration_seconds histogram",
        "# TYPE yard_forward_duration_seconds histogram",
        "# TYPE yard_gateway_failover_phase_duration_seconds histogram",
        "# TYPE yard_analyzer_pass_duration_seconds histogram",
        "yard_raft_is_leader 1",
        "yard_raft_leader_id 1",
    ] {
        assert!(lines.contains(&want), "missing {want:?} in\n{text}");
    }
    // This process's puts (other tests here put too): at least the one above.
    let puts: u64 = lines
        .iter()
        .find_map(|l| l.strip_prefix("yard_kv_put_duration_seconds_count "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(puts >= 1, "{text}");
    let inf: u64 = lines
        .iter()
        .find_map(|l| l.strip_prefix("yard_kv_put_duration_seconds_bucket{le=\"+Inf\"} "))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(inf, puts);
    // Every phase is exported before any failover, bucket by bucket.
    for phase in ["fence", "placement"] {
        let bucket = format!(
            "yard_gateway_failover_phase_duration_seconds_bucket{{phase=\"{phase}\",le=\"+Inf\"}} "
        );
        assert!(
            lines.iter().any(|l| l.starts_with(&bucket)),
            "{bucket}\n{text}"
        );
    }

    let (status, body) = get(port, "/nothing").await;
    assert_eq!(status, 404, "{body}");
    server.abort();
}

/// A re-plan with one node and one move, so that the planner's families are rendered.
fn plan_record() -> yard::rpc::PlanRecord {
    use yard_actors::gateway::replan::{NodeView, PlannedMove, Rate, ReplanReport};
    yard::rpc::PlanRecord {
        at_unix_ms: 1,
        term: 1,
        measured_vips: 1,
        report: ReplanReport {
            current_worst: 1.2,
            planned_worst: 0.6,
            moves: vec![PlannedMove {
                vip: std::net::Ipv4Addr::new(198, 19, 255, 1),
                from: 1,
                to: 2,
                rate: Rate { bps: 1e6, pps: 1e3 },
            }],
            deferred: 0,
            reason: "a test".into(),
            nodes: vec![NodeView {
                node: 1,
                fail_prob: 0.01,
                measured: 1.2,
                predicted: 0.6,
                after_failure: 0.6,
            }],
            tenants: Vec::new(),
        },
    }
}

/// Every metric name a PromQL expression mentions: identifiers starting with `yard_`, string
/// literals (label values) left out.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut in_string = false;
    let mut current = String::new();
    let mut flush = |current: &mut String| {
        if current.starts_with("yard_") {
            names.insert(current.clone());
        }
        current.clear();
    };
    for c in expr.chars() {
        if c == '"' {
            in_string = !in_string;
            flush(&mut current);
            continue;
        }
        if in_string {
            continue;
        }
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            current.push(c);
        } else {
            flush(&mut current);
        }
    }
    flush(&mut current);
    names
}

/// Every PromQL expression in the dashboard: panel targets and template variable queries.
fn expressions(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        // The data source variable's query is a plugin name, not PromQL.
        serde_json::Value::Object(map)
            if map.get("type").and_then(|t| t.as_str()) == Some("datasource") => {}
        serde_json::Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr" | "definition" | "query", serde_json::Value::String(s)) => {
                        out.push(s.clone())
                    }
                    _ => expressions(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| expressions(v, out)),
        _ => {}
    }
}

/// `# TYPE` lines of an exposition: name → kind.
fn exported(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| {
            let mut words = l.strip_prefix("# TYPE ")?.split_whitespace();
            Some((words.next()?.to_owned(), words.next()?.to_owned()))
        })
        .collect()
}

/// Whether `name` is a series of an exported family: the family itself, or a histogram's
/// `_bucket`, `_sum` or `_count` series.
fn is_exported(name: &str, families: &BTreeMap<String, String>) -> bool {
    if families.contains_key(name) {
        return true;
    }
    ["_bucket", "_sum", "_count"].iter().any(|suffix| {
        name.strip_suffix(suffix)
            .and_then(|base| families.get(base))
            .is_some_and(|kind| kind == "histogram")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_queries_is_exported() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/grafana/yard-dashboard.json"
    );
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut exprs = Vec::new();
    expressions(&dashboard, &mut exprs);
    assert!(exprs.len() > 20, "only {} expressions found", exprs.len());

    // A node with every optional part attached and populated, so each labelled family that
    // only exists with content (XDP counters, verdicts, the probe) is rendered.
    let n = one_node().await;
    n.lead().await;
    n.node.attach_probe(SharedProbe::new(16));
    let gateway = GatewayView::default();
    gateway.publish(GatewaySnapshot {
        node: 1,
        counters: vec![("forwarded", 10, 1_500), ("arp_reply", 2, 84)],
        ..GatewaySnapshot::default()
    });
    n.node.attach_gateway(gateway);
    n.node.gateway().record_plan(plan_record());
    n.node
        .raft()
        .client_write(yard_raft_store::Command::Diagnosis(
            yard_raft_store::diagnosis::DiagnosisCommand::SetVerdicts {
                job: "job-1".into(),
                verdicts: vec![yard_diagnosis::verdict::Verdict {
                    class: yard_diagnosis::verdict::Class::Hang,
                    subtype: yard_diagnosis::verdict::Subtype::MissingParticipant,
                    culprits: vec![3],
                    links: vec![],
                    pg: None,
                    seq: None,
                    op: None,
                    evidence: vec!["rank 3 never entered the collective".into()],
                    confidence: 0.9,
                    detected_ns: 0,
                }],
                now_unix_ms: 1,
            },
        ))
        .await
        .unwrap();
    let text = yard::metrics::render(&RaftGauges(n.node.clone())).unwrap();
    let families = exported(&text);
    // The planner's families carry the recorded re-plan; `yard plan show` answers with it.
    assert!(text.contains("yard_planner_load_factor 0.6"), "{text}");
    assert!(
        text.contains("yard_planner_node_load{kind=\"predicted\",node=\"1\"} 0.6"),
        "{text}"
    );
    assert!(text.contains("yard_planner_moves_total 1"), "{text}");
    let admin = n.net.transport("198.18.1.1:1", PeerRole::Admin);
    let reply = admin
        .call(
            Target::any(ADDR),
            Request::Admin(AdminRequest::PlanShow),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    let Reply::Admin(AdminReply::Plan(view)) = reply else {
        panic!("{reply:?}");
    };
    assert_eq!(view.leader, 1);
    assert!(!view.enabled, "this node has no [planner]");
    assert_eq!(
        view.last_moved.map(|r| r.report.moves.len()),
        Some(1),
        "the recorded move"
    );

    let mut missing = BTreeSet::new();
    let mut queried = BTreeSet::new();
    for expr in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "the query {expr:?} names no yard metric");
        for name in names {
            if !is_exported(&name, &families) {
                missing.insert(name.clone());
            }
            queried.insert(name);
        }
    }
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics the node does not export: {missing:?}\nexported: {:?}",
        families.keys().collect::<Vec<_>>()
    );
    // The histograms the dashboard exists for are on it.
    for histogram in [
        "yard_kv_put_duration_seconds_bucket",
        "yard_forward_duration_seconds_bucket",
        "yard_gateway_failover_phase_duration_seconds_bucket",
        "yard_analyzer_pass_duration_seconds_bucket",
    ] {
        assert!(queried.contains(histogram), "{histogram} is not graphed");
    }
}

#[test]
fn metric_names_come_from_identifiers_outside_strings() {
    assert_eq!(
        metric_names(
            r#"histogram_quantile(0.99, sum by (le) (rate(yard_a_bucket{what="yard_not_this"}[$__rate_interval]))) / yard_b"#
        ),
        BTreeSet::from(["yard_a_bucket".to_owned(), "yard_b".to_owned()])
    );
    let families = BTreeMap::from([
        ("yard_h".to_owned(), "histogram".to_owned()),
        ("yard_c_total".to_owned(), "counter".to_owned()),
    ]);
    assert!(is_exported("yard_h_bucket", &families));
    assert!(is_exported("yard_h_count", &families));
    assert!(is_exported("yard_c_total", &families));
    assert!(!is_exported("yard_c_total_count", &families));
    assert!(!is_exported("yard_x", &families));
}
