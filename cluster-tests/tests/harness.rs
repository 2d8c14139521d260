//! Tests of the namespace harness itself; they need root and fail (never skip) without it.

use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use yard_cluster_tests::{require_root, sweep_stale, Process, Topology};

/// Prints "ready" once bound, then "got <payload>" per datagram.
const RECEIVER: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
s.bind((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
while True:
    data = s.recv(2048)
    print("got", data.decode(errors="replace"), flush=True)
"#;

/// Sends argv[4] datagrams "<tag>-<n>", paced so that no socket buffer overflows; send errors
/// (link down) are counted, not fatal.
const SENDER: &str = r#"
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
errors = 0
for n in range(int(sys.argv[4])):
    try:
        s.sendto(f"{sys.argv[3]}-{n}".encode(), (sys.argv[1], int(sys.argv[2])))
    except OSError:
        errors += 1
    time.sleep(0.0005)
print("send errors", errors)
"#;

const PORT: &str = "9000";

fn start_receiver(topo: &Topology, host: usize) -> Process {
    let addr = topo.addr(host).to_string();
    let rx = topo
        .spawn(
            host,
            "python3",
            &["-u", "-c", RECEIVER, &addr, PORT],
            &[],
            &format!("rx{host}.log"),
        )
        .expect("start the UDP receiver");
    // The log's first line repeats the command, script included, so look for a line of its own.
    wait_for(Duration::from_secs(10), || {
        rx.log().lines().any(|l| l == "ready")
    })
    .unwrap_or_else(|| panic!("receiver never got ready; log:\n{}", rx.log()));
    rx
}

/// Sends `count` datagrams tagged `tag` from host `from` to `rx`'s host and returns how many
/// arrived, waiting until arrivals stop.
fn delivered(topo: &Topology, rx: &Process, from: usize, tag: &str, count: usize) -> usize {
    let to = topo.addr(rx.host()).to_string();
    let out = topo
        .exec(
            from,
            "python3",
            &["-c", SENDER, &to, PORT, tag, &count.to_string()],
        )
        .expect("run the UDP sender");
    assert!(
        out.status.success(),
        "sender failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let prefix = format!("got {tag}-");
    let count_now = || rx.log().lines().filter(|l| l.starts_with(&prefix)).count();
    let mut last = count_now();
    let mut still_since = Instant::now();
    let start = Instant::now();
    while last < count && still_since.elapsed() < Duration::from_millis(400) {
        thread::sleep(Duration::from_millis(20));
        let now = count_now();
        if now != last {
            last = now;
            still_since = Instant::now();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "arrivals never settled"
        );
    }
    last
}

fn wait_for(timeout: Duration, mut ok: impl FnMut() -> bool) -> Option<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if ok() {
            return Some(());
        }
        thread::sleep(Duration::from_millis(20));
    }
    None
}

fn namespaces_of(run: &str) -> Vec<String> {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("run ip netns list");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&format!("yd{run}-")))
        .map(str::to_owned)
        .collect()
}

fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

#[test]
fn partition_heal_and_link_down_cut_and_restore_udp() {
    require_root();
    let topo = Topology::new(3).expect("make 3 test hosts");
    let run = topo.run_id().to_owned();
    assert_eq!(namespaces_of(&run).len(), 4, "3 hosts and the fabric");
    let rx = start_receiver(&topo, 2);

    assert_eq!(delivered(&topo, &rx, 1, "before", 20), 20);

    topo.partition(&[&[1], &[2, 3]]).expect("partition");
    assert_eq!(
        delivered(&topo, &rx, 1, "cut", 20),
        0,
        "1 and 2 are on different sides"
    );
    assert_eq!(
        delivered(&topo, &rx, 3, "same-side", 20),
        20,
        "2 and 3 share a side"
    );

    topo.heal().expect("heal");
    assert_eq!(delivered(&topo, &rx, 1, "healed", 20), 20);

    topo.isolate(2).expect("isolate");
    assert_eq!(delivered(&topo, &rx, 3, "isolated", 20), 0);
    topo.heal().expect("heal");

    topo.link_down(1).expect("link down");
    assert_eq!(delivered(&topo, &rx, 1, "down", 20), 0);
    topo.link_up(1).expect("link up");
    thread::sleep(Duration::from_millis(300));
    assert_eq!(delivered(&topo, &rx, 1, "up", 20), 20);

    let pid = rx.pid();
    drop(topo);
    assert!(
        namespaces_of(&run).is_empty(),
        "drop deletes every namespace"
    );
    assert!(!rx.is_running(), "drop kills the receiver (pid {pid})");
    assert!(!Path::new(&format!("/run/yard-tests/{run}.pid")).exists());
}

