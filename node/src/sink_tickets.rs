//! Tickets for the bandwidth sink (`agg_bandwidth`): the sink times only a probe that opens
//! with a ticket this node gave a host of the cluster over the node endpoint, where its
//! certificate says who it is. Without one, anyone who reached the sink's TCP port could hold
//! its probe slots for a deadline each and delay the real probes.
//!
//! Pure: the caller gives the random ticket and the time. A ticket is good once, for
//! [`TICKET_LIFE`]; at most [`OUTSTANDING`] are outstanding, the oldest dropped for a new one
//! (a host that asked and never came back cannot fill the book).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use yard_raft_store::NodeId;

/// How long a ticket is good for: the prober connects right after it gets one.
pub const TICKET_LIFE: Duration = Duration::from_secs(5);

/// Tickets outstanding at most: the sink serves 32 probes at once.
pub const OUTSTANDING: usize = 64;

/// A ticket's bytes: what the prober writes first on its stream.
pub type Ticket = [u8; 16];

/// The tickets this node gave out and not yet taken back.
#[derive(Debug, Default)]
pub struct TicketBook {
    given: VecDeque<(Ticket, NodeId, Instant)>,
}

impl TicketBook {
    /// Records `ticket` as given to `host` at `now`.
    pub fn give(&mut self, ticket: Ticket, host: NodeId, now: Instant) {
        self.expire(now);
        if self.given.len() >= OUTSTANDING {
            self.given.pop_front();
        }
        self.given.push_back((ticket, host, now));
    }

    /// Takes `ticket` back at `now`: the host it was given to, if it is good (given, not taken
    /// back before, not expired).
    pub fn take(&mut self, ticket: &Ticket, now: Instant) -> Option<NodeId> {
        self.expire(now);
        let at = self.given.iter().position(|(t, _, _)| t == ticket)?;
        self.given.remove(at).map(|(_, host, _)| host)
    }

    fn expire(&mut self, now: Instant) {
        while self
            .given
            .front()
            .is_some_and(|(_, _, at)| now.duration_since(*at) >= TICKET_LIFE)
        {
            self.given.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_ticket_is_good_once_and_only_while_fresh() {
        let t0 = Instant::now();
        let mut book = TicketBook::default();
        book.give([1; 16], 4, t0);
        assert_eq!(book.take(&[2; 16], t0), None, "never given");
        assert_eq!(book.take(&[1; 16], t0 + Duration::from_secs(1)), Some(4));
        assert_eq!(
            book.take(&[1; 16], t0 + Duration::from_secs(1)),
            None,
            "reused"
        );
        book.give([3; 16], 5, t0);
        assert_eq!(book.take(&[3; 16], t0 + TICKET_LIFE), None, "expired");
    }

    proptest! {
        /// However many tickets are asked for, the book holds at most OUTSTANDING and the
        /// newest OUTSTANDING of them are good.
        #[test]
        fn the_book_is_bounded_and_keeps_the_newest(n in 1usize..300) {
            let t0 = Instant::now();
            let mut book = TicketBook::default();
            for i in 0..n {
                let mut t = [0u8; 16];
                t[..8].copy_from_slice(&(i as u64).to_le_bytes());
                book.give(t, i as u64, t0);
            }
            prop_assert!(book.given.len() <= OUTSTANDING);
            let first_kept = n.saturating_sub(OUTSTANDING);
            for i in 0..n {
                let mut t = [0u8; 16];
                t[..8].copy_from_slice(&(i as u64).to_le_bytes());
                let got = book.take(&t, t0);
                prop_assert_eq!(got.is_some(), i >= first_kept);
            }
        }
    }
}
