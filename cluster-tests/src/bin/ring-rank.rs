//! `ring-rank`: one rank of a small training job with no GPU, for the probe's namespace tests.
//!
//! It does what a data-parallel rank does between its compute steps: a real ring all-reduce of
//! an f32 buffer over TCP with its neighbours (rank r sends to r+1 and receives from r−1;
//! reduce-scatter then all-gather, 2(n−1) steps of one n-th of the buffer each), adding the
//! floats and checking the sum after every collective. It reports each all-reduce to the local
//! `yard` node through the Rust probe client exactly as a real training process would: COLL
//! enqueue/start/end, and PEER progress with its two neighbours.
//!
//! How PEER times are measured matters, because the analyzer names a slow link by comparing
//! each pair's throughput (bytes over time spent) with its own history:
//! - **send**: time spent inside the send calls, which block only when the path to r+1 (or
//!   r+1 itself) does not take the data;
//! - **recv**: time from the first byte of a chunk from r−1 to its last. Time spent waiting
//!   for the chunk to *begin* is excluded: in a ring everyone waits for the slowest link
//!   upstream, so counting it would make every pair look as slow as the worst one.
//!
//! A receiver thread drains the connection from r−1 continuously and a sender thread writes to
//! r+1, so sending and receiving overlap and the ring cannot deadlock whatever the socket
//! buffer sizes. SIGTERM ends the rank cleanly (the probe gets EXIT); a wrong sum, a peer that
//! disappears while the job is not being stopped, or a bad argument ends it with status 1 and
//! one sentence on stderr.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::ops::Range;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use clap::Parser;
use yard_cluster_tests::ring::progress_line;
use yard_diagnosis::client::{CollCall, GroupHandle, ProbeClient};
use yard_diagnosis::event::{Dir, Dtype, Op, Phase, Rank};
use yard_diagnosis::wire::Hello;

/// How often the main thread looks at the SIGTERM flag while it waits on a peer.
const POLL: Duration = Duration::from_millis(50);
/// A peer that hangs up may be going down with the whole job: wait this long for our own
/// SIGTERM before calling it a failure.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// Largest chunk a peer may announce (a corrupt header must not allocate gigabytes).
const MAX_CHUNK_BYTES: usize = 1 << 30;
/// How often the rank prints its progress line.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Parser)]
#[command(about = "one rank of a ring all-reduce job that reports to the local yard probe")]
struct Args {
    /// The job's name, as the probe and `yard diagnose --job` know it.
    #[arg(long)]
    job: String,
    /// This rank (0-based).
    #[arg(long)]
    rank: Rank,
    /// How many ranks the job has.
    #[arg(long)]
    world: u32,
    /// Every rank's address, in rank order (comma-separated IP:PORT).
    #[arg(long, value_delimiter = ',', required = true)]
    peers: Vec<SocketAddrV4>,
    /// Where this rank listens for its predecessor.
    #[arg(long)]
    listen: SocketAddrV4,
    /// The yard node's probe socket.
    #[arg(long)]
    socket: PathBuf,
    /// Buffer size of each all-reduce in bytes (f32 elements × 4).
    #[arg(long, default_value_t = 1 << 20)]
    bytes: u64,
    /// Simulated compute between two all-reduces, in milliseconds.
    #[arg(long, default_value_t = 20)]
    compute_ms: u64,
    /// Stop after this many all-reduces.
    #[arg(long, conflicts_with = "seconds")]
    iters: Option<u64>,
    /// Stop after this many seconds (without --iters or --seconds: run until SIGTERM).
    #[arg(long)]
    seconds: Option<f64>,
    /// The NIC name reported to the probe (e.g. "eth0"); empty if unknown.
    #[arg(long, default_value = "")]
    nic: String,
    /// How long to keep trying to reach the neighbours at start-up, in seconds.
    #[arg(long, default_value_t = 30)]
    connect_timeout_s: u64,
}

