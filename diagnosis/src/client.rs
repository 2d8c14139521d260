//! The Rust probe client: what a training process links to report its collectives to the
//! `yard` node on its host, in the format specified in [`crate::wire`].
//!
//! The training loop must never wait for the node, and a system call per event would cost more
//! than the event (about 2 µs here), so frames are coalesced: an event is written at once when
//! nothing was written for [`FLUSH_INTERVAL`], otherwise it joins a buffer that the background
//! thread writes within that interval (or at once past [`FLUSH_BYTES`]). Writes never block: if
//! the node is absent, has died, or the buffer is at [`MAX_BUFFERED`], the event is dropped and
//! counted ([`ProbeClient::dropped`]) and the call returns. Only whole frames are ever dropped and
//! a partly written buffer is finished before anything else, so the stream never goes out of
//! step.
//! When the node comes back the client reconnects on its next send (at most every
//! [`RECONNECT_INTERVAL`]) and re-sends its HELLO and every GROUP before anything else.
//!
//! A background thread sends a HEARTBEAT every [`HEARTBEAT_INTERVAL`] so the node can tell a
//! rank that is busy computing from one that is dead; it stops when the client is dropped.

use crate::event::{Dir, Dtype, Op, Phase, Rank};
use crate::wire::{group_frames, Hello, Message};
use std::io::{ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The node's socket unless `YARD_PROBE_SOCKET` says otherwise.
pub const DEFAULT_SOCKET: &str = "/var/lib/yard/probe.sock";
/// How often the background thread sends a HEARTBEAT.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(100);
/// Least time between two connection attempts while the node is away.
pub const RECONNECT_INTERVAL: Duration = Duration::from_millis(100);
/// Longest an event waits in the client before it is written.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(1);
/// Buffered bytes that are written at once, without waiting for the interval.
pub const FLUSH_BYTES: usize = 32 * 1024;
/// Buffered bytes beyond which new events are dropped (the node is not reading).
pub const MAX_BUFFERED: usize = 256 * 1024;

/// The socket path clients use: `YARD_PROBE_SOCKET` if set and non-empty, else
/// [`DEFAULT_SOCKET`].
pub fn socket_path() -> PathBuf {
    match std::env::var_os("YARD_PROBE_SOCKET") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(DEFAULT_SOCKET),
    }
}

/// Now on `CLOCK_REALTIME`, in nanoseconds (0 if the clock is before 1970).
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A process group registered with [`ProbeClient::group`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupHandle(u32);

impl GroupHandle {
    /// The handle's wire value.
    pub fn id(self) -> u32 {
        self.0
    }
}

/// One collective call as the rank issued it; reported once per [`Phase`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollCall {
    pub group: GroupHandle,
    /// From [`ProbeClient::next_seq`] (collectives) or [`ProbeClient::next_p2p_seq`].
    pub seq: u64,
    pub op: Op,
    pub dtype: Dtype,
    pub count: u64,
    pub bytes: u64,
    /// The other rank of a send/recv (global rank).
    pub peer: Option<Rank>,
}

/// A connection (or the wish for one) to the node's probe socket. Cheap to share: every method
/// takes `&self`.
pub struct ProbeClient {
    shared: Arc<Shared>,
    heartbeat: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ProbeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeClient")
            .field("path", &self.shared.path)
            .field("dropped", &self.dropped())
            .finish()
    }
}

struct Shared {
    path: PathBuf,
    conn: Mutex<Conn>,
    dropped: AtomicU64,
    stop: Mutex<bool>,
    wake: Condvar,
    /// Frames are waiting for the background thread to write them.
    armed: std::sync::atomic::AtomicBool,
}

/// Everything a send touches, under one lock.
struct Conn {
    hello: Hello,
    stream: Option<UnixStream>,
    /// Whole frames not yet written (or the rest of a write the socket took only in part),
    /// in order; a reconnect starts it with HELLO and the GROUPs.
    backlog: Vec<u8>,
    /// When the backlog was last written out.
    last_flush: Instant,
    /// The GROUP frames to replay after a reconnect.
    groups: Vec<Message>,
    /// Next collective and p2p seq per group handle (index = handle).
    seqs: Vec<(u64, u64)>,
    last_attempt: Option<Instant>,
    /// Scratch buffer for encoding, reused so sending does not allocate.
    scratch: Vec<u8>,
    /// EXIT was queued: nothing may follow it, not even a heartbeat the background thread had
    /// already decided to send (the node would read the rank as alive again, then dead).
    exited: bool,
}