#[test]
fn loss_drops_about_the_asked_share_and_clears() {
    require_root();
    let topo = Topology::new(2).expect("make 2 test hosts");
    let rx = start_receiver(&topo, 2);
    // Resolve ARP before loss applies, so the measurement is of loss, not of ARP retries.
    assert_eq!(delivered(&topo, &rx, 1, "warm", 5), 5);

    topo.loss(1, 50.0).expect("set 50% loss");
    let got = delivered(&topo, &rx, 1, "half", 200);
    println!("50% loss delivered {got}/200");
    assert!((40..=160).contains(&got), "50% loss delivered {got}/200");

    topo.loss(1, 100.0).expect("set 100% loss");
    assert_eq!(delivered(&topo, &rx, 1, "all", 50), 0);

    topo.clear_loss(1).expect("clear loss");
    topo.clear_loss(1).expect("clearing twice is fine");
    assert_eq!(delivered(&topo, &rx, 1, "clear", 200), 200);
    assert!(topo.loss(1, 101.0).is_err());
}

#[test]
fn rate_limit_attaches_and_clears() {
    require_root();
    let topo = Topology::new(2).expect("make 2 test hosts");
    let show = |topo: &Topology| {
        let out = topo
            .exec(1, "tc", &["qdisc", "show", "dev", "eth0", "root"])
            .expect("show qdisc");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    topo.rate_limit(1, 10).expect("limit to 10 mbit");
    assert!(show(&topo).contains("rate 10Mbit"), "{}", show(&topo));
    topo.rate_limit(1, 20).expect("replace with 20 mbit");
    assert!(show(&topo).contains("rate 20Mbit"), "{}", show(&topo));
    let rx = start_receiver(&topo, 2);
    assert_eq!(delivered(&topo, &rx, 1, "limited", 20), 20);
    topo.clear_rate_limit(1).expect("clear");
    topo.clear_rate_limit(1).expect("clearing twice is fine");
    assert!(!show(&topo).contains("tbf"));
}

#[test]
fn processes_run_in_their_host_and_take_signals() {
    require_root();
    let topo = Topology::new(1).expect("make 1 test host");
    let p = topo
        .spawn(1, "sleep", &["30"], &[("YARD_TEST_MARK", "1")], "sleep.log")
        .expect("spawn sleep");
    // The pid is the program's own, not a wrapper's (`ip netns exec` execs it in place within
    // milliseconds), and it lives in the host's namespace.
    let comm = || std::fs::read_to_string(format!("/proc/{}/comm", p.pid())).unwrap_or_default();
    assert!(
        wait_for(Duration::from_secs(5), || comm().trim() == "sleep").is_some(),
        "pid {} is {}",
        p.pid(),
        comm()
    );
    let ours = std::fs::read_link("/proc/self/ns/net").unwrap();
    let theirs = std::fs::read_link(format!("/proc/{}/ns/net", p.pid())).unwrap();
    assert_ne!(ours, theirs);
    let environ = std::fs::read(format!("/proc/{}/environ", p.pid())).unwrap();
    assert!(String::from_utf8_lossy(&environ).contains("YARD_TEST_MARK=1"));

    p.stop().expect("SIGSTOP");
    assert!(wait_for(Duration::from_secs(2), || proc_state(p.pid()) == Some('T')).is_some());
    assert!(p.is_running(), "a stopped process has not exited");
    p.cont().expect("SIGCONT");
    assert!(wait_for(Duration::from_secs(2), || proc_state(p.pid()) == Some('S')).is_some());
    p.kill9().expect("SIGKILL");
    let status = p
        .wait_exit(Duration::from_secs(5))
        .expect("exit after SIGKILL");
    assert!(!status.success());
    assert!(!p.is_running());
    p.kill9().expect("killing an exited process is fine");
    assert!(p.stop().is_err(), "stopping an exited process is an error");

    let out = topo
        .exec(1, "ip", &["-br", "addr", "show", "eth0"])
        .expect("exec ip");
    assert!(String::from_utf8_lossy(&out.stdout).contains("198.18.0.1/16"));
    let out = topo.exec(1, "ip", &["route"]).expect("exec ip route");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("default"),
        "no route leads out"
    );
    assert!(topo.exec(2, "true", &[] as &[&str]).is_err(), "no host 2");
    let timed_out = topo.exec_with(1, "sleep", &["5"], &[], Duration::from_millis(200));
    assert!(timed_out.is_err());
}