/// Why a rank stopped with a failure.
#[derive(Debug, thiserror::Error)]
enum RankError {
    #[error("{0}")]
    Args(String),
    #[error("address {0} is neither loopback nor in 198.18.0.0/15, the test network")]
    Address(Ipv4Addr),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddrV4,
        source: io::Error,
    },
    #[error("rank {peer} at {addr} did not accept a connection within {timeout:?}")]
    ConnectTimeout {
        peer: Rank,
        addr: SocketAddrV4,
        timeout: Duration,
    },
    #[error("rank {peer} did not connect to {listen} within {timeout:?}")]
    AcceptTimeout {
        peer: Rank,
        listen: SocketAddrV4,
        timeout: Duration,
    },
    #[error("a connection to {listen} introduced itself as rank {got}, not rank {want}")]
    WrongPeer {
        listen: SocketAddrV4,
        got: Rank,
        want: Rank,
    },
    #[error("could not {what}: {source}")]
    Io { what: String, source: io::Error },
    #[error("the connection with rank {peer} failed during all-reduce #{seq}: {source}")]
    Peer {
        peer: Rank,
        seq: u64,
        source: io::Error,
    },
    #[error("rank {peer} sent a chunk of {got} bytes in all-reduce #{seq} where {want} were due")]
    ChunkSize {
        peer: Rank,
        seq: u64,
        got: usize,
        want: usize,
    },
    #[error("all-reduce #{seq} gave {got} at element {index} where {want} was expected")]
    WrongSum {
        seq: u64,
        index: usize,
        got: f32,
        want: f32,
    },
    #[error("cannot install the SIGTERM handler: {0}")]
    Signal(io::Error),
}

/// What can end an all-reduce early.
#[derive(Debug)]
enum Stop {
    /// SIGTERM: the job is being stopped, not failing.
    Term,
    Fail(RankError),
}

impl From<RankError> for Stop {
    fn from(e: RankError) -> Self {
        Stop::Fail(e)
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let rank = args.rank;
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ring-rank {rank}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<(), RankError> {
    let layout = Layout::check(&args)?;
    let term = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&term))
        .map_err(RankError::Signal)?;

    let client = ProbeClient::connect(
        &args.socket,
        Hello {
            rank: args.rank,
            world_size: args.world,
            local_rank: 0,
            pid: std::process::id(),
            job: args.job.clone(),
            host: String::new(),
            nic: args.nic.clone(),
            switch: String::new(),
            ports: vec![args.listen.port()],
        },
    );
    let all: Vec<Rank> = (0..args.world).collect();
    let group = client.group("0", "default_pg", &all);

