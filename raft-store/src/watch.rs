//! The watch log: the most recently applied log entries, each encoded once, kept by every node
//! that applies the log, so that agents (hosts that hold no vote and are not Raft members) can
//! follow the state machine from any replica by log index.
//!
//! Why entries and not table changes: an agent applies exactly the entries a member applied,
//! with the same deterministic `apply`, so its tables and its change feed are a member's; the
//! actors on an agent run unchanged. Why encoded once: one write fans out to many watchers, and
//! re-encoding per watcher would make a replica's cost per write grow with its watchers' count.
//!
//! The log is bounded in entries and bytes. A watcher asking for an index older than the first
//! kept entry is told so ([`Since::Compacted`]) and takes a snapshot of the tables, then the
//! entries after it: Kubernetes' "resource version too old, relist" and etcd's compacted
//! revision, here decided by one comparison.

use std::collections::VecDeque;
use std::sync::Arc;

/// One encoded entry, shared by every reply that carries it.
pub type Encoded = Arc<Vec<u8>>;

/// What a watcher asking from some index gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Since {
    /// Entries from the asked index on, in order (at least one).
    Entries(Vec<Encoded>),
    /// Nothing after the asked index has been applied yet.
    UpToDate,
    /// The asked index is older than what the log keeps: take a snapshot first.
    Compacted,
}

/// The bounded log of recent encoded entries.
#[derive(Debug)]
pub struct WatchLog {
    entries: VecDeque<(u64, Encoded)>,
    bytes: usize,
    max_entries: usize,
    max_bytes: usize,
}

/// Entries kept by default: a watcher a few seconds behind a busy cluster still resumes from
/// the log rather than from a snapshot.
pub const DEFAULT_MAX_ENTRIES: usize = 16_384;
/// Bytes kept by default: the log's memory on a replica is bounded whatever the entry sizes.
pub const DEFAULT_MAX_BYTES: usize = 64 << 20;

impl Default for WatchLog {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_ENTRIES, DEFAULT_MAX_BYTES)
    }
}

impl WatchLog {
    /// A log that keeps at most `max_entries` entries and `max_bytes` encoded bytes (always at
    /// least the newest entry).
    pub fn new(max_entries: usize, max_bytes: usize) -> Self {
        Self {
            entries: VecDeque::new(),
            bytes: 0,
            max_entries: max_entries.max(1),
            max_bytes,
        }
    }

    /// Appends the entry at `index`. Indexes must follow each other; a gap (a snapshot was
    /// installed under the log) or a repeat empties the log first, since a watcher must never
    /// be given a sequence with a hole in it.
    pub fn push(&mut self, index: u64, encoded: Encoded) {
        if self.last_index().is_some_and(|last| index != last + 1) {
            self.clear();
        }
        self.bytes += encoded.len();
        self.entries.push_back((index, encoded));
        while self.entries.len() > 1
            && (self.entries.len() > self.max_entries || self.bytes > self.max_bytes)
        {
            if let Some((_, old)) = self.entries.pop_front() {
                self.bytes -= old.len();
            }
        }
    }

    /// Forgets every entry (a snapshot replaced the tables).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// The index of the oldest entry kept.
    pub fn first_index(&self) -> Option<u64> {
        self.entries.front().map(|(i, _)| *i)
    }

    /// The index of the newest entry kept.
    pub fn last_index(&self) -> Option<u64> {
        self.entries.back().map(|(i, _)| *i)
    }

    /// Entries from index `from` on, at most `max_bytes` of them (but always one, so a large
    /// entry still moves a watcher forward). `applied` is the index the tables stand at: a
    /// watcher asking past it is up to date; one asking before the log's first entry, or into
    /// an empty log behind `applied`, must take a snapshot.
    pub fn since(&self, from: u64, applied: u64, max_bytes: usize) -> Since {
        if from > applied {
            return Since::UpToDate;
        }
        let Some(first) = self.first_index() else {
            return Since::Compacted;
        };
        if from < first {
            return Since::Compacted;
        }
        let skip = usize::try_from(from - first).unwrap_or(usize::MAX);
        let mut out = Vec::new();
        let mut bytes = 0;
        for (_, e) in self.entries.iter().skip(skip) {
            if !out.is_empty() && bytes + e.len() > max_bytes {
                break;
            }
            bytes += e.len();
            out.push(e.clone());
        }
        if out.is_empty() {
            // `from` is within `applied` but past the kept entries: the log lost entries it
            // should have (it was cleared); a snapshot is the only safe answer.
            Since::Compacted
        } else {
            Since::Entries(out)
        }
    }

