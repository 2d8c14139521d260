//! The ranks' side door: a Unix stream socket where local training processes (the Python
//! package, the Rust client, the NCCL profiler plugin) send their events in the wire format of
//! [`yard_diagnosis::wire`].
//!
//! Each connection decodes on the node's tokio runtime and pushes a whole read's worth of
//! events into the shared core under one lock, so the per-event cost stays a decode and a push.
//! A bad frame closes that connection with one logged sentence; the node and every other
//! connection carry on.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::io::AsyncReadExt;
use tokio::net::{UnixListener, UnixStream};
use yard_diagnosis::event::Event;
use yard_diagnosis::wire::{Decoder, Session};

use super::core::{ProbeCore, ProbeStats};

/// Bytes read from a connection at a time.
const READ_CHUNK: usize = 64 * 1024;

/// What the socket tasks and the actor share.
#[derive(Debug)]
pub struct ProbeShared {
    pub core: ProbeCore,
    /// Connections open now.
    pub connections: usize,
    /// Connections closed for a protocol error.
    pub protocol_errors: u64,
    /// Ports ranks announced, for the eBPF counters.
    pub ports: BTreeSet<u16>,
    /// Jobs with ranks connected now, and how many ranks each.
    pub jobs: std::collections::BTreeMap<String, usize>,
}

/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct SharedProbe(Arc<Mutex<ProbeShared>>);

/// Counters for metrics and health.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeSnapshot {
    pub stats: ProbeStats,
    pub connections: usize,
    pub protocol_errors: u64,
    pub jobs: usize,
}

impl SharedProbe {
    pub fn new(capacity: usize) -> Self {
        SharedProbe(Arc::new(Mutex::new(ProbeShared {
            core: ProbeCore::new(capacity),
            connections: 0,
            protocol_errors: 0,
            ports: BTreeSet::new(),
            jobs: Default::default(),
        })))
    }

    pub fn lock(&self) -> MutexGuard<'_, ProbeShared> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn snapshot(&self) -> ProbeSnapshot {
        let s = self.lock();
        ProbeSnapshot {
            stats: s.core.stats(),
            connections: s.connections,
            protocol_errors: s.protocol_errors,
            jobs: s.jobs.len(),
        }
    }
}

/// Where this node is, for the `Member` events its ranks produce.
#[derive(Debug, Clone)]
pub struct NodeIdentity {
    pub name: String,
    /// Underlay IP address (no port).
    pub addr: String,
}

/// Who may connect to the probe socket. Connecting to a Unix socket needs write permission on
/// it, and whoever connects can report events for any job (and so raise verdicts and alerts),
/// so by default only the daemon's user and the socket's group may: put the training users in
/// that group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketAccess {
    /// Permission bits (at most 0o777).
    pub mode: u32,
    /// The group that owns the socket; `None`: the daemon's own group.
    pub group: Option<u32>,
}

/// The default socket mode: read and write for the daemon's user and the socket's group.
pub const DEFAULT_SOCKET_MODE: u32 = 0o660;

impl Default for SocketAccess {
    fn default() -> Self {
        SocketAccess {
            mode: DEFAULT_SOCKET_MODE,
            group: None,
        }
    }
}

/// Binds the socket at `path`, replacing a stale one left by a previous daemon, and gives it
/// `access`'s mode and group.
pub fn bind(path: &Path, access: SocketAccess) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    // The group first: until the mode is set the socket has the umask's bits, and once it is,
    // only the intended group may connect.
    if let Some(gid) = access.group {
        std::os::unix::fs::chown(path, None, Some(gid))?;
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(access.mode & 0o777))?;
    Ok(listener)
}

/// Why a socket group could not be used.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    #[error("no group named {0} on this host")]
    Unknown(String),
    #[error("cannot look up group {name}: {source}")]
    Lookup {
        name: String,
        source: std::io::Error,
    },
}

/// The gid of `group`: a group name (looked up through the system's group database, so
/// directory-service groups work too) or a numeric gid.
pub fn resolve_group(group: &str) -> Result<u32, GroupError> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    match sys::group_id(group) {
        Ok(Some(gid)) => Ok(gid),
        Ok(None) => Err(GroupError::Unknown(group.to_owned())),
        Err(source) => Err(GroupError::Lookup {
            name: group.to_owned(),
            source,
        }),
    }
}

