//! A TCP parameter server for int32 gradients, the baseline of `agg-throughput` (issue 12):
//! every worker streams its whole gradient to the server, which adds each value into the
//! round's sum as the bytes arrive (wrapping, as int32 tensors add) and streams the sum back to
//! every worker as soon as all workers' values up to that point are in.
//!
//! Built to be the strongest simple TCP baseline: one thread, edge-triggered epoll over
//! non-blocking sockets (reads and writes interleave, so each connection is full duplex),
//! `TCP_NODELAY`, 4 MiB socket buffers, summing straight from a 256 KiB staging buffer that is
//! still in cache. The same design as the plain C server in `bench/c/tcp_sum_server.c`; the
//! benchmark runs both so that a slow Rust server would show beside the C one.
//!
//! Two sum buffers by round parity: a fast worker may send round r + 1 while a slow one still
//! receives round r's sum. Nobody sends round r + 2 before every worker has all of round r's
//! sum, so the buffer is cleared when its last byte goes out.

// epoll, socket options and a bind-before-connect have no safe binding in std.
#![allow(unsafe_code)]

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Socket buffer size both ends ask for (forced past `net.core.*mem_max`: the bench is root).
pub const SOCKBUF: i32 = 4 << 20;
const STAGE: usize = 256 * 1024;