    /// Encoded bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn e(n: u8, len: usize) -> Encoded {
        Arc::new(vec![n; len])
    }

    #[test]
    fn a_watcher_resumes_from_its_index() {
        let mut log = WatchLog::new(10, 1000);
        for i in 1..=5 {
            log.push(i, e(i as u8, 3));
        }
        assert_eq!(
            log.since(3, 5, 1000),
            Since::Entries(vec![e(3, 3), e(4, 3), e(5, 3)])
        );
        assert_eq!(log.since(6, 5, 1000), Since::UpToDate);
    }

    #[test]
    fn an_index_older_than_the_log_needs_a_snapshot() {
        let mut log = WatchLog::new(3, 1000);
        for i in 1..=5 {
            log.push(i, e(i as u8, 1));
        }
        assert_eq!(log.first_index(), Some(3));
        assert_eq!(log.since(2, 5, 1000), Since::Compacted);
        assert_eq!(
            log.since(3, 5, 1000),
            Since::Entries(vec![e(3, 1), e(4, 1), e(5, 1)])
        );
    }

    #[test]
    fn bytes_bound_the_log_and_each_reply_but_one_entry_always_moves() {
        let mut log = WatchLog::new(100, 10);
        for i in 1..=4 {
            log.push(i, e(i as u8, 4));
        }
        // 16 bytes do not fit in 10: the two oldest went.
        assert_eq!(log.first_index(), Some(3));
        assert_eq!(log.bytes(), 8);
        assert_eq!(log.since(3, 4, 5), Since::Entries(vec![e(3, 4)]));
        let mut big = WatchLog::new(100, 10);
        big.push(1, e(1, 50));
        assert_eq!(big.since(1, 1, 5), Since::Entries(vec![e(1, 50)]));
    }

    #[test]
    fn a_gap_empties_the_log_so_no_watcher_skips_an_entry() {
        let mut log = WatchLog::new(100, 1000);
        log.push(1, e(1, 1));
        log.push(2, e(2, 1));
        log.push(7, e(7, 1));
        assert_eq!(log.first_index(), Some(7));
        assert_eq!(log.since(3, 7, 1000), Since::Compacted);
    }

    #[test]
    fn an_empty_log_behind_the_tables_answers_with_a_snapshot() {
        let log = WatchLog::default();
        assert_eq!(log.since(1, 9, 1000), Since::Compacted);
        assert_eq!(log.since(10, 9, 1000), Since::UpToDate);
    }

    proptest! {
        /// Whatever the bounds and the asked index, a reply is either the exact contiguous run
        /// of entries starting at the asked index, or a snapshot, or "up to date".
        #[test]
        fn replies_are_contiguous_from_the_asked_index(
            n in 1u64..200, max_entries in 1usize..64, max_bytes in 1usize..512,
            from in 0u64..220, reply_bytes in 1usize..256,
        ) {
            let mut log = WatchLog::new(max_entries, max_bytes);
            for i in 1..=n {
                log.push(i, Arc::new(i.to_le_bytes().to_vec()));
            }
            match log.since(from, n, reply_bytes) {
                Since::Entries(got) => {
                    prop_assert!(!got.is_empty());
                    for (k, enc) in got.iter().enumerate() {
                        let want = (from + k as u64).to_le_bytes();
                        prop_assert_eq!(enc.as_slice(), want.as_slice());
                    }
                }
                Since::UpToDate => prop_assert!(from > n),
                Since::Compacted => prop_assert!(from < log.first_index().unwrap_or(u64::MAX)),
            }
            prop_assert!(log.bytes() <= max_bytes.max(8));
            prop_assert!(log.first_index().is_some());
        }
    }
}
