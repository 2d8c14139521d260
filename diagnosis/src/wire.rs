//! The probe clients' wire format: how a training process (a rank) reports to the `yard` node
//! on its host. This module doc is the one specification; the Rust client
//! ([`crate::client`]), the Python package (`clients/python/yard_probe`) and the NCCL profiler
//! plugin (`clients/nccl-profiler`) all implement it and refer here.
//!
//! # Transport
//!
//! A Unix stream socket, path `/var/lib/yard/probe.sock` unless the client's environment sets
//! `YARD_PROBE_SOCKET`. One connection per process. Clients never wait for the node: a frame
//! that cannot be written at once is dropped and counted, so the node must tolerate gaps.
//!
//! # Framing
//!
//! `frame = u32 body_len (little-endian) + body`, with `1 <= body_len <= 4096`; a zero or larger
//! length is a protocol error and the node closes the connection. All integers are
//! little-endian. A string is `u16 len + len bytes of UTF-8`, `len <= 255`. The body is a
//! `u8` message type followed by that type's fields, with no trailing bytes:
//!
//! | type | name      | fields |
//! |------|-----------|--------|
//! | 1    | HELLO     | `u16 version (=1)`, `u32 rank`, `u32 world_size`, `u32 local_rank`, `u32 pid`, `str job`, `str host` (empty: the node fills in its own name), `str nic`, `str switch`, `u16 nports`, `nports × u16 port` |
//! | 2    | GROUP     | `u32 handle`, `str name`, `str desc`, `u32 n`, `n × u32 global rank` |
//! | 3    | COLL      | `u32 handle`, `u64 seq`, `u8 op`, `u8 dtype`, `u8 phase`, `u8 flags` (bit 0: has peer), `u32 peer`, `u64 count`, `u64 bytes`, `u64 t_ns` (fixed 45-byte body) |
//! | 4    | PEER      | `u32 handle`, `u64 seq`, `u32 peer`, `u8 dir`, `u64 bytes`, `u64 busy_ns`, `u64 t_ns` (fixed 42-byte body) |
//! | 5    | HEARTBEAT | `u64 t_ns` |
//! | 6    | EXIT      | `u64 t_ns` |
//!
//! * HELLO must be the first frame and is sent once per connection. `rank` must be below
//!   `world_size`. `ports` are the TCP/UDP ports the job's traffic uses, for the eBPF per-peer
//!   counters.
//! * GROUP binds a client-chosen `handle` to a process group (PyTorch's pg name, e.g. "0", and
//!   its `desc`, e.g. "default_pg") and lists its members' global ranks in group-rank order. A
//!   frame holds at most [`MAX_GROUP_RANKS_PER_FRAME`] ranks; a larger group is sent as several
//!   GROUP frames with the same handle and name, each carrying the next slice of ranks, and the
//!   node appends them (it re-announces the group with the ranks so far after each frame).
//! * COLL is one phase of one collective: `op` is [`Op::code`], `dtype` [`Dtype::code`],
//!   `phase` 0 enqueue / 1 start / 2 end. `seq` numbers the collectives of one group on this
//!   rank, like PyTorch Flight Recorder's `collective_seq_id` (send/recv use their own p2p
//!   counter); clients start at 1. `peer` (a global rank) is meaningful only when flags bit 0 is
//!   set (send/recv). `count` is the element count, `bytes` what this rank contributes.
//! * PEER is cumulative progress of this rank's transfers with one peer inside one op: `dir`
//!   0 send / 1 recv, bytes moved so far, time spent waiting on that peer so far.
//! * HEARTBEAT is sent about every 100 ms whatever the training loop does; EXIT on a clean
//!   shutdown, so that silence afterwards is not read as a dead process.
//!
//! Times are `CLOCK_REALTIME` nanoseconds on the client's host.
//!
//! # Node side
//!
//! [`Decoder`] turns a connection's bytes into [`Message`]s (feed any chunking, pop whole
//! messages); [`Session`] turns one connection's messages into [`Event`]s, resolving group
//! handles to interned [`PgName`]s. Neither allocates for COLL, PEER or HEARTBEAT frames.