// std has no group lookup; getgrnam_r is the reentrant libc call. The unsafe block says why it
// is sound.
#[allow(unsafe_code)]
mod sys {
    use std::ffi::CString;
    use std::io;

    /// Largest buffer offered to getgrnam_r (a group with very many members needs a big one).
    const MAX_BUF: usize = 1 << 20;

    pub fn group_id(name: &str) -> io::Result<Option<u32>> {
        let cname = CString::new(name).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "group name contains a nul byte",
            )
        })?;
        let mut buf: Vec<libc::c_char> = vec![0; 4096];
        loop {
            // SAFETY: `group` is plain old data (integers and pointers), for which all-zero is
            // a valid value.
            let mut grp: libc::group = unsafe { std::mem::zeroed() };
            let mut found: *mut libc::group = std::ptr::null_mut();
            // SAFETY: `cname` is nul-terminated, `buf.len()` is the buffer's true length, and
            // `grp` and `found` are valid for writes. getgrnam_r points `grp`'s strings into
            // `buf`; only `gr_gid`, an integer, is read afterwards.
            let rc = unsafe {
                libc::getgrnam_r(
                    cname.as_ptr(),
                    &mut grp,
                    buf.as_mut_ptr(),
                    buf.len(),
                    &mut found,
                )
            };
            match rc {
                0 if found.is_null() => return Ok(None),
                0 => return Ok(Some(grp.gr_gid)),
                libc::ERANGE if buf.len() < MAX_BUF => buf.resize(buf.len() * 2, 0),
                // "Not found" spellings some C libraries use instead of a null result.
                libc::ENOENT | libc::ESRCH | libc::EBADF | libc::EPERM => return Ok(None),
                rc => return Err(io::Error::from_raw_os_error(rc)),
            }
        }
    }
}