    let timeout = Duration::from_secs(args.connect_timeout_s);
    let ring = match Ring::connect(&layout, &args.peers, args.listen, timeout, &term) {
        Ok(ring) => ring,
        // Stopped before the job began: nothing failed.
        Err(_) if term.load(Ordering::Relaxed) => {
            client.exit();
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    println!(
        "rank {} of {}: connected to rank {} and rank {}",
        args.rank, args.world, layout.next, layout.prev
    );

    let deadline = args
        .seconds
        .map(|s| Instant::now() + Duration::from_secs_f64(s.max(0.0)));
    let mut buf = vec![0f32; layout.count];
    let mut stats = Progress::default();
    let outcome = loop {
        if term.load(Ordering::Relaxed)
            || args.iters.is_some_and(|k| stats.done >= k)
            || deadline.is_some_and(|d| Instant::now() >= d)
        {
            break Ok(());
        }
        thread::sleep(Duration::from_millis(args.compute_ms));
        match one_all_reduce(&client, group, &ring, &layout, &mut buf, &term) {
            Ok(took) => stats.record(took),
            Err(Stop::Term) => break Ok(()),
            Err(Stop::Fail(e)) => break Err(e),
        }
    };
    // A neighbour that hung up because the whole job is being stopped is not a failure; give
    // our own SIGTERM a moment to arrive before saying otherwise.
    let outcome = match outcome {
        Err(e @ RankError::Peer { .. }) if !wait_for(&term, SHUTDOWN_GRACE) => Err(e),
        Err(RankError::Peer { .. }) => Ok(()),
        other => other,
    };
    if outcome.is_ok() {
        client.exit();
    }
    println!("{}", progress_line(stats.done, stats.mean_ms(), "exiting"));
    outcome
}

/// Waits up to `grace` for `flag`; whether it was set.
fn wait_for(flag: &AtomicBool, grace: Duration) -> bool {
    let end = Instant::now() + grace;
    while Instant::now() < end {
        if flag.load(Ordering::Relaxed) {
            return true;
        }
        thread::sleep(POLL);
    }
    flag.load(Ordering::Relaxed)
}

/// Completed all-reduces and the timings printed about them.
#[derive(Debug)]
struct Progress {
    done: u64,
    window: Vec<Duration>,
    last_print: Instant,
    /// The mean printed last, for a line with no new all-reduce since.
    last_mean_ms: f64,
}

impl Default for Progress {
    fn default() -> Self {
        Self {
            done: 0,
            window: Vec::new(),
            last_print: Instant::now(),
            last_mean_ms: 0.0,
        }
    }
}

impl Progress {
    fn record(&mut self, took: Duration) {
        self.done += 1;
        self.window.push(took);
        if self.last_print.elapsed() >= PROGRESS_EVERY {
            self.last_mean_ms = self.mean_ms();
            println!("{}", progress_line(self.done, self.last_mean_ms, "running"));
            self.window.clear();
            self.last_print = Instant::now();
        }
    }

    /// Mean time of the all-reduces since the last progress line (or the one it printed, if
    /// none finished since), in ms.
    fn mean_ms(&self) -> f64 {
        if self.window.is_empty() {
            return self.last_mean_ms;
        }
        let total: Duration = self.window.iter().sum();
        total.as_secs_f64() * 1e3 / self.window.len() as f64
    }
}

/// One all-reduce with its probe reports; returns how long the collective took.
fn one_all_reduce(
    client: &ProbeClient,
    group: GroupHandle,
    ring: &Ring,
    layout: &Layout,
    buf: &mut [f32],
    term: &AtomicBool,
) -> Result<Duration, Stop> {
    let seq = client.next_seq(group);
    fill(buf, layout.rank, seq);
    let call = CollCall {
        group,
        seq,
        op: Op::AllReduce,
        dtype: Dtype::Float32,
        count: layout.count as u64,
        bytes: layout.count as u64 * 4,
        peer: None,
    };
    let began = Instant::now();
    client.coll(&call, Phase::Enqueue);
    ring.all_reduce(buf, seq, term, &mut |event| match event {
        RingEvent::FirstSend => client.coll(&call, Phase::Start),
        RingEvent::Progress(p) => {
            client.peer(group, seq, layout.next, Dir::Send, p.sent, p.send_busy_ns);
            client.peer(
                group,
                seq,
                layout.prev,
                Dir::Recv,
                p.received,
                p.recv_busy_ns,
            );
        }
    })?;
    verify(buf, layout.world, seq)?;
    client.coll(&call, Phase::End);
    Ok(began.elapsed())
}

/// The rank's place in the ring and the buffer's size, checked.
#[derive(Debug, Clone, Copy)]
struct Layout {
    rank: Rank,
    world: u32,
    prev: Rank,
    next: Rank,
    /// f32 elements per all-reduce.
    count: usize,
}

impl Layout {
    fn check(args: &Args) -> Result<Self, RankError> {
        let bad = |m: String| Err(RankError::Args(m));
        if args.world < 2 {
            return bad(format!("--world must be at least 2, not {}", args.world));
        }
        if args.rank >= args.world {
            return bad(format!(
                "--rank {} is not below --world {}",
                args.rank, args.world
            ));
        }
        if args.peers.len() != args.world as usize {
            return bad(format!(
                "--peers lists {} addresses for a world of {}",
                args.peers.len(),
                args.world
            ));
        }
        if !args.bytes.is_multiple_of(4) || args.bytes / 4 < u64::from(args.world) {
            return bad(format!(
                "--bytes {} is not a multiple of 4 with at least one f32 per rank",
                args.bytes
            ));
        }
        let count = usize::try_from(args.bytes / 4)
            .map_err(|_| RankError::Args(format!("--bytes {} is too large", args.bytes)))?;
        for ip in args.peers.iter().chain([&args.listen]).map(|a| *a.ip()) {
            if !allowed(ip) {
                return Err(RankError::Address(ip));
            }
        }
        Ok(Self {
            rank: args.rank,
            world: args.world,
            prev: (args.rank + args.world - 1) % args.world,
            next: (args.rank + 1) % args.world,
            count,
        })
    }
}

/// Loopback (a local test) or the benchmarking range the namespace hosts use.
fn allowed(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    ip.is_loopback() || (o[0] == 198 && (o[1] == 18 || o[1] == 19))
}

/// Element `i` of `rank`'s input to all-reduce `seq`: small integers, so every partial sum is
/// exact in f32 whatever the order of additions, and the pattern differs per rank and per op.
fn input(rank: Rank, seq: u64, i: usize) -> f32 {
    ((i as u64 + 31 * u64::from(rank) + seq) % 64) as f32
}

fn fill(buf: &mut [f32], rank: Rank, seq: u64) {
    for (i, x) in buf.iter_mut().enumerate() {
        *x = input(rank, seq, i);
    }
}

/// Checks that `buf` holds the sum of every rank's input to all-reduce `seq`.
fn verify(buf: &[f32], world: u32, seq: u64) -> Result<(), RankError> {
    // The inputs repeat every 64 elements, and so does their sum.
    let period: Vec<f32> = (0..64)
        .map(|i| (0..world).map(|r| input(r, seq, i)).sum())
        .collect();
    match buf.iter().enumerate().find(|&(i, &x)| x != period[i % 64]) {
        Some((index, &got)) => Err(RankError::WrongSum {
            seq,
            index,
            got,
            want: period[index % 64],
        }),
        None => Ok(()),
    }
}

/// The elements of chunk `c` when `count` elements are cut into `n` chunks (the first
/// `count % n` chunks are one longer).
fn chunk_range(c: usize, n: usize, count: usize) -> Range<usize> {
    let base = count / n;
    let extra = count % n;
    let start = c * base + c.min(extra);
    start..start + base + usize::from(c < extra)
}

/// Step `s` of the ring all-reduce on rank `r` of `n`: (chunk sent to r+1, chunk received
/// from r−1, whether the received chunk is added rather than copied).
///
/// Steps `0..n−1` are the reduce-scatter: r sends chunk r−s and adds what arrives into chunk
/// r−s−1, so after them r holds the full sum of chunk r+1. Steps `n−1..2(n−1)` are the
/// all-gather: r passes on the finished chunk it got last, starting with its own r+1.
fn step(r: usize, n: usize, s: usize) -> (usize, usize, bool) {
    let m = |x: usize| x % n;
    if s < n - 1 {
        (m(r + n - s), m(r + 2 * n - s - 1), true)
    } else {
        let g = s - (n - 1);
        (m(r + 1 + n - g), m(r + n - g), false)
    }
}

/// Cumulative progress with the two neighbours inside one all-reduce.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct PeerTotals {
    sent: u64,
    send_busy_ns: u64,
    received: u64,
    recv_busy_ns: u64,
}

/// What the ring tells its caller while an all-reduce runs.
#[derive(Debug)]
enum RingEvent {
    /// The first chunk went to the sender: data movement began.
    FirstSend,
    /// A step finished; totals so far.
    Progress(PeerTotals),
}

/// A chunk that arrived from r−1, and how long its bytes took from first to last.
#[derive(Debug)]
struct Arrived {
    payload: Vec<u8>,
    busy: Duration,
}

/// A chunk handed to r+1, and how long the send calls took.
#[derive(Debug, Clone, Copy)]
struct Sent {
    bytes: u64,
    busy: Duration,
}

/// The rank's two connections, each driven by a thread of its own.
#[derive(Debug)]
struct Ring {
    layout: Layout,
    to_sender: Sender<Vec<u8>>,
    sent: Receiver<io::Result<Sent>>,
    arrived: Receiver<io::Result<Arrived>>,
}

impl Ring {
    /// Connects to r+1 (retrying until it listens) and accepts r−1, each side first writing
    /// its rank so that a stray connection is refused.
    fn connect(
        layout: &Layout,
        peers: &[SocketAddrV4],
        listen: SocketAddrV4,
        timeout: Duration,
        term: &AtomicBool,
    ) -> Result<Self, RankError> {
        let listener = TcpListener::bind(listen).map_err(|source| RankError::Listen {
            addr: listen,
            source,
        })?;
        let next_addr = peers[layout.next as usize];
        let deadline = Instant::now() + timeout;
        let mut out = loop {
            match TcpStream::connect_timeout(&next_addr.into(), Duration::from_secs(1)) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline && !term.load(Ordering::Relaxed) => {
                    thread::sleep(Duration::from_millis(50));
                }
                Err(_) => {
                    return Err(RankError::ConnectTimeout {
                        peer: layout.next,
                        addr: next_addr,
                        timeout,
                    })
                }
            }
        };
        out.write_all(&layout.rank.to_le_bytes())
            .map_err(io_err(format!(
                "introduce this rank to rank {}",
                layout.next
            )))?;
        let inbound = accept_from(&listener, listen, layout.prev, deadline, timeout, term)?;
        for s in [&out, &inbound] {
            s.set_nodelay(true)
                .map_err(io_err("turn off Nagle's algorithm"))?;
        }