use crate::event::{Coll, Dir, Dtype, Event, Group, Member, Op, PeerProgress, PgName, Phase, Rank};
use std::collections::HashMap;
use std::sync::Arc;
use thiserror::Error;

/// The protocol version this module speaks (HELLO's first field).
pub const VERSION: u16 = 1;
/// Largest allowed frame body, in bytes.
pub const MAX_FRAME: usize = 4096;
/// Longest allowed string, in bytes.
pub const MAX_STR: usize = 255;
/// Most ranks one GROUP frame carries: what fits in [`MAX_FRAME`] next to two maximal strings,
/// rounded down so every client can use the same constant.
pub const MAX_GROUP_RANKS_PER_FRAME: usize = 800;
/// Most ports one HELLO carries (it must fit in a frame next to four maximal strings).
pub const MAX_PORTS: usize = 1000;

/// Message type codes (the body's first byte).
pub mod kind {
    pub const HELLO: u8 = 1;
    pub const GROUP: u8 = 2;
    pub const COLL: u8 = 3;
    pub const PEER: u8 = 4;
    pub const HEARTBEAT: u8 = 5;
    pub const EXIT: u8 = 6;
}

/// Body length of every COLL frame.
pub const COLL_BODY: usize = 1 + 4 + 8 + 4 + 4 + 8 + 8 + 8;
/// Body length of every PEER frame.
pub const PEER_BODY: usize = 1 + 4 + 8 + 4 + 1 + 8 + 8 + 8;
/// Body length of every HEARTBEAT and EXIT frame.
pub const TIME_BODY: usize = 1 + 8;
const HAS_PEER: u8 = 1;