#[test]
fn drop_cleans_up_when_a_test_panics() {
    require_root();
    let (tx, rx) = std::sync::mpsc::channel();
    let joined = thread::spawn(move || {
        let topo = Topology::new(2).expect("make 2 test hosts");
        let p = topo
            .spawn(1, "sleep", &["30"], &[], "sleep.log")
            .expect("spawn sleep");
        tx.send((topo.run_id().to_owned(), p)).unwrap();
        panic!("deliberate panic to test cleanup");
    })
    .join();
    assert!(joined.is_err());
    let (run, p) = rx.recv().unwrap();
    assert!(namespaces_of(&run).is_empty());
    assert!(!p.is_running());
}

#[test]
fn sweep_removes_dead_runs_and_keeps_live_ones() {
    require_root();
    let live = Topology::new(1).expect("make 1 test host");
    // A fake run whose owner is dead: a pid file with a reaped child's pid, a namespace with a
    // process still inside.
    let mut dead = Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    let run = (0xfe00..=0xffff_u32)
        .map(|r| format!("{r:04x}"))
        .find(|r| {
            namespaces_of(r).is_empty() && !Path::new(&format!("/run/yard-tests/{r}.pid")).exists()
        })
        .expect("a free fake run id");
    std::fs::create_dir_all("/run/yard-tests").unwrap();
    std::fs::write(
        format!("/run/yard-tests/{run}.pid"),
        format!("{dead_pid}\n"),
    )
    .unwrap();
    let ns = format!("yd{run}-1");
    assert!(Command::new("ip")
        .args(["netns", "add", &ns])
        .status()
        .unwrap()
        .success());
    let mut orphan = Command::new("ip")
        .args(["netns", "exec", &ns, "sleep", "30"])
        .spawn()
        .unwrap();
    let bpffs = std::env::temp_dir().join(format!("yard-tests-{run}/bpffs-1"));
    std::fs::create_dir_all(&bpffs).unwrap();
    assert!(Command::new("mount")
        .args(["-t", "bpf", "bpf"])
        .arg(&bpffs)
        .status()
        .unwrap()
        .success());
    thread::sleep(Duration::from_millis(100));

    let removed = sweep_stale().expect("sweep");
    assert!(removed.contains(&ns), "swept {removed:?}");
    assert!(namespaces_of(&run).is_empty());
    assert!(!Path::new(&format!("/run/yard-tests/{run}.pid")).exists());
    let waited = wait_for(Duration::from_secs(5), || {
        matches!(orphan.try_wait(), Ok(Some(_)))
    });
    assert!(
        waited.is_some(),
        "the process inside the stale namespace is killed"
    );

    assert_eq!(
        namespaces_of(live.run_id()).len(),
        2,
        "a live run is left alone"
    );
}

#[test]
fn bpffs_is_per_host_outlives_processes_and_goes_with_the_topology() {
    require_root();
    let topo = Topology::new(2).expect("make 2 test hosts");
    let fs1 = topo.bpffs(1).expect("mount host 1's bpffs");
    assert_eq!(topo.bpffs(1).expect("second call"), fs1, "mounted once");
    let fs2 = topo.bpffs(2).expect("mount host 2's bpffs");
    assert_ne!(fs1, fs2);
    let mounted = |p: &Path| {
        std::fs::read_to_string("/proc/self/mounts")
            .unwrap()
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some(p.to_str().unwrap()))
    };
    assert!(mounted(&fs1) && mounted(&fs2));
    // A process inside the host sees it (the run directory is an ordinary path there).
    let out = topo
        .exec(1, "stat", &["-f", "-c", "%T", fs1.to_str().unwrap()])
        .expect("stat from inside host 1");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "bpf_fs");
    drop(topo);
    assert!(!mounted(&fs1) && !mounted(&fs2), "drop unmounts");
    assert!(!fs1.exists());
}
