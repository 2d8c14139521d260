//! The aggregation frame: a 32-byte header after UDP, then `count` little-endian int32 values
//! (`struct agg_hdr` in `ebpf/bpf/yard.h`; the protocol is docs/aggregation-protocol.md).
//!
//! Every frame carries a 32-bit token (version 3): a DATA frame its sender's token at the
//! aggregator, a RESULT frame the aggregator's result token. The control plane draws them per
//! job, epoch, aggregator and worker from a secret only the cluster and the members know
//! (`yard_actors::aggregator::auth`), so a host that can forge a member's or the aggregator's
//! address but cannot read their traffic cannot make a frame that is taken.

use std::fmt;

/// The UDP port aggregators listen on (`AGG_PORT`).
pub const PORT: u16 = 7481;
/// `AGG_MAGIC`: "YAGG" on the wire.
pub const MAGIC: u32 = u32::from_le_bytes(*b"YAGG");
/// `AGG_VERSION`: 3 since every frame carries a token (version 2 had a reserved field there and
/// 16-bit `worker` and `contributors`; version 1 carried contributors in `worker`).
pub const VERSION: u8 = 3;
/// Bytes of the header.
pub const HEADER_LEN: usize = 32;
/// `AGG_VALUES_MAX`: most values in one frame.
pub const VALUES_MAX: usize = 768;
/// `AGG_WORKERS_MAX`: members of one job at one aggregator, the worker indices a header may
/// carry (the contribution bitmap is one u64); a tree spreads a larger job over clusters.
pub const WORKERS_MAX: usize = 64;
/// IPv4 (no options) and UDP headers in front of ours.
pub const IP_UDP_LEN: usize = 20 + 8;
/// `AGG_F_RETX`: a worker's resend after a timeout.
pub const FLAG_RETX: u8 = 0x01;
/// `AGG_F_REPLAY`: a regrouped worker's stored result of its last completed round (see
/// [`crate::worker::Worker::set_membership`]).
pub const FLAG_REPLAY: u8 = 0x02;

/// What a frame is (`enum agg_kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Worker to aggregator: one chunk of one round's gradient.
    Data = 1,
    /// Aggregator to worker: the chunk's sum.
    Result = 2,
    /// Internal to the aggregator host (XDP to its TC fan-out); dropped if received.
    Fanout = 3,
}

impl Kind {
    fn from_raw(raw: u8) -> Option<Kind> {
        match raw {
            1 => Some(Kind::Data),
            2 => Some(Kind::Result),
            3 => Some(Kind::Fanout),
            _ => None,
        }
    }
}

/// A gradient's element type (`enum agg_dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// int32: summed exactly, wrapping modulo 2^32 as int32 adds do.
    I32 = 0,
    /// float32: carried as block fixed point ([`crate::fixed`]).
    F32 = 1,
}

impl Dtype {
    /// Decodes `enum agg_dtype`.
    pub fn from_raw(raw: u8) -> Option<Dtype> {
        match raw {
            0 => Some(Dtype::I32),
            1 => Some(Dtype::F32),
            _ => None,
        }
    }

    /// Stable lowercase name (`i32`, `f32`), as the CLI takes it.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::I32 => "i32",
            Dtype::F32 => "f32",
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Dtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "i32" => Ok(Dtype::I32),
            "f32" => Ok(Dtype::F32),
            other => Err(format!("unknown dtype {other:?}: expected i32 or f32")),
        }
    }
}

/// The header's fields (magic and version are implied).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Header {
    pub kind: Kind,
    pub flags: u8,
    /// float32: the chunk's block exponent; int32: 0.
    pub exp: i8,
    pub job: u32,
    pub epoch: u32,
    pub round: u32,
    pub chunk: u32,
    /// Data: the sender's index in the job (below [`WORKERS_MAX`]); Result: 0. One byte on the
    /// wire: a value above 255 is written as 255, which no aggregator takes.
    pub worker: u16,
    /// Values that follow.
    pub count: u16,
    /// Result: how many contributions the sum holds. A count, never an index, so it may reach
    /// [`WORKERS_MAX`] (a root summing 64 members); Data: 0. One byte on the wire, like
    /// `worker`.
    pub contributors: u16,
    /// Data: the sender's token at the aggregator ([`crate::worker::Membership::token`]);
    /// Result: the aggregator's result token ([`crate::worker::Membership::result_token`]).
    pub token: u32,
}