/// Why a connection's bytes were rejected. After any error the stream is out of step and the
/// node should close the connection; the client reconnects and starts over with HELLO.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum WireError {
    #[error("frame length {0} exceeds the 4096-byte limit")]
    FrameTooLarge(u32),
    #[error("frame length 0 is not allowed")]
    EmptyFrame,
    #[error("unknown message type {0}")]
    UnknownType(u8),
    #[error("truncated {0} frame")]
    Truncated(&'static str),
    #[error("{kind} frame has {extra} trailing bytes")]
    TrailingBytes { kind: &'static str, extra: usize },
    #[error("unsupported protocol version {0} (this node speaks version 1)")]
    UnsupportedVersion(u16),
    #[error("unknown op code {0}")]
    UnknownOp(u8),
    #[error("unknown dtype code {0}")]
    UnknownDtype(u8),
    #[error("unknown phase code {0}")]
    UnknownPhase(u8),
    #[error("unknown direction code {0}")]
    UnknownDir(u8),
    #[error("{field} is {len} bytes, over the 255-byte limit")]
    StringTooLong { field: &'static str, len: usize },
    #[error("invalid utf-8 in {0}")]
    InvalidUtf8(&'static str),
    #[error("first frame must be HELLO")]
    HelloFirst,
    #[error("HELLO sent twice on one connection")]
    DuplicateHello,
    #[error("rank {rank} is outside world size {world_size}")]
    RankOutsideWorld { rank: u32, world_size: u32 },
    #[error("unknown group handle {0}")]
    UnknownHandle(u32),
    #[error("GROUP frame for handle {handle} renames group {old:?} to {new:?}")]
    GroupRenamed {
        handle: u32,
        old: String,
        new: String,
    },
    #[error("more than {max} groups on one connection", max = MAX_SESSION_GROUPS)]
    TooManyGroups,
    #[error("more than {max} group ranks on one connection", max = MAX_SESSION_GROUP_RANKS)]
    TooManyGroupRanks,
}

/// Most group handles one connection may bind. A rank is in a handful of groups (world, data,
/// tensor, pipeline parallel, a few subgroups); thousands leave room for any layout while a
/// client sending a new handle per frame cannot grow its session without bound.
pub const MAX_SESSION_GROUPS: usize = 4096;

/// Most distinct ranks one connection's groups may list in all: 64 groups of 16,384 ranks
/// (4 MiB of rank ids, kept twice for deduplication). A group naming ranks outside
/// its job's world is passed on and refused by the analyzer, which knows the job's world.
pub const MAX_SESSION_GROUP_RANKS: usize = 1 << 20;

/// A rank's introduction: the first frame of every connection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hello {
    pub rank: Rank,
    pub world_size: u32,
    pub local_rank: u32,
    pub pid: u32,
    pub job: String,
    /// Empty: the node uses its own name.
    pub host: String,
    pub nic: String,
    pub switch: String,
    /// TCP/UDP ports the job's traffic uses.
    pub ports: Vec<u16>,
}

/// One decoded frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    Hello(Hello),
    Group {
        handle: u32,
        name: String,
        desc: String,
        ranks: Vec<Rank>,
    },
    Coll {
        handle: u32,
        seq: u64,
        op: Op,
        dtype: Dtype,
        phase: Phase,
        peer: Option<Rank>,
        count: u64,
        bytes: u64,
        t_ns: u64,
    },
    Peer {
        handle: u32,
        seq: u64,
        peer: Rank,
        dir: Dir,
        bytes: u64,
        busy_ns: u64,
        t_ns: u64,
    },
    Heartbeat {
        t_ns: u64,
    },
    Exit {
        t_ns: u64,
    },
}

impl Message {
    /// Appends this message as one frame (length prefix included) to `out`.
    ///
    /// Strings longer than [`MAX_STR`] are cut at a character boundary, ports beyond
    /// [`MAX_PORTS`] and group ranks beyond [`MAX_GROUP_RANKS_PER_FRAME`] are left out, so the
    /// frame is always valid; split large groups with [`group_frames`].
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; 4]);
        match self {
            Message::Hello(h) => {
                out.push(kind::HELLO);
                put_u16(out, VERSION);
                put_u32(out, h.rank);
                put_u32(out, h.world_size);
                put_u32(out, h.local_rank);
                put_u32(out, h.pid);
                for s in [&h.job, &h.host, &h.nic, &h.switch] {
                    put_str(out, s);
                }
                let ports = &h.ports[..h.ports.len().min(MAX_PORTS)];
                put_u16(out, ports.len() as u16);
                for &p in ports {
                    put_u16(out, p);
                }
            }
            Message::Group {
                handle,
                name,
                desc,
                ranks,
            } => {
                out.push(kind::GROUP);
                put_u32(out, *handle);
                put_str(out, name);
                put_str(out, desc);
                let ranks = &ranks[..ranks.len().min(MAX_GROUP_RANKS_PER_FRAME)];
                put_u32(out, ranks.len() as u32);
                for &r in ranks {
                    put_u32(out, r);
                }
            }
            Message::Coll {
                handle,
                seq,
                op,
                dtype,
                phase,
                peer,
                count,
                bytes,
                t_ns,
            } => {
                out.push(kind::COLL);
                put_u32(out, *handle);
                put_u64(out, *seq);
                out.extend_from_slice(&[
                    op.code(),
                    dtype.code(),
                    *phase as u8,
                    if peer.is_some() { HAS_PEER } else { 0 },
                ]);
                put_u32(out, peer.unwrap_or(0));
                put_u64(out, *count);
                put_u64(out, *bytes);
                put_u64(out, *t_ns);
            }
            Message::Peer {
                handle,
                seq,
                peer,
                dir,
                bytes,
                busy_ns,
                t_ns,
            } => {
                out.push(kind::PEER);
                put_u32(out, *handle);
                put_u64(out, *seq);
                put_u32(out, *peer);
                out.push(*dir as u8);
                put_u64(out, *bytes);
                put_u64(out, *busy_ns);
                put_u64(out, *t_ns);
            }
            Message::Heartbeat { t_ns } => {
                out.push(kind::HEARTBEAT);
                put_u64(out, *t_ns);
            }
            Message::Exit { t_ns } => {
                out.push(kind::EXIT);
                put_u64(out, *t_ns);
            }
        }
        let body_len = (out.len() - start - 4) as u32;
        out[start..start + 4].copy_from_slice(&body_len.to_le_bytes());
    }

    /// Decodes one frame body (without its length prefix).
    pub fn decode(body: &[u8]) -> Result<Message, WireError> {
        let (&ty, rest) = body.split_first().ok_or(WireError::EmptyFrame)?;
        let name = kind_name(ty).ok_or(WireError::UnknownType(ty))?;
        let mut r = Reader {
            buf: rest,
            kind: name,
        };
        let msg = match ty {
            kind::HELLO => {
                let version = r.u16()?;
                if version != VERSION {
                    return Err(WireError::UnsupportedVersion(version));
                }
                let rank = r.u32()?;
                let world_size = r.u32()?;
                let local_rank = r.u32()?;
                let pid = r.u32()?;
                let job = r.str("job name")?;
                let host = r.str("host name")?;
                let nic = r.str("nic name")?;
                let switch = r.str("switch name")?;
                let nports = r.u16()? as usize;
                let mut ports = Vec::with_capacity(nports.min(r.buf.len() / 2));
                for _ in 0..nports {
                    ports.push(r.u16()?);
                }
                Message::Hello(Hello {
                    rank,
                    world_size,
                    local_rank,
                    pid,
                    job,
                    host,
                    nic,
                    switch,
                    ports,
                })
            }
            kind::GROUP => {
                let handle = r.u32()?;
                let name = r.str("group name")?;
                let desc = r.str("group desc")?;
                let n = r.u32()? as usize;
                if n > r.buf.len() / 4 {
                    return Err(WireError::Truncated(r.kind));
                }
                let mut ranks = Vec::with_capacity(n);
                for _ in 0..n {
                    ranks.push(r.u32()?);
                }
                Message::Group {
                    handle,
                    name,
                    desc,
                    ranks,
                }
            }
            kind::COLL => {
                let handle = r.u32()?;
                let seq = r.u64()?;
                let [op, dtype, phase, flags] = r.array::<4>()?;
                let peer = r.u32()?;
                let count = r.u64()?;
                let bytes = r.u64()?;
                let t_ns = r.u64()?;
                Message::Coll {
                    handle,
                    seq,
                    op: Op::from_code(op).ok_or(WireError::UnknownOp(op))?,
                    dtype: Dtype::from_code(dtype).ok_or(WireError::UnknownDtype(dtype))?,
                    phase: Phase::from_code(phase).ok_or(WireError::UnknownPhase(phase))?,
                    peer: (flags & HAS_PEER != 0).then_some(peer),
                    count,
                    bytes,
                    t_ns,
                }
            }
            kind::PEER => {
                let handle = r.u32()?;
                let seq = r.u64()?;
                let peer = r.u32()?;
                let [dir] = r.array::<1>()?;
                Message::Peer {
                    handle,
                    seq,
                    peer,
                    dir: Dir::from_code(dir).ok_or(WireError::UnknownDir(dir))?,
                    bytes: r.u64()?,
                    busy_ns: r.u64()?,
                    t_ns: r.u64()?,
                }
            }
            kind::HEARTBEAT => Message::Heartbeat { t_ns: r.u64()? },
            _ => Message::Exit { t_ns: r.u64()? },
        };
        if !r.buf.is_empty() {
            return Err(WireError::TrailingBytes {
                kind: name,
                extra: r.buf.len(),
            });
        }
        Ok(msg)
    }
}

