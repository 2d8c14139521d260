//! Real `yard` processes on loopback: crash recovery after `kill -9` mid-write, a foreign CA
//! refused, garbage and oversize frames refused with the node still serving, the health and
//! readiness probes, config errors that name the key.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use yard::client::AdminClient;
use yard::rpc::{AdminReply, AdminRequest, Reply};
use yard::tls::{self, Identity, Trust};

const BIN: &str = env!("CARGO_BIN_EXE_yard");

fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One single-node daemon on loopback with the embedded default (its own CA in its data dir).
struct Daemon {
    child: Option<Child>,
    dir: PathBuf,
    port: u16,
    metrics: u16,
}

impl Daemon {
    fn start(dir: &Path) -> Self {
        let mut d = Self {
            child: None,
            dir: dir.to_owned(),
            port: free_port(),
            metrics: free_tcp_port(),
        };
        d.spawn();
        d
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("yard.log"))
            .unwrap();
        let child = Command::new(BIN)
            .args(["node", "start"])
            .env("YARD_NODE__DATA_DIR", &self.dir)
            .env("YARD_NODE__LISTEN", format!("127.0.0.1:{}", self.port))
            .env(
                "YARD_METRICS__LISTEN",
                format!("127.0.0.1:{}", self.metrics),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn tls_dir(&self) -> PathBuf {
        self.dir.join("tls")
    }

    fn client(&self) -> AdminClient {
        let start = Instant::now();
        while !self.tls_dir().join("admin.key").exists() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "daemon never wrote its CA"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        AdminClient::new(
            &[self.endpoint()],
            &self.tls_dir(),
            "yard",
            Duration::from_secs(2),
        )
        .unwrap()
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

async fn wait_serving(client: &AdminClient) {
    let start = Instant::now();
    loop {
        if let Ok(AdminReply::Status(s)) = client.admin(AdminRequest::Status).await {
            if s.leader.is_some() {
                return;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "node did not start serving"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_write_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(dir.path());
    let client = d.client();
    wait_serving(&client).await;
    let acked = Arc::new(Mutex::new(Vec::new()));
    for round in 0..3u32 {
        let stop = Arc::new(AtomicBool::new(false));
        let mut writers = Vec::new();
        for w in 0..4 {
            let (client, acked, stop) = (client.clone(), acked.clone(), stop.clone());
            writers.push(tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("r{round}/w{w}/{i}");
                    if client
                        .admin(AdminRequest::KvPut {
                            key: key.clone(),
                            value: "v".into(),
                        })
                        .await
                        .is_ok()
                    {
                        acked.lock().unwrap().push(key);
                    }
                    i += 1;
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(300 + 170 * u64::from(round))).await;
        d.kill9();
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.await.unwrap();
        }
        d.spawn();
        wait_serving(&client).await;
        let keys = acked.lock().unwrap().clone();
        assert!(
            !keys.is_empty(),
            "no write was acknowledged before the kill"
        );
        for key in &keys {
            match client
                .admin(AdminRequest::KvGet { key: key.clone() })
                .await
                .unwrap()
            {
                AdminReply::Value(Some(_)) => {}
                other => {
                    panic!("acknowledged write {key} lost after kill -9 (round {round}): {other:?}")
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_ca_is_refused_and_the_node_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path());
    let client = d.client();
    wait_serving(&client).await;
    let foreign = tempfile::tempdir().unwrap();
    tls::init_ca_dir(foreign.path(), "yard", tls::ADMIN_VALIDITY).unwrap();
    let stranger = AdminClient::new(
        &[d.endpoint()],
        foreign.path(),
        "yard",
        Duration::from_secs(2),
    )
    .unwrap();
    let err = stranger.admin(AdminRequest::Status).await.unwrap_err();
    assert!(!err.to_string().is_empty());
    // The CLI says so in one sentence and exits non-zero.
    let out = Command::new(BIN)
        .args(["status", "--endpoint", &d.endpoint(), "--tls-dir"])
        .arg(foreign.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(matches!(
        client.admin(AdminRequest::Status).await,
        Ok(AdminReply::Status(_))
    ));
}

/// Opens a raw stream with the admin certificate and sends `bytes` as-is.
async fn raw_exchange(d: &Daemon, bytes: &[u8]) -> Result<Reply, String> {
    let identity = Identity::load(&d.tls_dir(), "admin").unwrap();
    let cfg =
        tls::client_config("yard", Trust::Ca(identity.trust.clone()), Some(&identity)).unwrap();
    let ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let conn = ep
        .connect_with(
            cfg,
            d.endpoint().parse().unwrap(),
            &tls::expected_server_name("yard", None),
        )
        .unwrap()
        .await
        .map_err(|e| e.to_string())?;
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
    let _ = send.write_all(bytes).await;
    let _ = send.finish();
    yard::frame::read(&mut recv, 1 << 20)
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_oversize_frames_are_refused_and_the_node_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path());
    let client = d.client();
    wait_serving(&client).await;
    let mut oversize = (u32::MAX).to_be_bytes().to_vec();
    oversize.extend_from_slice(&[0u8; 64]);
    match raw_exchange(&d, &oversize).await.unwrap() {
        Reply::Error(e) => assert!(e.contains("exceeds the limit"), "{e}"),
        other => panic!("oversize frame answered with {other:?}"),
    }
    let mut garbage = 12u32.to_be_bytes().to_vec();
    garbage.extend_from_slice(&[
        0xde, 0xad, 0xbe, 0xef, 0xff, 0xff, 0xff, 0xff, 0x13, 0x37, 0x00, 0x01,
    ]);
    match raw_exchange(&d, &garbage).await.unwrap() {
        Reply::Error(e) => assert!(
            e.contains("does not decode") || e.contains("trailing"),
            "{e}"
        ),
        other => panic!("garbage frame answered with {other:?}"),
    }
    match raw_exchange(&d, &[0, 0]).await.unwrap() {
        Reply::Error(e) => assert!(e.contains("truncated"), "{e}"),
        other => panic!("truncated frame answered with {other:?}"),
    }
    assert!(matches!(
        client
            .admin(AdminRequest::KvPut {
                key: "still".into(),
                value: "up".into()
            })
            .await,
        Ok(AdminReply::Written { .. })
    ));
    // The refusals are counted.
    let body = http_get(d.metrics, "/metrics").await;
    let line = body
        .lines()
        .find(|l| l.starts_with("yard_transport_frame_errors_total "))
        .unwrap();
    assert_eq!(line, "yard_transport_frame_errors_total 3");
}

/// The daemon's resident memory, in bytes.
fn rss_bytes(d: &Daemon) -> u64 {
    let pid = d.child.as_ref().unwrap().id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

/// One stalled frame on a new stream of `conn`: a 16 MiB length, then as much of the body as
/// the node lets through within `for_ms`, and nothing more. The stream is kept open.
async fn stall_one_frame(conn: quinn::Connection, for_ms: u64) -> Option<quinn::SendStream> {
    let open = tokio::time::timeout(Duration::from_millis(for_ms), conn.open_bi());
    let (mut send, _recv) = open.await.ok()?.ok()?;
    let mut frame = (16u32 * 1024 * 1024).to_be_bytes().to_vec();
    frame.extend_from_slice(&[0x5a; 1024 * 1024]);
    let _ = tokio::time::timeout(Duration::from_millis(for_ms), send.write_all(&frame)).await;
    Some(send)
}

/// Issue 25, finding 4: a client without a certificate that opens many connections and, on
/// each, as many streams as it may with a 16 MiB frame it never finishes, leaves the node's
/// memory bounded, and the node still answers an operator. The node used to read such frames
/// for anyone (1,024 streams a connection, 16 MiB each, no deadline, no connection cap).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anonymous_client_stalling_large_frames_leaves_memory_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path());
    let client = d.client();
    wait_serving(&client).await;
    let before = rss_bytes(&d);
    let ca = tls::load_trust(&d.tls_dir()).unwrap();
    let cfg = tls::client_config("yard", Trust::Ca(ca), None).unwrap();
    let ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut conns = Vec::new();
    for _ in 0..16 {
        let connecting = ep
            .connect_with(
                cfg.clone(),
                d.endpoint().parse().unwrap(),
                &tls::expected_server_name("yard", None),
            )
            .unwrap();
        if let Ok(conn) = connecting.await {
            conns.push(conn);
        }
    }
    assert!(!conns.is_empty(), "no anonymous connection was accepted");
    let stalls = conns
        .iter()
        .flat_map(|c| (0..32).map(move |_| stall_one_frame(c.clone(), 1_500)))
        .collect::<Vec<_>>();
    let held: Vec<_> = futures::future::join_all(stalls)
        .await
        .into_iter()
        .flatten()
        .collect();
    let grown = rss_bytes(&d).saturating_sub(before);
    // The node still answers an operator while the frames are held.
    assert!(matches!(
        client.admin(AdminRequest::Status).await,
        Ok(AdminReply::Status(_))
    ));
    assert!(
        grown < 32 * 1024 * 1024,
        "the node grew by {} MiB for {} stalled anonymous streams",
        grown / (1024 * 1024),
        held.len()
    );
    drop(held);
    drop(conns);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_answers_kubernetes_probes_and_exports_histograms() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path());
    let client = d.client();
    wait_serving(&client).await;
    let health = http_get(d.metrics, "/healthz").await;
    assert!(health.starts_with("HTTP/1.1 200 "), "{health}");
    // Ready once the actors it starts (admin, liveness) have reported as well.
    let start = Instant::now();
    loop {
        let ready = http_get(d.metrics, "/readyz").await;
        if ready.starts_with("HTTP/1.1 200 ") {
            break;
        }
        assert!(ready.starts_with("HTTP/1.1 503 "), "{ready}");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never ready: {ready}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(matches!(
        client
            .admin(AdminRequest::KvPut {
                key: "k".into(),
                value: "v".into()
            })
            .await,
        Ok(AdminReply::Written { .. })
    ));
    let body = http_get(d.metrics, "/metrics").await;
    assert!(body.starts_with("HTTP/1.1 200 "), "{body}");
    assert!(
        body.lines()
            .any(|l| l == "yard_kv_put_duration_seconds_count 1"),
        "{body}"
    );
    for family in [
        "yard_forward_duration_seconds",
        "yard_gateway_failover_phase_duration_seconds",
        "yard_analyzer_pass_duration_seconds",
    ] {
        assert!(
            body.contains(&format!("# TYPE {family} histogram\n")),
            "{family}: {body}"
        );
    }
}

async fn http_get(port: u16, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[test]
fn config_errors_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("yard.toml");
    std::fs::write(
        &cfg,
        "[node]\nid = 1\nlisten = \"127.0.0.1:1\"\n[raft]\nheartbeat_mss = 5\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["node", "start", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("raft.heartbeat_mss"), "{stderr}");
    let out = Command::new(BIN)
        .args(["node", "start", "--config"])
        .arg(&cfg)
        .env("YARD_RAFT__HEARTBEAT_MS", "soon")
        .output()
        .unwrap();
    assert!(!out.status.success());
    std::fs::write(&cfg, "[node]\nid = 1\n").unwrap();
    let out = Command::new(BIN)
        .args(["node", "start", "--config"])
        .arg(&cfg)
        .env("YARD_RAFT__HEARTBEAT_MS", "soon")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("raft.heartbeat_ms"), "{stderr}");
}

#[test]
fn bad_cli_arguments_get_one_clear_error() {
    let out = Command::new(BIN)
        .args(["members", "remove", "not-a-number"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let out = Command::new(BIN)
        .args(["bench", "kv", "--clients", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--clients"));
}

/// A SIGTERM while the node is still joining (here: a seed nobody answers, so the join would
/// retry for minutes) stops it cleanly at once; it used to log "stopping" and then wait for a
/// second signal.
#[test]
fn sigterm_while_joining_stops_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    let tls_s = tls.to_str().unwrap();
    for args in [
        &["ca", "init", "--dir", tls_s][..],
        &[
            "ca",
            "issue",
            "--dir",
            tls_s,
            "--name",
            "n2",
            "--id",
            "2",
            "--ip",
            "127.0.0.1",
        ],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    let log_path = dir.path().join("yard.log");
    let log = std::fs::File::create(&log_path).unwrap();
    // A bound, silent UDP socket: the seed's address exists but never answers.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let seed = silent.local_addr().unwrap().to_string();
    let mut child = Command::new(BIN)
        .args(["node", "start", "--join", &seed])
        .env("YARD_NODE__ID", "2")
        .env("YARD_NODE__NAME", "n2")
        .env("YARD_TLS__DIR", &tls)
        .env("YARD_NODE__DATA_DIR", dir.path().join("data"))
        .env("YARD_NODE__LISTEN", format!("127.0.0.1:{}", free_port()))
        .env(
            "YARD_METRICS__LISTEN",
            format!("127.0.0.1:{}", free_tcp_port()),
        )
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    struct Reap<'a>(&'a mut Child);
    impl Drop for Reap<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let child = Reap(&mut child);
    let start = Instant::now();
    while !std::fs::read_to_string(&log_path)
        .unwrap_or_default()
        .contains("joining the cluster")
    {
        assert!(
            child.0.try_wait().unwrap().is_none(),
            "yard exited before joining: {}",
            std::fs::read_to_string(&log_path).unwrap_or_default()
        );
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "yard never started joining"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = child.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let sent = Instant::now();
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            sent.elapsed() < Duration::from_secs(5),
            "yard still running 5 s after SIGTERM while joining: {}",
            std::fs::read_to_string(&log_path).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(status.success(), "exit {status:?}: {log}");
    assert!(log.contains("stopped"), "{log}");
    drop(silent);
}

/// The job kinds are in `yard sim ccl --list`, and one of them goes the whole offline way a user
/// takes: written out with `--out`, its Flight Recorder dumps read back by `yard diagnose
/// --fr-dumps`, which names the crashed pipeline stage (the waiting next stage is its victim).
#[test]
fn a_simulated_job_kind_is_diagnosed_from_its_dumps() {
    let out = Command::new(BIN)
        .args(["sim", "ccl", "--list", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for kind in ["pipeline-", "hsdp-", "tp_sp-", "diloco-"] {
        assert!(
            listed
                .iter()
                .any(|v| v["catalogue"] == "kinds"
                    && v["scenario"].as_str().unwrap().starts_with(kind)),
            "{kind} not listed"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args([
            "sim",
            "ccl",
            "--scenario",
            "pipeline-crash_stage-s1",
            "--out",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(BIN)
        .args(["diagnose", "--json", "--fr-dumps"])
        .arg(dir.path().join("fr"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let top = &v["verdicts"][0];
    assert_eq!(
        (&top["subtype"], &top["culprits"]),
        (&serde_json::json!("dead_process"), &serde_json::json!([9])),
        "{v:#}"
    );
}