impl ProbeClient {
    /// Starts a client for the socket at `path` that introduces itself with `hello`. Never
    /// fails: if the node is not there yet, events are dropped until it is.
    pub fn connect(path: impl AsRef<Path>, hello: Hello) -> ProbeClient {
        let shared = Arc::new(Shared {
            path: path.as_ref().to_owned(),
            conn: Mutex::new(Conn {
                hello,
                stream: None,
                backlog: Vec::new(),
                groups: Vec::new(),
                seqs: Vec::new(),
                last_attempt: None,
                scratch: Vec::with_capacity(64),
                last_flush: Instant::now(),
                exited: false,
            }),
            dropped: AtomicU64::new(0),
            stop: Mutex::new(false),
            wake: Condvar::new(),
            armed: std::sync::atomic::AtomicBool::new(false),
        });
        shared.lock().ensure_connected(&shared.path);
        let beat = Arc::clone(&shared);
        let heartbeat = std::thread::Builder::new()
            .name("yard-probe-heartbeat".into())
            .spawn(move || beat.heartbeat_loop())
            .ok();
        ProbeClient { shared, heartbeat }
    }

    /// [`ProbeClient::connect`] to [`socket_path`].
    pub fn connect_default(hello: Hello) -> ProbeClient {
        ProbeClient::connect(socket_path(), hello)
    }

    /// Registers a process group (PyTorch's pg name and desc, members' global ranks in
    /// group-rank order). The group is announced now if connected and after every reconnect.
    pub fn group(&self, name: &str, desc: &str, ranks: &[Rank]) -> GroupHandle {
        let mut conn = self.shared.lock();
        let handle = conn.seqs.len() as u32;
        conn.seqs.push((1, 1));
        let frames = group_frames(handle, name, desc, ranks);
        if conn.stream.is_some() {
            for f in &frames {
                f.encode(&mut conn.backlog);
            }
            conn.flush_backlog();
        }
        conn.groups.extend(frames);
        GroupHandle(handle)
    }

    /// The next collective sequence number of `group` on this rank, starting at 1 (Flight
    /// Recorder's `collective_seq_id`).
    pub fn next_seq(&self, group: GroupHandle) -> u64 {
        self.take_seq(group, |s| &mut s.0)
    }

    /// The next send/recv sequence number of `group` (Flight Recorder's `p2p_seq_id`).
    pub fn next_p2p_seq(&self, group: GroupHandle) -> u64 {
        self.take_seq(group, |s| &mut s.1)
    }

    fn take_seq(&self, group: GroupHandle, pick: fn(&mut (u64, u64)) -> &mut u64) -> u64 {
        let mut conn = self.shared.lock();
        match conn.seqs.get_mut(group.0 as usize) {
            Some(s) => {
                let slot = pick(s);
                let seq = *slot;
                *slot += 1;
                seq
            }
            None => 0,
        }
    }

    /// Reports one phase of a collective, stamped now.
    pub fn coll(&self, call: &CollCall, phase: Phase) {
        self.send(&Message::Coll {
            handle: call.group.0,
            seq: call.seq,
            op: call.op,
            dtype: call.dtype,
            phase,
            peer: call.peer,
            count: call.count,
            bytes: call.bytes,
            t_ns: now_ns(),
        });
    }

    /// Reports cumulative progress with one peer inside the op `seq` of `group`, stamped now.
    pub fn peer(
        &self,
        group: GroupHandle,
        seq: u64,
        peer: Rank,
        dir: Dir,
        bytes: u64,
        busy_ns: u64,
    ) {
        self.send(&Message::Peer {
            handle: group.0,
            seq,
            peer,
            dir,
            bytes,
            busy_ns,
            t_ns: now_ns(),
        });
    }

    /// Sends a HEARTBEAT now (the background thread does this every 100 ms anyway).
    pub fn heartbeat(&self) {
        self.send(&Message::Heartbeat { t_ns: now_ns() });
    }

    /// Says goodbye: silence after this is a clean exit, not a dead rank.
    pub fn exit(&self) {
        self.stop_heartbeat();
        self.send(&Message::Exit { t_ns: now_ns() });
        let mut conn = self.shared.lock();
        conn.exited = true;
        conn.flush_backlog();
    }

    /// Events dropped so far because the node was away or not reading.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// Whether the client currently holds a connection to the node.
    pub fn is_connected(&self) -> bool {
        self.shared.lock().stream.is_some()
    }

    fn send(&self, msg: &Message) {
        self.shared.send(msg);
    }

    fn stop_heartbeat(&self) {
        if let Ok(mut stop) = self.shared.stop.lock() {
            *stop = true;
        }
        self.shared.wake.notify_all();
    }
}