/// The GROUP frames announcing one group: one frame per [`MAX_GROUP_RANKS_PER_FRAME`] ranks
/// (one frame for an empty group).
pub fn group_frames(handle: u32, name: &str, desc: &str, ranks: &[Rank]) -> Vec<Message> {
    let mut chunks: Vec<&[Rank]> = ranks.chunks(MAX_GROUP_RANKS_PER_FRAME).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    chunks
        .into_iter()
        .map(|chunk| Message::Group {
            handle,
            name: name.to_owned(),
            desc: desc.to_owned(),
            ranks: chunk.to_vec(),
        })
        .collect()
}

fn kind_name(ty: u8) -> Option<&'static str> {
    Some(match ty {
        kind::HELLO => "HELLO",
        kind::GROUP => "GROUP",
        kind::COLL => "COLL",
        kind::PEER => "PEER",
        kind::HEARTBEAT => "HEARTBEAT",
        kind::EXIT => "EXIT",
        _ => return None,
    })
}

fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    let mut end = s.len().min(MAX_STR);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    put_u16(out, end as u16);
    out.extend_from_slice(&s.as_bytes()[..end]);
}

/// A cursor over one frame body that reports running out as a truncated frame of its kind.
struct Reader<'a> {
    buf: &'a [u8],
    kind: &'static str,
}