        let (to_sender, sender_in) = mpsc::channel::<Vec<u8>>();
        let (sender_done, sent) = mpsc::channel();
        let (receiver_out, arrived) = mpsc::channel();
        thread::Builder::new()
            .name("ring-send".into())
            .spawn(move || send_loop(&mut out, &sender_in, &sender_done))
            .map_err(io_err("start the sender thread"))?;
        let mut inbound = inbound;
        thread::Builder::new()
            .name("ring-recv".into())
            .spawn(move || receive_loop(&mut inbound, &receiver_out))
            .map_err(io_err("start the receiver thread"))?;
        Ok(Self {
            layout: *layout,
            to_sender,
            sent,
            arrived,
        })
    }

    /// Sums `buf` across the ring in place: after it, every rank holds the same sums.
    fn all_reduce(
        &self,
        buf: &mut [f32],
        seq: u64,
        term: &AtomicBool,
        on: &mut dyn FnMut(RingEvent),
    ) -> Result<(), Stop> {
        let n = self.layout.world as usize;
        let r = self.layout.rank as usize;
        let mut totals = PeerTotals::default();
        let mut pending = 0usize;
        for s in 0..2 * (n - 1) {
            let (send_c, recv_c, add) = step(r, n, s);
            self.to_sender
                .send(encode(&buf[chunk_range(send_c, n, buf.len())]))
                .map_err(|_| self.peer_err(seq, self.layout.next, "the sender thread ended"))?;
            pending += 1;
            if s == 0 {
                on(RingEvent::FirstSend);
            }
            let chunk = self.wait_chunk(seq, term)?;
            let range = chunk_range(recv_c, n, buf.len());
            if chunk.payload.len() != range.len() * 4 {
                return Err(RankError::ChunkSize {
                    peer: self.layout.prev,
                    seq,
                    got: chunk.payload.len(),
                    want: range.len() * 4,
                }
                .into());
            }
            let incoming = chunk
                .payload
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            for (x, y) in buf[range].iter_mut().zip(incoming) {
                if add {
                    *x += y;
                } else {
                    *x = y;
                }
            }
            totals.received += chunk.payload.len() as u64;
            totals.recv_busy_ns += chunk.busy.as_nanos() as u64;
            while let Ok(done) = self.sent.try_recv() {
                self.account(&mut totals, done, seq)?;
                pending -= 1;
            }
            on(RingEvent::Progress(totals));
        }
        while pending > 0 {
            let done = self.wait_sent(seq, term)?;
            self.account(&mut totals, done, seq)?;
            pending -= 1;
        }
        on(RingEvent::Progress(totals));
        Ok(())
    }