/// Accepts connections until the listener fails.
pub async fn serve(listener: UnixListener, shared: SharedProbe, node: NodeIdentity) {
    let path: Option<PathBuf> = listener
        .local_addr()
        .ok()
        .and_then(|a| a.as_pathname().map(Path::to_owned));
    tracing::info!(socket = ?path, "probe socket listening");
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let (shared, node) = (shared.clone(), node.clone());
                tokio::spawn(async move { connection(stream, shared, node).await });
            }
            Err(e) => {
                tracing::warn!(error = %e, "probe socket accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

async fn connection(mut stream: UnixStream, shared: SharedProbe, node: NodeIdentity) {
    shared.lock().connections += 1;
    let mut decoder = Decoder::new();
    let mut session = Session::new(&node.name, &node.addr);
    let mut buf = vec![0u8; READ_CHUNK];
    let mut events: Vec<Event> = Vec::with_capacity(1024);
    let mut job: Option<String> = None;
    let outcome = loop {
        let n = match stream.read(&mut buf).await {
            Ok(0) => break Ok(()),
            Ok(n) => n,
            Err(e) => break Err(format!("read failed: {e}")),
        };
        decoder.feed(&buf[..n]);
        let mut failed = None;
        loop {
            match decoder.next_message() {
                Ok(Some(msg)) => match session.accept(msg) {
                    Ok(Some(ev)) => events.push(ev),
                    Ok(None) => {}
                    Err(e) => {
                        failed = Some(e.to_string());
                        break;
                    }
                },
                Ok(None) => break,
                Err(e) => {
                    failed = Some(e.to_string());
                    break;
                }
            }
        }
        if job.is_none() {
            if let Some(j) = session.job() {
                job = Some(j.to_owned());
                let mut s = shared.lock();
                *s.jobs.entry(j.to_owned()).or_default() += 1;
                s.ports.extend(session.ports().iter().copied());
                tracing::info!(job = j, rank = ?session.rank(), ports = ?session.ports(), "probe client connected");
            }
        }
        if let Some(j) = &job {
            if !events.is_empty() {
                let mut s = shared.lock();
                for ev in events.drain(..) {
                    s.core.push(j, ev);
                }
            }
        }
        if let Some(e) = failed {
            break Err(e);
        }
    };
    let mut s = shared.lock();
    s.connections -= 1;
    if let Some(j) = &job {
        if let Some(n) = s.jobs.get_mut(j) {
            *n -= 1;
            if *n == 0 {
                s.jobs.remove(j);
            }
        }
    }
    match outcome {
        Ok(()) => tracing::debug!(job = ?job, rank = ?session.rank(), "probe client disconnected"),
        Err(e) => {
            s.protocol_errors += 1;
            tracing::warn!(job = ?job, rank = ?session.rank(), error = %e, "probe client refused; connection closed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use yard_diagnosis::event::{Dtype, Op, Phase};
    use yard_diagnosis::wire::{Hello, Message};

    fn frames(msgs: &[Message]) -> Vec<u8> {
        let mut out = Vec::new();
        for m in msgs {
            m.encode(&mut out);
        }
        out
    }

    fn hello(rank: u32) -> Message {
        Message::Hello(Hello {
            rank,
            world_size: 4,
            local_rank: rank,
            pid: 42,
            job: "j".into(),
            host: String::new(),
            nic: String::new(),
            switch: String::new(),
            ports: vec![29500],
        })
    }

    async fn wait_for(
        shared: &SharedProbe,
        what: impl Fn(&ProbeSnapshot) -> bool,
    ) -> ProbeSnapshot {
        for _ in 0..200 {
            let s = shared.snapshot();
            if what(&s) {
                return s;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        shared.snapshot()
    }

    /// Issue 10: the socket was 0666, so any local user could report events for any job.
    #[tokio::test]
    async fn the_socket_is_for_its_user_and_group_only_by_default() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("probe.sock");
        let _listener = bind(&path, SocketAccess::default()).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o660);

        // Another group and mode. Only root may give a file to a group it is not in; others
        // use their own group, which still checks the call.
        let mine = std::fs::metadata(dir.path()).unwrap();
        let gid = if mine.uid() == 0 { 4242 } else { mine.gid() };
        let path = dir.path().join("other.sock");
        let _listener = bind(
            &path,
            SocketAccess {
                mode: 0o640,
                group: Some(gid),
            },
        )
        .unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
        assert_eq!(meta.gid(), gid);
    }

    #[test]
    fn groups_resolve_by_name_or_number() {
        assert_eq!(resolve_group("root").unwrap(), 0);
        assert_eq!(resolve_group("4242").unwrap(), 4242);
        assert_eq!(
            resolve_group("no-such-group-yard").unwrap_err().to_string(),
            "no group named no-such-group-yard on this host"
        );
    }

    #[tokio::test]
    async fn events_arrive_and_a_bad_frame_closes_only_its_connection() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("probe.sock");
        let shared = SharedProbe::new(1000);
        let listener = bind(&path, SocketAccess::default()).unwrap();
        let node = NodeIdentity {
            name: "n1".into(),
            addr: "198.18.0.1".into(),
        };
        tokio::spawn(serve(listener, shared.clone(), node));

        let mut good = UnixStream::connect(&path).await.unwrap();
        let coll = Message::Coll {
            handle: 1,
            seq: 1,
            op: Op::AllReduce,
            dtype: Dtype::Float32,
            phase: Phase::Enqueue,
            peer: None,
            count: 4,
            bytes: 16,
            t_ns: 5,
        };
        let mut msgs = vec![hello(0)];
        msgs.extend(yard_diagnosis::wire::group_frames(1, "0", "", &[0, 1]));
        msgs.push(coll);
        good.write_all(&frames(&msgs)).await.unwrap();

        let mut bad = UnixStream::connect(&path).await.unwrap();
        bad.write_all(&frames(&[hello(1)])).await.unwrap();
        bad.write_all(&[0xff, 0xff, 0xff, 0x7f, 1, 2, 3])
            .await
            .unwrap();

        let s = wait_for(&shared, |s| s.protocol_errors == 1 && s.stats.accepted >= 4).await;
        assert_eq!(s.protocol_errors, 1, "{s:?}");
        assert_eq!(s.connections, 1, "the good connection stays open");
        assert_eq!(s.jobs, 1);
        let batches = shared.lock().core.drain(usize::MAX);
        let events = &batches[0].events;
        assert!(
            matches!(&events[0], Event::Member(m) if m.rank == 0 && m.host == "n1" && m.addr == "198.18.0.1")
        );
        assert!(events
            .iter()
            .any(|e| matches!(e, Event::Coll(c) if c.seq == 1 && &*c.pg == "0")));
        assert_eq!(
            shared.lock().ports.iter().copied().collect::<Vec<_>>(),
            vec![29500]
        );

        // The node still takes new connections.
        let mut again = UnixStream::connect(&path).await.unwrap();
        again.write_all(&frames(&[hello(2)])).await.unwrap();
        let s = wait_for(&shared, |s| s.connections == 2).await;
        assert_eq!(s.connections, 2);
    }
}