impl Reader<'_> {
    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let (head, rest) = self
            .buf
            .split_first_chunk::<N>()
            .ok_or(WireError::Truncated(self.kind))?;
        self.buf = rest;
        Ok(*head)
    }

    fn u16(&mut self) -> Result<u16, WireError> {
        self.array().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        self.array().map(u64::from_le_bytes)
    }

    fn str(&mut self, field: &'static str) -> Result<String, WireError> {
        let len = self.u16()? as usize;
        if len > MAX_STR {
            return Err(WireError::StringTooLong { field, len });
        }
        if self.buf.len() < len {
            return Err(WireError::Truncated(self.kind));
        }
        let (bytes, rest) = self.buf.split_at(len);
        self.buf = rest;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| WireError::InvalidUtf8(field))
    }
}

/// Incremental frame decoder for one connection: [`Decoder::feed`] whatever bytes arrived,
/// then call [`Decoder::next_message`] until it returns `Ok(None)`.
///
/// The first error is sticky: the stream is out of step after it, so every later call returns
/// the same error and the caller should close the connection.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    /// Start of the unread bytes in `buf`.
    pos: usize,
    failed: Option<WireError>,
}

impl Decoder {
    pub fn new() -> Self {
        Decoder {
            buf: Vec::with_capacity(2 * (MAX_FRAME + 4)),
            pos: 0,
            failed: None,
        }
    }

    /// Appends received bytes. Consumed bytes are reclaimed first, so the buffer stays within a
    /// couple of frames plus the largest chunk ever fed and steady state does not allocate.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.pos > 0 {
            self.buf.copy_within(self.pos.., 0);
            self.buf.truncate(self.buf.len() - self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes fed but not yet returned as messages (a partial frame).
    pub fn pending(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The next complete message, `Ok(None)` if more bytes are needed.
    pub fn next_message(&mut self) -> Result<Option<Message>, WireError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let result = self.decode_next();
        if let Err(e) = &result {
            self.failed = Some(e.clone());
        }
        result
    }

    fn decode_next(&mut self) -> Result<Option<Message>, WireError> {
        let unread = &self.buf[self.pos..];
        let Some((len, rest)) = unread.split_first_chunk::<4>() else {
            return Ok(None);
        };
        let len = u32::from_le_bytes(*len);
        if len == 0 {
            return Err(WireError::EmptyFrame);
        }
        if len as usize > MAX_FRAME {
            return Err(WireError::FrameTooLarge(len));
        }
        let Some(body) = rest.get(..len as usize) else {
            return Ok(None);
        };
        let msg = Message::decode(body)?;
        self.pos += 4 + len as usize;
        Ok(Some(msg))
    }
}

/// One connection's state on the node: who the rank is (its HELLO) and its group handles.
/// [`Session::accept`] turns each decoded [`Message`] into the [`Event`] the analyzer takes.
#[derive(Debug)]
pub struct Session {
    node_host: String,
    node_addr: String,
    hello: Option<Hello>,
    groups: HashMap<u32, SessionGroup>,
    /// Ranks listed over all of this connection's groups.
    group_ranks: usize,
}

#[derive(Debug)]
struct SessionGroup {
    /// Interned once per session so every COLL/PEER event shares it without allocating.
    name: PgName,
    desc: String,
    ranks: Vec<Rank>,
    /// The ranks listed so far, so that a repeated frame adds nothing.
    seen: std::collections::HashSet<Rank>,
}

impl Session {
    /// A session on the node named `node_host` whose underlay address is `node_addr`; both
    /// fill the [`Member`] a HELLO produces (the host only if the client left it empty).
    pub fn new(node_host: &str, node_addr: &str) -> Self {
        Session {
            node_host: node_host.to_owned(),
            node_addr: node_addr.to_owned(),
            hello: None,
            groups: HashMap::new(),
            group_ranks: 0,
        }
    }