impl Drop for ProbeClient {
    fn drop(&mut self) {
        self.stop_heartbeat();
        if let Some(t) = self.heartbeat.take() {
            let _ = t.join();
        }
    }
}

impl Shared {
    /// The connection state. A panic while holding the lock cannot leave it inconsistent in a
    /// way that matters (worst case a frame is lost), so a poisoned lock is taken over.
    fn lock(&self) -> MutexGuard<'_, Conn> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn send(&self, msg: &Message) {
        let (sent, waiting) = {
            let mut conn = self.lock();
            let sent = conn.send(&self.path, msg);
            (sent, !conn.backlog.is_empty())
        };
        if !sent {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        // Wake the background thread once per batch, under its lock so the wake is not lost.
        if waiting && !self.armed.swap(true, Ordering::AcqRel) {
            let _guard = self.stop.lock().unwrap_or_else(|p| p.into_inner());
            self.wake.notify_all();
        }
    }

    /// Writes batched frames within [`FLUSH_INTERVAL`] and sends a HEARTBEAT every
    /// [`HEARTBEAT_INTERVAL`], until stopped.
    fn heartbeat_loop(&self) {
        let mut next_beat = Instant::now() + HEARTBEAT_INTERVAL;
        let mut stop = self.stop.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let timeout = if self.armed.load(Ordering::Acquire) {
                FLUSH_INTERVAL
            } else {
                next_beat.saturating_duration_since(Instant::now())
            };
            let (guard, _) = self
                .wake
                .wait_timeout(stop, timeout)
                .unwrap_or_else(|p| p.into_inner());
            stop = guard;
            if *stop {
                drop(stop);
                self.lock().flush_backlog();
                return;
            }
            drop(stop);
            if self.armed.load(Ordering::Acquire) {
                // Let the batch fill for one interval, then write it.
                std::thread::sleep(FLUSH_INTERVAL);
                let mut conn = self.lock();
                conn.flush_backlog();
                conn.last_flush = Instant::now();
                if conn.backlog.is_empty() {
                    self.armed.store(false, Ordering::Release);
                }
            }
            if Instant::now() >= next_beat {
                self.send(&Message::Heartbeat { t_ns: now_ns() });
                next_beat = Instant::now() + HEARTBEAT_INTERVAL;
            }
            stop = self.stop.lock().unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl Conn {
    /// Queues one frame and writes the queue if it is due; false if the frame was dropped.
    fn send(&mut self, path: &Path, msg: &Message) -> bool {
        if self.exited || !self.ensure_connected(path) {
            return false;
        }
        let mut frame = std::mem::take(&mut self.scratch);
        frame.clear();
        msg.encode(&mut frame);
        if self.backlog.len() + frame.len() > MAX_BUFFERED {
            self.flush_backlog();
        }
        let queued = self.backlog.len() + frame.len() <= MAX_BUFFERED && self.stream.is_some();
        if queued {
            self.backlog.extend_from_slice(&frame);
        }
        self.scratch = frame;
        if self.backlog.len() >= FLUSH_BYTES || self.last_flush.elapsed() >= FLUSH_INTERVAL {
            self.flush_backlog();
            self.last_flush = Instant::now();
        }
        queued
    }

    /// Connects (rate-limited) if not connected, queueing HELLO and the GROUPs first.
    fn ensure_connected(&mut self, path: &Path) -> bool {
        if self.stream.is_some() {
            return true;
        }
        let now = Instant::now();
        if self
            .last_attempt
            .is_some_and(|t| now.duration_since(t) < RECONNECT_INTERVAL)
        {
            return false;
        }
        self.last_attempt = Some(now);
        let Ok(stream) = UnixStream::connect(path) else {
            return false;
        };
        if stream.set_nonblocking(true).is_err() {
            return false;
        }
        self.stream = Some(stream);
        self.backlog.clear();
        Message::Hello(self.hello.clone()).encode(&mut self.backlog);
        for g in &self.groups {
            g.encode(&mut self.backlog);
        }
        true
    }

    /// Writes as much of the backlog as the socket takes; true once it is empty.
    fn flush_backlog(&mut self) -> bool {
        while !self.backlog.is_empty() {
            let Some(stream) = self.stream.as_mut() else {
                return false;
            };
            match stream.write(&self.backlog) {
                Ok(0) => return self.disconnect(),
                Ok(n) => {
                    self.backlog.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
                Err(_) => return self.disconnect(),
            }
        }
        true
    }

    /// Forgets a dead connection; always false so callers can return it as "not sent".
    fn disconnect(&mut self) -> bool {
        self.stream = None;
        self.backlog.clear();
        false
    }
}
