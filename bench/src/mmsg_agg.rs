//! The user-space UDP aggregator of `agg-throughput`: the reference state machine
//! (`yard_agg::model`, rule for rule the XDP program's) behind one UDP socket, with the system
//! calls batched as an efficient user-space aggregator would: `recvmmsg` takes up to
//! [`BATCH`] frames per call (`MSG_WAITFORONE`: it returns as soon as one has come and takes
//! what else is queued), and every reply and fan-out copy the batch produced goes out in
//! `sendmmsg` calls of up to [`BATCH`] messages.

// recvmmsg/sendmmsg and socket options have no safe binding in the workspace's crates.
#![allow(unsafe_code)]

use std::io;
use std::net::{SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use yard_agg::model::{Action, Aggregator};
use yard_agg::wire::Header;

/// Frames per `recvmmsg` and messages per `sendmmsg`.
pub const BATCH: usize = 64;
/// Socket buffers the aggregator's socket asks for: bursts from 8 workers' 64-chunk windows.
pub const RCVBUF: i32 = 8 << 20;
const FRAME_MAX: usize = 9216;

/// What one serving run did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Served {
    pub frames: u64,
    pub recv_calls: u64,
    pub sent: u64,
    pub send_calls: u64,
    /// Time spent inside the model (`Aggregator::receive`), not in system calls.
    pub model_s: f64,
}

fn sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// Sends every `(frame index, destination)` of `out` in `sendmmsg` batches.
fn send_all(
    fd: i32,
    frames: &[Vec<u8>],
    out: &[(usize, SocketAddrV4)],
    served: &mut Served,
) -> io::Result<()> {
    for batch in out.chunks(BATCH) {
        let mut addrs: Vec<libc::sockaddr_in> = batch.iter().map(|(_, a)| sockaddr(*a)).collect();
        let mut iovs: Vec<libc::iovec> = batch
            .iter()
            .map(|(i, _)| libc::iovec {
                iov_base: frames[*i].as_ptr() as *mut libc::c_void,
                iov_len: frames[*i].len(),
            })
            .collect();
        // SAFETY: mmsghdr is plain data; zeroed is a valid empty header.
        let mut msgs: Vec<libc::mmsghdr> = vec![unsafe { std::mem::zeroed() }; batch.len()];
        for (k, m) in msgs.iter_mut().enumerate() {
            m.msg_hdr.msg_name = std::ptr::from_mut(&mut addrs[k]).cast();
            m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
            m.msg_hdr.msg_iov = std::ptr::from_mut(&mut iovs[k]);
            m.msg_hdr.msg_iovlen = 1;
        }
        let mut done = 0;
        while done < msgs.len() {
            // SAFETY: every header points into `addrs` and `iovs`, alive across the call.
            let n = unsafe {
                libc::sendmmsg(fd, msgs[done..].as_mut_ptr(), (msgs.len() - done) as u32, 0)
            };
            served.send_calls += 1;
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            done += n as usize;
            served.sent += n as u64;
        }
    }
    Ok(())
}

/// Sets a UDP socket's receive and send buffers to `bytes` (the FORCE variants, past
/// `net.core.*mem_max`: the bench is root; the plain ones otherwise).
pub fn set_buffers(sock: &UdpSocket, bytes: i32) -> io::Result<()> {
    let fd = sock.as_raw_fd();
    for (name, fallback) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        let set = |opt| {
            // SAFETY: `bytes` lives across the call and its size is passed with it.
            unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    opt,
                    std::ptr::from_ref(&bytes).cast(),
                    std::mem::size_of::<i32>() as u32,
                )
            }
        };
        if set(name) != 0 && set(fallback) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Runs `model` on `sock` until `stop` is set (checked at least every 50 ms).
pub fn serve(sock: &UdpSocket, model: &mut Aggregator, stop: &AtomicBool) -> io::Result<Served> {
    let fd = sock.as_raw_fd();
    set_buffers(sock, RCVBUF)?;
    sock.set_read_timeout(Some(Duration::from_millis(50)))?;
    let mut bufs = vec![vec![0u8; FRAME_MAX]; BATCH];
    // SAFETY: sockaddr_in and mmsghdr are plain data; zeroed values are valid.
    let mut addrs: Vec<libc::sockaddr_in> = vec![unsafe { std::mem::zeroed() }; BATCH];
    let mut iovs: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        })
        .collect();
    let mut msgs: Vec<libc::mmsghdr> = vec![unsafe { std::mem::zeroed() }; BATCH];
    let mut served = Served::default();
    let mut frames: Vec<Vec<u8>> = Vec::new();
    let mut out: Vec<(usize, SocketAddrV4)> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        for k in 0..BATCH {
            msgs[k].msg_hdr.msg_name = std::ptr::from_mut(&mut addrs[k]).cast();
            msgs[k].msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
            msgs[k].msg_hdr.msg_iov = std::ptr::from_mut(&mut iovs[k]);
            msgs[k].msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: every header points into `addrs` and `iovs` (and they into `bufs`), alive
        // across the call.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                msgs.as_mut_ptr(),
                BATCH as u32,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        served.recv_calls += 1;
        if n < 0 {
            let e = io::Error::last_os_error();
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
            ) {
                continue;
            }
            return Err(e);
        }
        frames.clear();
        out.clear();
        let t0 = Instant::now();
        for k in 0..n as usize {
            let len = msgs[k].msg_len as usize;
            let a = &addrs[k];
            let from = SocketAddrV4::new(
                u32::from_be(a.sin_addr.s_addr).into(),
                u16::from_be(a.sin_port),
            );
            served.frames += 1;
            match model.receive(from, &bufs[k][..len]).action {
                Action::Drop => {}
                Action::Reply(b) => {
                    out.push((frames.len(), from));
                    frames.push(b);
                }
                Action::Fanout(b) => {
                    let job = Header::parse(&b).map_or(0, |(h, _)| h.job);
                    for m in model.members(job) {
                        out.push((frames.len(), *m));
                    }
                    frames.push(b);
                }
                Action::Up(b) => {
                    let job = Header::parse(&b).map_or(0, |(h, _)| h.job);
                    if let Some(p) = model.parent(job) {
                        out.push((frames.len(), p.addr));
                        frames.push(b);
                    }
                }
            }
        }
        served.model_s += t0.elapsed().as_secs_f64();
        send_all(fd, &frames, &out, &mut served)?;
    }
    Ok(served)
}