    /// The HELLO received, if any.
    pub fn hello(&self) -> Option<&Hello> {
        self.hello.as_ref()
    }

    /// The job this connection reports for (after HELLO).
    pub fn job(&self) -> Option<&str> {
        self.hello.as_ref().map(|h| h.job.as_str())
    }

    /// The reporting rank (after HELLO).
    pub fn rank(&self) -> Option<Rank> {
        self.hello.as_ref().map(|h| h.rank)
    }

    /// The job's traffic ports, for the eBPF per-peer counters (empty before HELLO).
    pub fn ports(&self) -> &[u16] {
        self.hello.as_ref().map_or(&[], |h| h.ports.as_slice())
    }

    /// Takes the connection's next message. Every message yields an event except a GROUP
    /// frame that lists no rank its group did not have (a repeat), which changes nothing.
    pub fn accept(&mut self, msg: Message) -> Result<Option<Event>, WireError> {
        let rank = match (&self.hello, &msg) {
            (None, Message::Hello(_)) => 0,
            (None, _) => return Err(WireError::HelloFirst),
            (Some(_), Message::Hello(_)) => return Err(WireError::DuplicateHello),
            (Some(h), _) => h.rank,
        };
        let ev = match msg {
            Message::Hello(h) => {
                if h.rank >= h.world_size {
                    return Err(WireError::RankOutsideWorld {
                        rank: h.rank,
                        world_size: h.world_size,
                    });
                }
                let host = if h.host.is_empty() {
                    self.node_host.clone()
                } else {
                    h.host.clone()
                };
                let member = Member {
                    rank: h.rank,
                    world_size: h.world_size,
                    host,
                    addr: self.node_addr.clone(),
                    nic: h.nic.clone(),
                    switch: h.switch.clone(),
                    pid: h.pid,
                };
                self.hello = Some(h);
                Event::Member(member)
            }
            Message::Group {
                handle,
                name,
                desc,
                ranks,
            } => match self.group(handle, name, desc, ranks)? {
                Some(g) => Event::Group(g),
                None => return Ok(None),
            },
            Message::Coll {
                handle,
                seq,
                op,
                dtype,
                phase,
                peer,
                count,
                bytes,
                t_ns,
            } => Event::Coll(Coll {
                rank,
                pg: self.pg(handle)?,
                seq,
                op,
                dtype,
                count,
                bytes,
                out_count: 0,
                peer,
                phase,
                t_ns,
            }),
            Message::Peer {
                handle,
                seq,
                peer,
                dir,
                bytes,
                busy_ns,
                t_ns,
            } => Event::Peer(PeerProgress {
                rank,
                pg: self.pg(handle)?,
                seq,
                peer,
                dir,
                bytes,
                busy_ns,
                t_ns,
            }),
            Message::Heartbeat { t_ns } => Event::Heartbeat { rank, t_ns },
            Message::Exit { t_ns } => Event::Exit { rank, t_ns },
        };
        Ok(Some(ev))
    }

    fn pg(&self, handle: u32) -> Result<PgName, WireError> {
        self.groups
            .get(&handle)
            .map(|g| Arc::clone(&g.name))
            .ok_or(WireError::UnknownHandle(handle))
    }

