//! Test hosts: one network namespace per host on a private bridge, and their cleanup.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::hash::{BuildHasher, Hash, Hasher};
use std::io::{ErrorKind, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rustix::process::{kill_process, test_kill_process, Pid, Signal};

use crate::cmd;
use crate::error::{io_err, Error, Result};
use crate::process::Process;

/// The most hosts a topology can have: each gets `198.18.0.<i>` and a bridge port `h<i>`.
pub const MAX_HOSTS: usize = 250;

/// Where each live run records its owner's pid, so a later run can tell leftovers of a killed
/// run from namespaces another live test is using. Under /run: it is tmpfs and gone on reboot,
/// as the namespaces are.
const PID_DIR: &str = "/run/yard-tests";

/// Where `ip netns add` mounts named namespaces.
const NETNS_DIR: &str = "/run/netns";

/// Set this to keep a run's logs and files after the topology is dropped.
const KEEP_LOGS_ENV: &str = "YARD_KEEP_LOGS";

/// Commands started with [`Topology::exec`] get this long unless told otherwise.
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(30);

/// A set of test hosts, each a network namespace with one interface `eth0` on a shared bridge.
///
/// Layout for run `<run>` (4 hex digits) and hosts `1..=n`:
/// - namespace `yd<run>-f` (the fabric) holds bridge `br0` and ports `h1..hn`;
/// - namespace `yd<run>-<i>` holds `lo` and `eth0` (`198.18.0.<i>/16`, MAC `02:59:44:00:00:<i>`,
///   TX checksum offload off, as the design asks of hosts that stand for real machines); there
///   is no default route, so nothing can leave the fabric.
///
/// Dropping the topology kills every process it started, deletes every namespace it made (which
/// removes the veths and any TC/nftables state with them) and removes its run directory unless
/// `YARD_KEEP_LOGS` is set. Drop also runs when a test panics; a run killed outright is cleaned
/// up by [`sweep_stale`], which every new topology calls first.
#[derive(Debug)]
pub struct Topology {
    run: String,
    hosts: usize,
    dir: PathBuf,
    pid_file: PathBuf,
    /// Namespaces made so far, so a half-built topology cleans up what it made.
    namespaces: Vec<String>,
    processes: Mutex<Vec<Process>>,
    /// Hosts whose bpffs is mounted, see [`Topology::bpffs`].
    bpffs: Mutex<BTreeSet<usize>>,
    /// Namespaces made after the hosts (tenants of an overlay), see
    /// [`Topology::add_namespace`]; removed on drop before the hosts.
    extra_namespaces: Mutex<Vec<String>>,
}

impl Topology {
    /// Builds `hosts` test hosts on a fresh bridge.
    ///
    /// Needs root; first sweeps away namespaces left by runs whose owner died.
    pub fn new(hosts: usize) -> Result<Self> {
        crate::check_root()?;
        if hosts == 0 || hosts > MAX_HOSTS {
            return Err(Error::HostCount {
                hosts,
                max: MAX_HOSTS,
            });
        }
        if let Err(e) = sweep_stale() {
            warn(&format!("could not sweep stale test namespaces: {e}"));
        }
        let (run, pid_file) = claim_run_id()?;
        let dir = std::env::temp_dir().join(format!("yard-tests-{run}"));
        let mut topo = Self {
            run,
            hosts,
            dir,
            pid_file,
            namespaces: Vec::new(),
            processes: Mutex::new(Vec::new()),
            bpffs: Mutex::new(BTreeSet::new()),
            extra_namespaces: Mutex::new(Vec::new()),
        };
        fs::create_dir_all(&topo.dir).map_err(io_err(format!(
            "create run directory {}",
            topo.dir.display()
        )))?;
        topo.build()?;
        Ok(topo)
    }

    /// Makes the namespaces, bridge and veths; on error, Drop removes what was made.
    fn build(&mut self) -> Result<()> {
        let fabric = self.fabric_ns();
        self.add_ns(&fabric)?;
        ip(&["-n", &fabric, "link", "set", "lo", "up"])?;
        ip(&["-n", &fabric, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &fabric, "link", "set", "br0", "up"])?;
        for i in 1..=self.hosts {
            let ns = self.ns_name(i);
            let port = format!("h{i}");
            self.add_ns(&ns)?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            // Made from the fabric side with the peer placed straight into the host, so no
            // interface ever exists in the root namespace.
            ip(&[
                "-n", &fabric, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                "netns", &ns,
            ])?;
            ip(&["-n", &fabric, "link", "set", &port, "master", "br0", "up"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "address", &mac(i)])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/16", host_addr(i)),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            cmd::run(
                "ip",
                &["netns", "exec", &ns, "ethtool", "-K", "eth0", "tx", "off"],
            )?;
        }
        let all: Vec<usize> = (1..=self.hosts).collect();
        self.wait_links_up(&all)
    }

    /// Waits until the given hosts' links carry traffic.
    ///
    /// A veth that was just set up drops what it is given until the kernel's link watcher has
    /// seen its carrier and attached its queueing discipline, which can take up to a second on
    /// a busy machine. A test's first packets would vanish in that window, so setup is not done
    /// until `eth0`, its bridge port and the bridge report operational state UP and the port is
    /// forwarding.
    pub(crate) fn wait_links_up(&self, hosts: &[usize]) -> Result<()> {
        const TIMEOUT: Duration = Duration::from_secs(10);
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let pending = self.link_not_up(hosts)?;
            match pending {
                None => return Ok(()),
                Some(what) if Instant::now() >= deadline => {
                    return Err(Error::LinkNotUp {
                        what,
                        timeout: TIMEOUT,
                    })
                }
                Some(_) => thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Names the first link among `hosts` that is not ready yet, if any.
    fn link_not_up(&self, hosts: &[usize]) -> Result<Option<String>> {
        let fabric = self.fabric_ns();
        let fabric_links = String::from_utf8_lossy(
            &cmd::run("ip", &["-n", &fabric, "-o", "link", "show"])?.stdout,
        )
        .into_owned();
        let ports =
            String::from_utf8_lossy(&cmd::run("bridge", &["-n", &fabric, "link", "show"])?.stdout)
                .into_owned();
        let line_of = |text: &str, needle: &str| -> Option<String> {
            text.lines().find(|l| l.contains(needle)).map(str::to_owned)
        };
        let up = |line: Option<String>| line.is_some_and(|l| l.contains("state UP"));
        if !up(line_of(&fabric_links, ": br0:")) {
            return Ok(Some(format!("br0 in {fabric}")));
        }
        for &i in hosts {
            let port = format!(": h{i}@");
            if !up(line_of(&fabric_links, &port)) {
                return Ok(Some(format!("h{i} in {fabric}")));
            }
            if !line_of(&ports, &port).is_some_and(|l| l.contains("state forwarding")) {
                return Ok(Some(format!("bridge port h{i} in {fabric}")));
            }
            let ns = self.ns_name(i);
            let eth0 = cmd::run("ip", &["-n", &ns, "-o", "link", "show", "dev", "eth0"])?;
            if !up(Some(String::from_utf8_lossy(&eth0.stdout).into_owned())) {
                return Ok(Some(format!("eth0 in {ns}")));
            }
        }
        Ok(None)
    }

    fn add_ns(&mut self, name: &str) -> Result<()> {
        ip(&["netns", "add", name])?;
        self.namespaces.push(name.to_owned());
        Ok(())
    }

    /// The 4-hex-digit id in every namespace name of this run.
    pub fn run_id(&self) -> &str {
        &self.run
    }

    /// How many hosts there are.
    pub fn hosts(&self) -> usize {
        self.hosts
    }

    /// The run directory: process logs and harness files; removed on drop unless
    /// `YARD_KEEP_LOGS` is set.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Host `i`'s address, `198.18.0.<i>`.
    ///
    /// # Panics
    /// When `i` is not a host of this topology (a bug in the test).
    pub fn addr(&self, i: usize) -> Ipv4Addr {
        self.assert_host(i);
        host_addr(i)
    }

    /// Host `i`'s `eth0` MAC address, `02:59:44:00:00:<i>` (locally administered, fixed so that
    /// tests and fault rules can name it).
    ///
    /// # Panics
    /// When `i` is not a host of this topology.
    pub fn mac(&self, i: usize) -> String {
        self.assert_host(i);
        mac(i)
    }

    /// Host `i`'s namespace name, `yd<run>-<i>`, for `ip netns exec` by hand.
    ///
    /// # Panics
    /// When `i` is not a host of this topology.
    pub fn ns_name(&self, i: usize) -> String {
        self.assert_host(i);
        format!("yd{}-{i}", self.run)
    }

    /// The fabric namespace, `yd<run>-f`, holding the bridge.
    pub fn fabric_ns(&self) -> String {
        format!("yd{}-f", self.run)
    }

    /// Every process started so far, running or not.
    pub fn processes(&self) -> Vec<Process> {
        self.lock_processes().clone()
    }

    /// Starts `program args` inside host `i`, with `envs` added to the environment and stdout
    /// and stderr appended to `<run dir>/<log_name>`; the working directory is the run
    /// directory.
    ///
    /// The topology keeps the process and kills it when dropped. Appending lets a node that is
    /// restarted under the same log name keep one log across its lives.
    pub fn spawn<S: AsRef<OsStr>>(
        &self,
        i: usize,
        program: impl AsRef<Path>,
        args: &[S],
        envs: &[(&str, &str)],
        log_name: &str,
    ) -> Result<Process> {
        self.check_host(i)?;
        let ns = self.ns_name(i);
        let program = program.as_ref();
        let log = self.dir.join(log_name);
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(io_err(format!("open log {}", log.display())))?;
        let mut line: Vec<&OsStr> = vec![program.as_os_str()];
        line.extend(args.iter().map(AsRef::as_ref));
        let described = cmd::describe(OsStr::new("ip netns exec"), &[OsStr::new(&ns)]);
        let _ = writeln!(
            file,
            "=== {described} {} (unix time {})",
            cmd::describe(line[0], &line[1..]),
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or_default()
        );
        let stderr = file
            .try_clone()
            .map_err(io_err(format!("open log {}", log.display())))?;
        let child = Command::new("ip")
            .args(["netns", "exec", &ns])
            .arg(program)
            .args(args)
            .envs(envs.iter().copied())
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(stderr)
            .spawn()
            .map_err(io_err(format!("start {} in host {i}", program.display())))?;
        let process = Process::new(child, i, log_name.to_owned(), log);
        self.lock_processes().push(process.clone());
        Ok(process)
    }

    /// Runs a short command inside host `i` and returns its output whatever its exit status
    /// (a non-zero exit is often what a test checks); killed after [`EXEC_TIMEOUT`].
    pub fn exec<S: AsRef<OsStr>>(
        &self,
        i: usize,
        program: impl AsRef<OsStr>,
        args: &[S],
    ) -> Result<Output> {
        self.exec_with(i, program, args, &[], EXEC_TIMEOUT)
    }

    /// [`Topology::exec`] with extra environment variables and a timeout of your choosing.
    pub fn exec_with<S: AsRef<OsStr>>(
        &self,
        i: usize,
        program: impl AsRef<OsStr>,
        args: &[S],
        envs: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<Output> {
        self.check_host(i)?;
        let ns = OsString::from(self.ns_name(i));
        let mut full: Vec<&OsStr> = vec![
            OsStr::new("netns"),
            OsStr::new("exec"),
            &ns,
            program.as_ref(),
        ];
        full.extend(args.iter().map(AsRef::as_ref));
        cmd::output(OsStr::new("ip"), &full, envs, None, timeout)
    }

    /// A bpffs private to host `i`, mounted at `<run dir>/bpffs-<i>` on first use, for the
    /// daemon's pinned programs and maps (pass it as the pin directory).
    ///
    /// `ip netns exec` gives each process a fresh /sys, so a bpffs the daemon mounted there
    /// itself would vanish with the process, and a restarted daemon would have nothing to
    /// re-adopt. This one lives in the root mount namespace until the topology is dropped,
    /// survives restarts of the host's processes, is visible to them (the run directory is an
    /// ordinary path) and is not shared with other hosts. Drop and [`sweep_stale`] unmount it,
    /// which frees whatever is pinned there.
    ///
    /// Call it before spawning the processes that use it: a process already running in the
    /// host may not see a mount made after it started.
    pub fn bpffs(&self, i: usize) -> Result<PathBuf> {
        self.check_host(i)?;
        let path = self.dir.join(format!("bpffs-{i}"));
        let mut mounted = self.bpffs.lock().unwrap_or_else(PoisonError::into_inner);
        if !mounted.contains(&i) {
            fs::create_dir_all(&path).map_err(io_err(format!("create {}", path.display())))?;
            let target = path.as_os_str();
            cmd::run(
                "mount",
                &[
                    OsStr::new("-t"),
                    OsStr::new("bpf"),
                    OsStr::new("bpf"),
                    target,
                ],
            )?;
            mounted.insert(i);
        }
        Ok(path)
    }

    /// Returns [`Error::NoSuchHost`] unless `i` is a host here.
    pub(crate) fn check_host(&self, i: usize) -> Result<()> {
        if (1..=self.hosts).contains(&i) {
            Ok(())
        } else {
            Err(Error::NoSuchHost {
                host: i,
                hosts: self.hosts,
            })
        }
    }

    fn assert_host(&self, i: usize) {
        if let Err(e) = self.check_host(i) {
            panic!("{e}");
        }
    }

    fn lock_processes(&self) -> std::sync::MutexGuard<'_, Vec<Process>> {
        self.processes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Topology {
    /// Best effort and panic-free: it also runs while a failed test unwinds.
    fn drop(&mut self) {
        let processes = std::mem::take(
            self.processes
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for p in &processes {
            p.force_kill();
        }
        let extra = std::mem::take(
            self.extra_namespaces
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for ns in extra.iter().rev() {
            remove_ns(ns);
        }
        for ns in self.namespaces.iter().rev() {
            remove_ns(ns);
        }
        unmount_under(&self.dir);
        let _ = fs::remove_file(&self.pid_file);
        if std::env::var_os(KEEP_LOGS_ENV).is_some() {
            warn(&format!(
                "logs of test run {} kept in {}",
                self.run,
                self.dir.display()
            ));
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// Removes namespaces `yd<run>-*` whose run's owner process is gone, and returns their names.
///
/// A test killed outright (SIGKILL, a CI timeout) never runs Drop; its namespaces, veths and
/// processes would otherwise stay until reboot. Processes still inside a stale namespace are
/// killed first, since a namespace lives on while any process is in it.
pub fn sweep_stale() -> Result<Vec<String>> {
    crate::check_root()?;
    let mut by_run: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for name in list_namespaces()? {
        if let Some(run) = parse_run(&name) {
            by_run.entry(run.to_owned()).or_default().push(name);
        }
    }
    let mut removed = Vec::new();
    for (run, names) in by_run {
        if owner_alive(&run) {
            continue;
        }
        for ns in names {
            remove_ns(&ns);
            removed.push(ns);
        }
        forget_run(&run);
    }
    // Pid files of dead owners that left no namespace (killed between claiming and building).
    if let Ok(entries) = fs::read_dir(PID_DIR) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if let Some(run) = name.strip_suffix(".pid") {
                if is_run_id(run) && !owner_alive(run) {
                    forget_run(run);
                }
            } else if let Some((_, pid)) = name.split_once(".pid.tmp-") {
                if pid.parse().map(|p| !pid_alive(p)).unwrap_or(true) {
                    let _ = fs::remove_file(entry.path());
                }
            }
        }
    }
    Ok(removed)
}

/// Picks an unused run id and records this process as its owner.
///
/// The pid file is written under a temporary name and hard-linked into place: the link fails if
/// the id is taken, so two runs cannot claim one id, and a sweeper never sees an empty pid file.
fn claim_run_id() -> Result<(String, PathBuf)> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    fs::create_dir_all(PID_DIR).map_err(io_err(format!("create {PID_DIR}")))?;
    let pid = std::process::id();
    let tmp = Path::new(PID_DIR).join(format!(
        "{}.pid.tmp-{pid}",
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let mut file = File::create(&tmp).map_err(io_err(format!("create {}", tmp.display())))?;
    writeln!(file, "{pid}").map_err(io_err(format!("write {}", tmp.display())))?;
    drop(file);
    const TRIES: usize = 64;
    let state = RandomState::new();
    let mut result = Err(Error::NoRunId(TRIES));
    for attempt in 0..TRIES {
        let mut h = state.build_hasher();
        (pid, attempt, COUNTER.fetch_add(1, Ordering::Relaxed)).hash(&mut h);
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
            .hash(&mut h);
        let run = format!("{:04x}", h.finish() & 0xffff);
        if Path::new(NETNS_DIR).join(format!("yd{run}-f")).exists() {
            continue;
        }
        let pid_file = Path::new(PID_DIR).join(format!("{run}.pid"));
        match fs::hard_link(&tmp, &pid_file) {
            Ok(()) => {
                result = Ok((run, pid_file));
                break;
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(e) => {
                result = Err(io_err(format!("create {}", pid_file.display()))(e));
                break;
            }
        }
    }
    let _ = fs::remove_file(&tmp);
    result
}

/// Whether the process recorded as the owner of `run` is alive; unknown owners are dead.
fn owner_alive(run: &str) -> bool {
    fs::read_to_string(Path::new(PID_DIR).join(format!("{run}.pid")))
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .is_some_and(pid_alive)
}

fn pid_alive(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return false;
    };
    match test_kill_process(pid) {
        Ok(()) => true,
        Err(e) => e != rustix::io::Errno::SRCH,
    }
}

/// Removes a dead run's pid file and (unless logs are kept) its run directory.
fn forget_run(run: &str) {
    let dir = std::env::temp_dir().join(format!("yard-tests-{run}"));
    unmount_under(&dir);
    let _ = fs::remove_file(Path::new(PID_DIR).join(format!("{run}.pid")));
    if std::env::var_os(KEEP_LOGS_ENV).is_none() {
        let _ = fs::remove_dir_all(dir);
    }
}

/// Unmounts every mount at or below `dir` (the hosts' bpffs), deepest first, which also frees
/// what is pinned in them; never fails, only warns.
fn unmount_under(dir: &Path) {
    let Ok(mounts) = fs::read_to_string("/proc/self/mounts") else {
        return;
    };
    let mut points: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|p| Path::new(p).starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in points {
        if let Err(e) = cmd::run("umount", &["-l", point]) {
            warn(&format!("could not unmount {point}: {e}"));
        }
    }
}

/// `yd<4 hex>-<host, f or tag>` → the run id; other namespaces (`ydlc-*` of the local cluster
/// script, anything else) are never touched. A tag (see [`Topology::add_namespace`]) is a
/// lowercase letter and digits, e.g. `t12`.
fn parse_run(ns: &str) -> Option<&str> {
    let rest = ns.strip_prefix("yd")?;
    let (run, host) = rest.split_once('-')?;
    let host_ok = host == "f"
        || (!host.is_empty() && host.bytes().all(|b| b.is_ascii_digit()))
        || is_extra_tag(host);
    (is_run_id(run) && host_ok).then_some(run)
}

/// A tag of an extra namespace: one lowercase letter, then one to four digits.
fn is_extra_tag(tag: &str) -> bool {
    let b = tag.as_bytes();
    (2..=5).contains(&b.len()) && b[0].is_ascii_lowercase() && b[1..].iter().all(u8::is_ascii_digit)
}

fn is_run_id(s: &str) -> bool {
    s.len() == 4 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn list_namespaces() -> Result<Vec<String>> {
    match fs::read_dir(NETNS_DIR) {
        Ok(entries) => Ok(entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io_err(format!("list {NETNS_DIR}"))(e)),
    }
}

/// Kills whatever still runs in `ns` and deletes it; never fails, only warns.
fn remove_ns(ns: &str) {
    if let Ok(out) = cmd::run("ip", &["netns", "pids", ns]) {
        for pid in String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
            .filter_map(Pid::from_raw)
        {
            let _ = kill_process(pid, Signal::CONT);
            let _ = kill_process(pid, Signal::KILL);
        }
    }
    if let Err(e) = cmd::run("ip", &["netns", "del", ns]) {
        if Path::new(NETNS_DIR).join(ns).exists() {
            warn(&format!("could not delete namespace {ns}: {e}"));
        }
    }
}

/// Writes a warning to stderr without the panic `eprintln!` could raise, since Drop calls it.
fn warn(msg: &str) {
    let _ = writeln!(std::io::stderr(), "yard-cluster-tests: {msg}");
}

fn ip(args: &[&str]) -> Result<Output> {
    cmd::run("ip", args)
}

fn host_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 0, u8::try_from(i).unwrap_or(0))
}

fn mac(i: usize) -> String {
    format!("02:59:44:00:00:{:02x}", i & 0xff)
}

impl Topology {
    /// Runs `f` on a new thread that lives in host `i`'s network namespace, so every socket it
    /// opens (a whole tokio runtime built inside `f`, say) sends from that host. `setns` changes
    /// only the calling thread, which is why this never touches the caller's own thread.
    pub fn thread_in_host<T, F>(&self, i: usize, f: F) -> Result<std::thread::JoinHandle<T>>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        self.check_host(i)?;
        thread_in_namespace(&self.ns_name(i), format!("host-{i}"), f)
    }

    /// Makes one more namespace of this run, `yd<run>-<tag>` (tag: a lowercase letter and one to
    /// four digits, e.g. `t3` for an overlay tenant), with `lo` up, and returns its name.
    ///
    /// It is removed on drop, before the hosts' namespaces, and by [`sweep_stale`] if the run is
    /// killed. Fails if the tag is malformed or the namespace exists.
    pub fn add_namespace(&self, tag: &str) -> Result<String> {
        if !is_extra_tag(tag) {
            return Err(Error::Setup(format!(
                "namespace tag {tag:?} is not a lowercase letter followed by 1-4 digits"
            )));
        }
        let name = format!("yd{}-{tag}", self.run);
        ip(&["netns", "add", &name])?;
        self.extra_namespaces
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(name.clone());
        ip(&["-n", &name, "link", "set", "lo", "up"])?;
        Ok(name)
    }

    /// Puts an emulated SmartNIC in front of host `i`'s `eth0` (yard_ebpf's `EmulatedNic`
    /// documents the design) and returns its (wire port, host port) names, which
    /// `[gateway] offload_wire` and `offload_port` take:
    ///
    /// ```text
    /// br0 ── h<i> ═══ nicw0 │ emulated NIC │ nicp0 ═══ eth0   (all but h<i> in host i)
    /// ```
    ///
    /// `eth0` keeps its address and MAC; until a daemon attaches the NIC's programs host `i` is
    /// cut off (nothing carries frames between `nicw0` and `nicp0`). GRO is turned on at the
    /// two ends that receive XDP redirects (`h<i>`, `eth0`): a veth accepts redirected frames
    /// only when it runs XDP itself or has NAPI through GRO.
    pub fn emulate_nic(&self, i: usize) -> Result<(String, String)> {
        self.check_host(i)?;
        let (fabric, ns, port) = (self.fabric_ns(), self.ns_name(i), format!("h{i}"));
        let (wire, host_port) = ("nicw0", "nicp0");
        ip(&["-n", &fabric, "link", "del", &port])?;
        ip(&[
            "-n", &fabric, "link", "add", &port, "type", "veth", "peer", "name", wire, "netns", &ns,
        ])?;
        ip(&["-n", &fabric, "link", "set", &port, "master", "br0", "up"])?;
        ip(&[
            "-n", &ns, "link", "add", host_port, "type", "veth", "peer", "name", "eth0",
        ])?;
        ip(&["-n", &ns, "link", "set", "eth0", "address", &mac(i)])?;
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{}/16", host_addr(i)),
            "dev",
            "eth0",
        ])?;
        for dev in [wire, host_port, "eth0"] {
            ip(&["-n", &ns, "link", "set", dev, "up"])?;
            cmd::run(
                "ip",
                &["netns", "exec", &ns, "ethtool", "-K", dev, "tx", "off"],
            )?;
        }
        cmd::run(
            "ip",
            &["netns", "exec", &ns, "ethtool", "-K", "eth0", "gro", "on"],
        )?;
        cmd::run(
            "ip",
            &[
                "netns", "exec", &fabric, "ethtool", "-K", &port, "gro", "on",
            ],
        )?;
        self.wait_links_up(&[i])?;
        Ok((wire.to_owned(), host_port.to_owned()))
    }

    /// The namespaces made with [`Topology::add_namespace`] so far.
    pub fn extra_namespaces(&self) -> Vec<String> {
        self.extra_namespaces
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Runs `f` on a new thread named `thread_name` that lives in the named network namespace
/// (`/run/netns/<ns>`): see [`Topology::thread_in_host`]. `setns` changes only the calling
/// thread, which is why this never touches the caller's own thread.
pub fn thread_in_namespace<T, F>(
    ns: &str,
    thread_name: String,
    f: F,
) -> Result<std::thread::JoinHandle<T>>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let path = PathBuf::from(NETNS_DIR).join(ns);
    let ns_file = std::fs::File::open(&path).map_err(io_err(format!("open {}", path.display())))?;
    std::thread::Builder::new()
        .name(thread_name)
        .spawn(move || {
            use std::os::fd::AsFd;
            if let Err(e) = rustix::thread::move_into_link_name_space(
                ns_file.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            ) {
                panic!("cannot enter the network namespace: {e}");
            }
            drop(ns_file);
            f()
        })
        .map_err(io_err(format!("start a thread in namespace {ns}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_only_test_run_namespaces() {
        assert_eq!(parse_run("yd1a2b-f"), Some("1a2b"));
        assert_eq!(parse_run("yd1a2b-12"), Some("1a2b"));
        assert_eq!(parse_run("ydlc-1"), None);
        assert_eq!(parse_run("ydlc-f"), None);
        assert_eq!(parse_run("yd1A2b-1"), None);
        assert_eq!(parse_run("yd1a2b-"), None);
        assert_eq!(parse_run("yd1a2b-x"), None);
        assert_eq!(parse_run("yd1a2b3-1"), None);
        assert_eq!(parse_run("other"), None);
        assert_eq!(parse_run("yd1a2b-t1"), Some("1a2b"));
        assert_eq!(parse_run("yd1a2b-t1234"), Some("1a2b"));
        assert_eq!(parse_run("yd1a2b-t"), None);
        assert_eq!(parse_run("yd1a2b-T1"), None);
        assert_eq!(parse_run("yd1a2b-t12345"), None);
        assert_eq!(parse_run("ydlc-t1"), None);
    }

    #[test]
    fn names_fit_interface_limits() {
        let longest = format!("ydffff-{MAX_HOSTS}");
        assert!(longest.len() <= 15);
        assert!(format!("h{MAX_HOSTS}").len() <= 15);
        assert_eq!(mac(10), "02:59:44:00:00:0a");
        assert_eq!(host_addr(7), Ipv4Addr::new(198, 18, 0, 7));
    }
}