    fn account(
        &self,
        totals: &mut PeerTotals,
        done: io::Result<Sent>,
        seq: u64,
    ) -> Result<(), RankError> {
        let done = done.map_err(|source| RankError::Peer {
            peer: self.layout.next,
            seq,
            source,
        })?;
        totals.sent += done.bytes;
        totals.send_busy_ns += done.busy.as_nanos() as u64;
        Ok(())
    }

    /// The next chunk from r−1; waits as long as it takes unless SIGTERM comes.
    fn wait_chunk(&self, seq: u64, term: &AtomicBool) -> Result<Arrived, Stop> {
        let got = wait(&self.arrived, term)?
            .ok_or_else(|| self.peer_err(seq, self.layout.prev, "the receiver thread ended"))?;
        got.map_err(|source| {
            Stop::Fail(RankError::Peer {
                peer: self.layout.prev,
                seq,
                source,
            })
        })
    }

    fn wait_sent(&self, seq: u64, term: &AtomicBool) -> Result<io::Result<Sent>, Stop> {
        wait(&self.sent, term)?
            .ok_or_else(|| self.peer_err(seq, self.layout.next, "the sender thread ended"))
    }

    fn peer_err(&self, seq: u64, peer: Rank, what: &str) -> Stop {
        Stop::Fail(RankError::Peer {
            peer,
            seq,
            source: io::Error::new(ErrorKind::BrokenPipe, what.to_owned()),
        })
    }
}