/// Why bytes are not an aggregation frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("an aggregation frame needs {HEADER_LEN} header bytes, got {0}")]
    Short(usize),
    #[error("bad magic {0:#010x}: not an aggregation frame")]
    Magic(u32),
    #[error("unsupported protocol version {0}")]
    Version(u8),
    #[error("unknown frame kind {0}")]
    Kind(u8),
    #[error("a frame carries 1 to {VALUES_MAX} values, this one says {0}")]
    Count(u16),
    #[error("the header announces {announced} values but {present} bytes follow it")]
    Truncated { announced: u16, present: usize },
}

impl Header {
    /// Appends the 32 header bytes to `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.push(VERSION);
        out.push(self.kind as u8);
        out.push(self.flags);
        out.push(self.exp.to_le_bytes()[0]);
        for v in [self.job, self.epoch, self.round, self.chunk] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.push(u8::try_from(self.worker).unwrap_or(u8::MAX));
        out.push(u8::try_from(self.contributors).unwrap_or(u8::MAX));
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.token.to_le_bytes());
    }

    /// Parses a UDP payload: the header and the bytes of its values (exactly `count` x 4;
    /// trailing bytes, such as Ethernet padding, are ignored).
    pub fn parse(buf: &[u8]) -> Result<(Header, &[u8]), WireError> {
        if buf.len() < HEADER_LEN {
            return Err(WireError::Short(buf.len()));
        }
        let u32_at =
            |at: usize| u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
        let u16_at = |at: usize| u16::from_le_bytes([buf[at], buf[at + 1]]);
        let magic = u32_at(0);
        if magic != MAGIC {
            return Err(WireError::Magic(magic));
        }
        if buf[4] != VERSION {
            return Err(WireError::Version(buf[4]));
        }
        let kind = Kind::from_raw(buf[5]).ok_or(WireError::Kind(buf[5]))?;
        let count = u16_at(26);
        if count == 0 || usize::from(count) > VALUES_MAX {
            return Err(WireError::Count(count));
        }
        let body = &buf[HEADER_LEN..];
        let need = usize::from(count) * 4;
        if body.len() < need {
            return Err(WireError::Truncated {
                announced: count,
                present: body.len(),
            });
        }
        let header = Header {
            kind,
            flags: buf[6],
            exp: i8::from_le_bytes([buf[7]]),
            job: u32_at(8),
            epoch: u32_at(12),
            round: u32_at(16),
            chunk: u32_at(20),
            worker: u16::from(buf[24]),
            count,
            contributors: u16::from(buf[25]),
            token: u32_at(28),
        };
        Ok((header, &body[..need]))
    }
}

