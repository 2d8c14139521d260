//! Size budgets derived from the frame limit (`transport.max_frame_bytes`).
//!
//! Every Raft message travels as one frame, and a peer refuses a frame above the limit before
//! reading it. A Raft entry or an AppendEntries batch that outgrows the frame can therefore
//! never be replicated: the leader resends it forever, its followers hear no heartbeat and
//! stand for election again and again (issue 25: one batch of 240 puts of 90 KB was 21 MB, the
//! followers refused it about 1,700 times and the term climbed from 1 to 9). So each layer
//! that builds a message is held to a budget well below the frame:
//!
//! - one entry (one proposal, a batch of client writes included): a quarter of the frame;
//! - one AppendEntries payload: half of the frame, and at least one entry (which fits, since an
//!   entry is at most a quarter), leaving the other half for the request's envelope;
//! - one snapshot chunk: openraft's 3 MiB, or a quarter of the frame when that is smaller.

/// openraft 0.9's default snapshot chunk, kept when the frame has room for it.
const OPENRAFT_SNAPSHOT_CHUNK: u64 = 3 * 1024 * 1024;

/// The budgets for one frame limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RaftBudgets {
    /// The most encoded bytes one Raft entry may carry.
    pub entry_bytes: usize,
    /// The most encoded entry bytes one AppendEntries request carries (its first entry always
    /// goes, and fits, being at most `entry_bytes`).
    pub append_bytes: usize,
    /// The largest snapshot chunk sent in one InstallSnapshot request.
    pub snapshot_chunk_bytes: u64,
}

impl RaftBudgets {
    /// The budgets that keep every Raft message under `max_frame` body bytes.
    pub fn for_frame(max_frame: u32) -> Self {
        let max_frame = max_frame as usize;
        Self {
            entry_bytes: max_frame / 4,
            append_bytes: max_frame / 2,
            snapshot_chunk_bytes: OPENRAFT_SNAPSHOT_CHUNK.min(max_frame as u64 / 4),
        }
    }
}

/// The encoded size of `value` on the wire and in the log (both use bincode's standard
/// configuration, so an entry's stored bytes are its bytes in an AppendEntries frame).
pub fn encoded_len<T: serde::Serialize>(value: &T) -> usize {
    let mut counter = CountingWriter(0);
    match bincode::serde::encode_into_writer(value, &mut counter, bincode::config::standard()) {
        Ok(()) => counter.0,
        // What cannot be encoded cannot be sent either: count it as too large.
        Err(_) => usize::MAX,
    }
}

/// Counts bytes without keeping them, so measuring a 4 MiB write allocates nothing.
struct CountingWriter(usize);

impl bincode::enc::write::Writer for CountingWriter {
    fn write(&mut self, bytes: &[u8]) -> Result<(), bincode::error::EncodeError> {
        self.0 = self.0.saturating_add(bytes.len());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_leave_room_below_the_frame() {
        let b = RaftBudgets::for_frame(crate::frame::DEFAULT_MAX_FRAME);
        assert_eq!(b.entry_bytes, 4 * 1024 * 1024);
        assert_eq!(b.append_bytes, 8 * 1024 * 1024);
        assert_eq!(b.snapshot_chunk_bytes, 3 * 1024 * 1024);
        // An AppendEntries of one full entry after a full payload still fits.
        assert!(b.entry_bytes + b.append_bytes < crate::frame::DEFAULT_MAX_FRAME as usize);
        let small = RaftBudgets::for_frame(4096);
        assert_eq!(small.snapshot_chunk_bytes, 1024);
    }

    #[test]
    fn encoded_len_matches_the_codec() {
        let v = ("key".to_string(), vec![7u8; 1000]);
        assert_eq!(encoded_len(&v), crate::frame::encode(&v).unwrap().len() - 4);
    }
}