/// Receives from `rx`, looking at `term` every [`POLL`]; `None` if the other end is gone.
fn wait<T>(rx: &Receiver<T>, term: &AtomicBool) -> Result<Option<T>, Stop> {
    loop {
        if term.load(Ordering::Relaxed) {
            return Err(Stop::Term);
        }
        match rx.recv_timeout(POLL) {
            Ok(v) => return Ok(Some(v)),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return Ok(None),
        }
    }
}

/// Accepts the predecessor's connection (polling, so that the deadline and SIGTERM apply).
fn accept_from(
    listener: &TcpListener,
    listen: SocketAddrV4,
    want: Rank,
    deadline: Instant,
    timeout: Duration,
    term: &AtomicBool,
) -> Result<TcpStream, RankError> {
    listener
        .set_nonblocking(true)
        .map_err(io_err(format!("poll the listener on {listen}")))?;
    loop {
        match listener.accept() {
            Ok((mut s, _)) => {
                s.set_nonblocking(false)
                    .map_err(io_err("make the accepted connection blocking"))?;
                s.set_read_timeout(Some(timeout))
                    .map_err(io_err("set a read timeout"))?;
                let mut id = [0u8; 4];
                s.read_exact(&mut id)
                    .map_err(io_err(format!("read the rank of a connection to {listen}")))?;
                s.set_read_timeout(None)
                    .map_err(io_err("clear the read timeout"))?;
                let got = Rank::from_le_bytes(id);
                if got != want {
                    return Err(RankError::WrongPeer { listen, got, want });
                }
                return Ok(s);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline || term.load(Ordering::Relaxed) {
                    return Err(RankError::AcceptTimeout {
                        peer: want,
                        listen,
                        timeout,
                    });
                }
                thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(io_err(format!("accept on {listen}"))(e)),
        }
    }
}

/// A chunk on the wire: u32 little-endian payload length, then the f32s little-endian.
fn encode(xs: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + xs.len() * 4);
    out.extend_from_slice(&((xs.len() * 4) as u32).to_le_bytes());
    for x in xs {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

/// The sender thread: writes each frame it is given and reports how long the writes took.
fn send_loop(out: &mut TcpStream, frames: &Receiver<Vec<u8>>, done: &Sender<io::Result<Sent>>) {
    for frame in frames {
        let began = Instant::now();
        let result = out.write_all(&frame).map(|()| Sent {
            bytes: frame.len().saturating_sub(4) as u64,
            busy: began.elapsed(),
        });
        let failed = result.is_err();
        if done.send(result).is_err() || failed {
            return;
        }
    }
}

/// The receiver thread: reads chunks as fast as they come and passes them on with the time
/// from their first byte to their last.
fn receive_loop(inbound: &mut TcpStream, out: &Sender<io::Result<Arrived>>) {
    loop {
        let result = read_chunk(inbound);
        let failed = result.is_err();
        if out.send(result).is_err() || failed {
            return;
        }
    }
}

fn read_chunk(inbound: &mut TcpStream) -> io::Result<Arrived> {
    let mut header = [0u8; 4];
    inbound.read_exact(&mut header)?;
    let began = Instant::now();
    let len = u32::from_le_bytes(header) as usize;
    if len > MAX_CHUNK_BYTES || !len.is_multiple_of(4) {
        return Err(io::Error::new(
            ErrorKind::InvalidData,
            format!("a chunk header announced {len} bytes"),
        ));
    }
    let mut payload = vec![0u8; len];
    inbound.read_exact(&mut payload)?;
    Ok(Arrived {
        payload,
        busy: began.elapsed(),
    })
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> RankError {
    let what = what.into();
    move |source| RankError::Io { what, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the step schedule on in-memory buffers, every rank's step `s` at once.
    fn simulate(n: usize, count: usize, seq: u64) -> Vec<Vec<f32>> {
        let mut bufs: Vec<Vec<f32>> = (0..n)
            .map(|r| {
                let mut b = vec![0.0; count];
                fill(&mut b, r as Rank, seq);
                b
            })
            .collect();
        for s in 0..2 * (n - 1) {
            let outgoing: Vec<Vec<f32>> = (0..n)
                .map(|r| bufs[r][chunk_range(step(r, n, s).0, n, count)].to_vec())
                .collect();
            for (r, buf) in bufs.iter_mut().enumerate() {
                let (_, recv_c, add) = step(r, n, s);
                let from = (r + n - 1) % n;
                assert_eq!(
                    step(from, n, s).0,
                    recv_c,
                    "rank {r} expects chunk {recv_c} at step {s} from rank {from}"
                );
                for (x, y) in buf[chunk_range(recv_c, n, count)]
                    .iter_mut()
                    .zip(&outgoing[from])
                {
                    *x = if add { *x + y } else { *y };
                }
            }
        }
        bufs
    }

    proptest::proptest! {
        #[test]
        fn the_schedule_sums_every_element_on_every_rank(
            n in 2usize..9,
            extra in 0usize..300,
            seq in 0u64..100,
        ) {
            let count = n + extra;
            for (r, b) in simulate(n, count, seq).iter().enumerate() {
                proptest::prop_assert!(verify(b, n as u32, seq).is_ok(), "rank {r} of {n}, {count} elements");
            }
        }

        #[test]
        fn chunks_tile_the_buffer(n in 1usize..17, count in 0usize..1000) {
            let mut next = 0;
            for c in 0..n {
                let r = chunk_range(c, n, count);
                proptest::prop_assert_eq!(r.start, next);
                proptest::prop_assert!(r.len() == count / n || r.len() == count / n + 1);
                next = r.end;
            }
            proptest::prop_assert_eq!(next, count);
        }
    }

    #[test]
    fn verify_names_the_first_wrong_element() {
        let mut b = vec![0.0; 100];
        for (i, x) in b.iter_mut().enumerate() {
            *x = (0..3).map(|r| input(r, 7, i)).sum();
        }
        assert!(verify(&b, 3, 7).is_ok());
        b[42] += 1.0;
        let e = verify(&b, 3, 7).unwrap_err().to_string();
        assert!(e.contains("element 42"), "{e}");
    }

    #[test]
    fn only_loopback_and_the_test_range_are_allowed() {
        assert!(allowed(Ipv4Addr::new(127, 0, 0, 1)));
        assert!(allowed(Ipv4Addr::new(198, 18, 0, 3)));
        assert!(allowed(Ipv4Addr::new(198, 19, 255, 1)));
        assert!(!allowed(Ipv4Addr::new(198, 20, 0, 1)));
        assert!(!allowed(Ipv4Addr::new(10, 0, 0, 1)));
        assert!(!allowed(Ipv4Addr::new(192, 168, 1, 1)));
    }

    /// Three rings in one process over loopback: real sockets, real threads, the same sums.
    #[test]
    fn three_ranks_all_reduce_over_loopback() {
        let base = 20_000 + (std::process::id() % 20_000) as u16;
        let peers: Vec<SocketAddrV4> = (0..3)
            .map(|r| SocketAddrV4::new(Ipv4Addr::LOCALHOST, base + r))
            .collect();
        let handles: Vec<_> = (0..3u32)
            .map(|r| {
                let peers = peers.clone();
                thread::spawn(move || {
                    let layout = Layout {
                        rank: r,
                        world: 3,
                        prev: (r + 2) % 3,
                        next: (r + 1) % 3,
                        count: 10_001,
                    };
                    let term = AtomicBool::new(false);
                    let ring = Ring::connect(
                        &layout,
                        &peers,
                        peers[r as usize],
                        Duration::from_secs(10),
                        &term,
                    )
                    .unwrap();
                    let mut buf = vec![0.0; layout.count];
                    let mut last = PeerTotals::default();
                    for seq in 1..=5 {
                        fill(&mut buf, r, seq);
                        let mut started = false;
                        ring.all_reduce(&mut buf, seq, &term, &mut |e| match e {
                            RingEvent::FirstSend => started = true,
                            RingEvent::Progress(p) => last = p,
                        })
                        .unwrap();
                        assert!(started);
                        verify(&buf, 3, seq).unwrap();
                    }
                    last
                })
            })
            .collect();
        for h in handles {
            let last = h.join().unwrap();
            // 2(n−1) chunks of a third of the buffer (give or take an element) each way.
            let per_op = 2 * 10_001 * 4 * 2 / 3;
            for moved in [last.sent, last.received] {
                assert!(
                    (per_op - 16..=per_op + 16).contains(&(moved as i64)),
                    "{last:?}"
                );
            }
        }
    }
}