/// Sets `SO_SNDBUF`/`SO_RCVBUF` to `bytes` (the FORCE variants, falling back to the plain ones)
/// and `TCP_NODELAY`.
pub fn tune(fd: RawFd, bytes: i32) -> io::Result<()> {
    let set = |level: i32, name: i32, value: i32| -> io::Result<()> {
        // SAFETY: `value` lives across the call and its size is passed with it.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                std::ptr::from_ref(&value).cast(),
                std::mem::size_of::<i32>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    set(libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, bytes)
        .or_else(|_| set(libc::SOL_SOCKET, libc::SO_SNDBUF, bytes))?;
    set(libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, bytes)
        .or_else(|_| set(libc::SOL_SOCKET, libc::SO_RCVBUF, bytes))?;
    set(libc::IPPROTO_TCP, libc::TCP_NODELAY, 1)
}

struct Conn {
    stream: TcpStream,
    open: bool,
    /// The round this worker is sending, and its values received so far.
    rx_round: u64,
    rx_vals: usize,
    stage: Vec<u8>,
    /// Bytes of an incomplete value at the front of `stage`.
    carry: usize,
    /// The round whose sum this worker receives, and its bytes sent so far.
    tx_round: u64,
    tx_bytes: usize,
}

/// The server's state: connections and the two sum buffers.
struct Server {
    conns: Vec<Conn>,
    values: usize,
    acc: [Vec<i32>; 2],
    done_sending: [usize; 2],
}

impl Server {
    /// Values of round `r` that every worker has sent.
    fn ready(&self, r: u64) -> usize {
        self.conns
            .iter()
            .map(|c| match c.rx_round.cmp(&r) {
                std::cmp::Ordering::Greater => self.values,
                std::cmp::Ordering::Equal => c.rx_vals,
                std::cmp::Ordering::Less => 0,
            })
            .min()
            .unwrap_or(0)
    }

    /// Reads until the socket is drained (edge-triggered); `Ok(false)` when the peer closed.
    fn on_readable(&mut self, w: usize) -> io::Result<bool> {
        let values = self.values;
        loop {
            let c = &mut self.conns[w];
            let n = match c.stream.read(&mut c.stage[c.carry..STAGE]) {
                Ok(0) => return Ok(false),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            let have = c.carry + n;
            let whole = have / 4;
            let mut done = 0;
            while done < whole {
                let k = (whole - done).min(values - c.rx_vals);
                let acc = &mut self.acc[(c.rx_round & 1) as usize][c.rx_vals..c.rx_vals + k];
                let bytes = &c.stage[done * 4..(done + k) * 4];
                for (a, b) in acc.iter_mut().zip(bytes.chunks_exact(4)) {
                    *a = a.wrapping_add(i32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                }
                done += k;
                c.rx_vals += k;
                if c.rx_vals == values {
                    c.rx_round += 1;
                    c.rx_vals = 0;
                }
            }
            c.carry = have - whole * 4;
            c.stage.copy_within(whole * 4..have, 0);
        }
    }

    /// Sends what is summed and not yet sent to worker `w`; stops at a full socket buffer.
    fn flush(&mut self, w: usize) -> io::Result<()> {
        loop {
            let r = self.conns[w].tx_round;
            let avail = self.ready(r) * 4;
            let sent = self.conns[w].tx_bytes;
            if sent >= avail {
                return Ok(());
            }
            let p = (r & 1) as usize;
            let bytes = as_bytes(&self.acc[p]);
            let n = match self.conns[w].stream.write(&bytes[sent..avail]) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            let c = &mut self.conns[w];
            c.tx_bytes += n;
            if c.tx_bytes == self.values * 4 {
                c.tx_round += 1;
                c.tx_bytes = 0;
                self.done_sending[p] += 1;
                if self.done_sending[p] == self.conns.len() {
                    self.done_sending[p] = 0;
                    self.acc[p].fill(0);
                }
            }
        }
    }
}

/// The sum buffer as the bytes that go on the wire (this is a little-endian machine: the
/// benchmark's hosts are x86-64, and the wire format is little-endian).
fn as_bytes(v: &[i32]) -> &[u8] {
    // SAFETY: i32 has no padding and any byte pattern is a valid u8; the length is exact.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// Serves `workers` connections on `listener`, `values` int32 per round, until every worker
/// has closed its connection, or `stop` is set (checked every 100 ms while waiting).
pub fn serve(
    listener: &TcpListener,
    workers: usize,
    values: usize,
    stop: &AtomicBool,
) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    let mut conns = Vec::with_capacity(workers);
    let deadline = Instant::now() + Duration::from_secs(10);
    while conns.len() < workers {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(true)?;
                tune(stream.as_raw_fd(), SOCKBUF)?;
                conns.push(Conn {
                    stream,
                    open: true,
                    rx_round: 0,
                    rx_vals: 0,
                    stage: vec![0; STAGE + 4],
                    carry: 0,
                    tx_round: 0,
                    tx_bytes: 0,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if stop.load(Ordering::Relaxed) || Instant::now() > deadline {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("only {} of {workers} workers connected", conns.len()),
                    ));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e),
        }
    }
    // SAFETY: plain syscall; the fd is closed below.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return Err(io::Error::last_os_error());
    }
    let result = (|| {
        for (w, c) in conns.iter().enumerate() {
            let mut ev = libc::epoll_event {
                events: (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLET) as u32,
                u64: w as u64,
            };
            // SAFETY: `ev` is a valid epoll_event for the call.
            if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, c.stream.as_raw_fd(), &mut ev) }
                < 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        let mut s = Server {
            conns,
            values,
            acc: [vec![0; values], vec![0; values]],
            done_sending: [0; 2],
        };
        let mut open = workers;
        let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; workers];
        while open > 0 && !stop.load(Ordering::Relaxed) {
            // SAFETY: `evs` has room for `workers` events.
            let n = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), workers as i32, 100) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let mut progressed = false;
            for ev in &evs[..n as usize] {
                let (w, events) = (ev.u64 as usize, ev.events);
                if !s.conns[w].open {
                    continue;
                }
                if events & (libc::EPOLLIN | libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 {
                    let before = (s.conns[w].rx_round, s.conns[w].rx_vals);
                    if !s.on_readable(w)? {
                        s.conns[w].open = false;
                        open -= 1;
                        continue;
                    }
                    progressed |= (s.conns[w].rx_round, s.conns[w].rx_vals) != before;
                }
                if events & libc::EPOLLOUT as u32 != 0 {
                    s.flush(w)?;
                }
            }
            // New values may have made more of a sum ready for every worker.
            if progressed {
                for w in 0..s.conns.len() {
                    if s.conns[w].open {
                        s.flush(w)?;
                    }
                }
            }
        }
        Ok(())
    })();
    // SAFETY: `ep` is ours and closed once.
    unsafe { libc::close(ep) };
    result
}

/// A worker's side: a connection to the server, one round per call.
pub struct TcpWorker {
    stream: TcpStream,
    out: Vec<u8>,
    back: Vec<u8>,
}