/// A whole UDP payload: `header` (its count set from `values`) and the values.
pub fn encode(header: &Header, values: &[i32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + values.len() * 4);
    let mut h = *header;
    h.count = u16::try_from(values.len()).unwrap_or(u16::MAX);
    h.write(&mut out);
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// The values of a parsed frame's body.
pub fn values(body: &[u8]) -> Vec<i32> {
    body.chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// How a gradient of `values` elements is cut into chunks of `chunk_values`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub values: u32,
    pub chunk_values: u16,
}

impl Geometry {
    /// The largest chunk a link of `mtu` (the IPv4 MTU: IP header included) carries in one
    /// frame, at most [`VALUES_MAX`]; `None` if not even one value fits.
    pub fn chunk_values_for_mtu(mtu: u32) -> Option<u16> {
        let room = usize::try_from(mtu)
            .ok()?
            .checked_sub(IP_UDP_LEN + HEADER_LEN)?
            / 4;
        let v = room.min(VALUES_MAX);
        (v > 0).then(|| u16::try_from(v).unwrap_or(u16::MAX))
    }

    /// Number of chunks (the last may be shorter).
    pub fn chunks(&self) -> u32 {
        self.values.div_ceil(u32::from(self.chunk_values.max(1)))
    }

    /// Values in `chunk`; 0 past the end.
    pub fn chunk_len(&self, chunk: u32) -> usize {
        let cv = u32::from(self.chunk_values.max(1));
        let start = u64::from(chunk) * u64::from(cv);
        let left = u64::from(self.values).saturating_sub(start);
        usize::try_from(left.min(u64::from(cv))).unwrap_or(0)
    }

    /// Where `chunk` starts in the gradient.
    pub fn chunk_start(&self, chunk: u32) -> usize {
        usize::try_from(u64::from(chunk) * u64::from(self.chunk_values)).unwrap_or(usize::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header() -> Header {
        Header {
            kind: Kind::Data,
            flags: FLAG_RETX,
            exp: -3,
            job: 7,
            epoch: 2,
            round: 41,
            chunk: 9,
            worker: 3,
            count: 3,
            contributors: 0,
            token: 0xdead_beef,
        }
    }

    #[test]
    fn a_frame_round_trips() {
        let bytes = encode(&header(), &[1, -2, i32::MAX]);
        assert_eq!(bytes.len(), HEADER_LEN + 12);
        assert_eq!(&bytes[..4], b"YAGG");
        let (h, body) = Header::parse(&bytes).unwrap();
        assert_eq!(h, header());
        assert_eq!(values(body), [1, -2, i32::MAX]);
    }

    #[test]
    fn a_result_of_64_contributions_keeps_its_count_apart_from_the_worker_index() {
        let h = Header {
            kind: Kind::Result,
            worker: 0,
            contributors: WORKERS_MAX as u16,
            ..header()
        };
        let bytes = encode(&h, &[1, 2, 3]);
        assert_eq!(bytes[24], 0, "worker");
        assert_eq!(bytes[25], 64, "contributors");
        assert_eq!(&bytes[28..32], &0xdead_beefu32.to_le_bytes(), "token");
        assert_eq!(Header::parse(&bytes).unwrap().0, h);
    }

    #[test]
    fn bad_frames_are_refused_with_the_reason() {
        let good = encode(&header(), &[1, 2, 3]);
        assert_eq!(Header::parse(&good[..31]), Err(WireError::Short(31)));
        let mut b = good.clone();
        b[0] = b'X';
        assert!(matches!(Header::parse(&b), Err(WireError::Magic(_))));
        let mut b = good.clone();
        b[4] = 2;
        assert_eq!(
            Header::parse(&b),
            Err(WireError::Version(2)),
            "version 2 carried no token"
        );
        let mut b = good.clone();
        b[5] = 9;
        assert_eq!(Header::parse(&b), Err(WireError::Kind(9)));
        let mut b = good.clone();
        b[26..28].copy_from_slice(&0u16.to_le_bytes());
        assert_eq!(Header::parse(&b), Err(WireError::Count(0)));
        assert_eq!(
            Header::parse(&good[..good.len() - 1]),
            Err(WireError::Truncated {
                announced: 3,
                present: 11
            })
        );
    }

    #[test]
    fn chunk_geometry_covers_the_gradient_exactly() {
        assert_eq!(Geometry::chunk_values_for_mtu(1500), Some(360));
        assert_eq!(Geometry::chunk_values_for_mtu(9000), Some(768));
        assert_eq!(Geometry::chunk_values_for_mtu(60), None);
        let g = Geometry {
            values: 1_000_003,
            chunk_values: 360,
        };
        assert_eq!(g.chunks(), 2778);
        assert_eq!(g.chunk_len(2777), 1_000_003 - 2777 * 360);
        assert_eq!(g.chunk_len(2778), 0);
    }

    proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Header::parse(&bytes);
        }

        #[test]
        fn chunks_sum_to_the_values(values in 1u32..5_000_000, cv in 1u16..=768) {
            let g = Geometry { values, chunk_values: cv };
            let total: usize = (0..g.chunks()).map(|c| g.chunk_len(c)).sum();
            prop_assert_eq!(total, values as usize);
        }
    }
}