    /// Registers a GROUP frame: a new handle, or the next slice of a large group's ranks.
    /// Ranks the group already lists are skipped, so the list only grows by new ranks (at
    /// most [`MAX_SESSION_GROUP_RANKS`] over the connection); a frame that adds none yields
    /// no event. The event carries the whole list so far, so it is copied once per frame
    /// that grows it: a group's size ÷ [`MAX_GROUP_RANKS_PER_FRAME`] times.
    fn group(
        &mut self,
        handle: u32,
        name: String,
        desc: String,
        ranks: Vec<Rank>,
    ) -> Result<Option<Group>, WireError> {
        if !self.groups.contains_key(&handle) && self.groups.len() >= MAX_SESSION_GROUPS {
            return Err(WireError::TooManyGroups);
        }
        let fresh = !self.groups.contains_key(&handle);
        let g = self.groups.entry(handle).or_insert_with(|| SessionGroup {
            name: PgName::from(name.as_str()),
            desc,
            ranks: Vec::new(),
            seen: std::collections::HashSet::new(),
        });
        if *g.name != *name {
            return Err(WireError::GroupRenamed {
                handle,
                old: g.name.to_string(),
                new: name,
            });
        }
        let before = g.ranks.len();
        for r in ranks {
            if g.seen.contains(&r) {
                continue;
            }
            if self.group_ranks >= MAX_SESSION_GROUP_RANKS {
                return Err(WireError::TooManyGroupRanks);
            }
            g.seen.insert(r);
            g.ranks.push(r);
            self.group_ranks += 1;
        }
        if !fresh && g.ranks.len() == before {
            return Ok(None);
        }
        Ok(Some(Group {
            name: Arc::clone(&g.name),
            desc: g.desc.clone(),
            ranks: g.ranks.clone(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(msg: &Message) -> Vec<u8> {
        let mut out = Vec::new();
        msg.encode(&mut out);
        out
    }

    #[test]
    fn fixed_size_bodies_match_the_spec() {
        let coll = Message::Coll {
            handle: 1,
            seq: 2,
            op: Op::AllReduce,
            dtype: Dtype::Float32,
            phase: Phase::End,
            peer: None,
            count: 3,
            bytes: 12,
            t_ns: 4,
        };
        assert_eq!(frame(&coll).len(), 4 + COLL_BODY);
        assert_eq!(COLL_BODY, 45);
        let peer = Message::Peer {
            handle: 1,
            seq: 2,
            peer: 3,
            dir: Dir::Recv,
            bytes: 4,
            busy_ns: 5,
            t_ns: 6,
        };
        assert_eq!(frame(&peer).len(), 4 + PEER_BODY);
        assert_eq!(PEER_BODY, 42);
        assert_eq!(frame(&Message::Exit { t_ns: 1 }).len(), 4 + TIME_BODY);
    }

    #[test]
    fn heartbeat_frame_is_byte_exact() {
        let bytes = frame(&Message::Heartbeat {
            t_ns: 0x0102_0304_0506_0708,
        });
        assert_eq!(bytes, [9, 0, 0, 0, 5, 8, 7, 6, 5, 4, 3, 2, 1]);
    }

    #[test]
    fn a_maximal_group_frame_fits_the_limit() {
        let long = "x".repeat(MAX_STR);
        let ranks: Vec<Rank> = (0..MAX_GROUP_RANKS_PER_FRAME as u32).collect();
        let bytes = frame(&Message::Group {
            handle: 0,
            name: long.clone(),
            desc: long,
            ranks,
        });
        assert!(bytes.len() - 4 <= MAX_FRAME);
    }

    #[test]
    fn a_maximal_hello_frame_fits_the_limit() {
        let long = "x".repeat(MAX_STR);
        let bytes = frame(&Message::Hello(Hello {
            job: long.clone(),
            host: long.clone(),
            nic: long.clone(),
            switch: long,
            ports: vec![1; MAX_PORTS],
            world_size: 1,
            ..Hello::default()
        }));
        assert!(bytes.len() - 4 <= MAX_FRAME);
    }

    #[test]
    fn long_strings_are_cut_at_a_char_boundary() {
        let job = "é".repeat(200); // 400 bytes, 2 per char
        let bytes = frame(&Message::Hello(Hello {
            job,
            world_size: 1,
            ..Hello::default()
        }));
        let Message::Hello(h) = Message::decode(&bytes[4..]).expect("valid frame") else {
            panic!("not a hello");
        };
        assert_eq!(h.job.len(), 254);
    }
}