impl TcpWorker {
    /// Connects to `server` from `local` (the worker's host address), retrying for up to 5 s
    /// while the server starts; a read or write that waits longer than `io_timeout` fails (a
    /// dead server must not hang the caller).
    pub fn connect(
        local: Ipv4Addr,
        server: SocketAddrV4,
        io_timeout: Duration,
    ) -> io::Result<Self> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let stream = loop {
            match connect_from(local, server) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => return Err(e),
            }
        };
        stream.set_read_timeout(Some(io_timeout))?;
        stream.set_write_timeout(Some(io_timeout))?;
        Ok(TcpWorker {
            stream,
            out: Vec::new(),
            back: Vec::new(),
        })
    }

    /// Sums `grad` with every worker's, in place: sends it while receiving the sum (a writer
    /// thread beside the reading caller: full duplex).
    pub fn all_reduce_i32(&mut self, grad: &mut [i32]) -> io::Result<()> {
        self.out.clear();
        self.out.extend(grad.iter().flat_map(|v| v.to_le_bytes()));
        self.back.resize(grad.len() * 4, 0);
        let mut writer = self.stream.try_clone()?;
        let out = &self.out;
        let back = &mut self.back;
        let reader = &mut self.stream;
        std::thread::scope(|s| {
            let w = s.spawn(move || writer.write_all(out));
            let r = reader.read_exact(back);
            let w = w
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the writer thread panicked")));
            r.and(w)
        })?;
        for (g, b) in grad.iter_mut().zip(self.back.chunks_exact(4)) {
            *g = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        Ok(())
    }
}

/// A blocking TCP connection from `local` (port chosen by the kernel) to `server`, tuned.
fn connect_from(local: Ipv4Addr, server: SocketAddrV4) -> io::Result<TcpStream> {
    // SAFETY: plain syscalls on a socket this function owns until it becomes a TcpStream.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let stream = <TcpStream as std::os::fd::FromRawFd>::from_raw_fd(fd);
        tune(fd, SOCKBUF)?;
        let sa = |a: SocketAddrV4| libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: a.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*a.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let l = sa(SocketAddrV4::new(local, 0));
        if libc::bind(fd, std::ptr::from_ref(&l).cast(), len) < 0 {
            return Err(io::Error::last_os_error());
        }
        let r = sa(server);
        if libc::connect(fd, std::ptr::from_ref(&r).cast(), len) < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stream)
    }
}

/// Runs `workers` workers against a server on `addr` for `rounds` rounds of `values` values
/// (not a multiple of the staging buffer) and fails unless every worker got the exact wrapping
/// sum every round: the check both servers' tests share.
#[cfg(test)]
pub fn exercise(addr: SocketAddrV4, workers: usize, values: usize, rounds: u32) {
    let grad = move |w: usize, r: u32| -> Vec<i32> {
        (0..values)
            .map(|i| (i as i32).wrapping_mul(0x6b43_a9b5) ^ (w as i32 * 77 + r as i32))
            .collect()
    };
    let threads: Vec<_> = (0..workers)
        .map(|w| {
            std::thread::spawn(move || {
                let mut c =
                    TcpWorker::connect(Ipv4Addr::LOCALHOST, addr, Duration::from_secs(30)).unwrap();
                for r in 0..rounds {
                    let mut g = grad(w, r);
                    c.all_reduce_i32(&mut g).unwrap();
                    let mut want = vec![0i32; values];
                    for k in 0..workers {
                        for (s, v) in want.iter_mut().zip(grad(k, r)) {
                            *s = s.wrapping_add(v);
                        }
                    }
                    assert!(g == want, "worker {w} round {r}: not the exact sum");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Three workers over loopback, three rounds: exact sums, and the server ends when the
    /// workers hang up.
    #[test]
    fn sums_exactly_over_loopback() {
        let values = 100_003usize;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let std::net::SocketAddr::V4(addr) = listener.local_addr().unwrap() else {
            panic!("not v4");
        };
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let server = std::thread::spawn(move || serve(&listener, 3, values, &stop2));
        exercise(addr, 3, values, 3);
        server.join().unwrap().unwrap();
    }
}
