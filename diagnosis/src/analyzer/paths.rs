//! Which component a set of slow paths points at: one host's NIC, one switch, or only the
//! paths themselves.
//!
//! A slow group only shows its own paths, and those can fit several explanations: the two
//! directions between two hosts are slow under a slow link, under either host's slow NIC and
//! under congestion at their switch. The other groups' paths tell them apart (a pipeline send
//! from one of those hosts to a third host is slow under its NIC and under congestion, not under
//! a slow link), so the decision is taken once over the paths of every group: slow paths, and
//! paths whose recent transfers were all normal.

use super::state::State;
use crate::event::Rank;
use std::collections::BTreeSet;

/// How a path relates to a host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Touch {
    /// Either end is on the host.
    Either,
    /// The sender is on the host (its NIC transmits slowly).
    Leaving,
    /// The receiver is on the host.
    Entering,
}

impl Touch {
    pub(crate) fn verb(self) -> &'static str {
        match self {
            Touch::Either => "touches",
            Touch::Leaving => "leaves",
            Touch::Entering => "enters",
        }
    }
}

/// What the slow paths have in common.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Component {
    /// One host's NIC: every slow path touches the host and none of its other paths is normal.
    Nic {
        host: String,
        /// A rank on the host, at an end of a slow path.
        rank: Rank,
        touch: Touch,
    },
    /// One switch: slow paths on several hosts that share no host, all under the switch.
    Switch { name: String, hosts: usize },
    /// Nothing in common: the paths themselves are slow.
    Paths,
}

/// Inter-host paths of the whole job, as (from, to) ranks.
#[derive(Debug, Default)]
pub(crate) struct Paths {
    /// Throughput fell below the path's own baseline (strictly, or by ratio alone).
    pub slow: BTreeSet<(Rank, Rank)>,
    /// Carried traffic with a known baseline and no slow transfer in its recent window.
    pub normal: BTreeSet<(Rank, Rank)>,
    /// Slow paths whose sender's own report (its send side, `SendWait`) is slow against its
    /// peers' pace, and those whose receiver's own report (`RecvWait`) is: which end's NIC
    /// is waiting. Only the peer comparison of paths fills these.
    pub sent_slow: BTreeSet<(Rank, Rank)>,
    pub received_slow: BTreeSet<(Rank, Rank)>,
}

impl Paths {
    /// Collects the paths between different known hosts over every group.
    pub(crate) fn collect(state: &State) -> Paths {
        let mut p = Paths::default();
        for pg in &state.pgs {
            for (&(from, to), pair) in &pg.pairs {
                if !inter_host(state, from, to) {
                    continue;
                }
                if pair.hits.active() || pair.rel_hits.active() {
                    p.slow.insert((from, to));
                } else if pair.base.value().is_some()
                    && pair.hits.count() == 0
                    && pair.rel_hits.count() == 0
                {
                    p.normal.insert((from, to));
                }
            }
        }
        let slow = &p.slow;
        p.normal.retain(|k| !slow.contains(k));
        p
    }

    /// The component the slow paths point at.
    pub(crate) fn component(&self, state: &State) -> Component {
        let Some(&first) = self.slow.iter().next() else {
            return Component::Paths;
        };
        let host = |r: Rank| host(state, r);
        let touches = |p: &(Rank, Rank), h: &str, t: Touch| match t {
            Touch::Either => host(p.0) == h || host(p.1) == h,
            Touch::Leaving => host(p.0) == h,
            Touch::Entering => host(p.1) == h,
        };
        for touch in [Touch::Either, Touch::Leaving, Touch::Entering] {
            let candidates: BTreeSet<&str> = [host(first.0), host(first.1)]
                .into_iter()
                .filter(|h| self.slow.iter().all(|p| touches(p, h, touch)))
                .collect();
            let passing: Vec<&str> = candidates
                .into_iter()
                .filter(|h| !self.normal.iter().any(|p| touches(p, h, touch)))
                .collect();
            match passing.as_slice() {
                [] => continue,
                [h] => {
                    // One slow path in and one out (a ring through the host) fit a NIC and a
                    // slow link with its knock-on: the host forwards what it receives, so
                    // the hop after a slow link waits too. A NIC needs slow paths to at least
                    // two peer hosts in one direction, or the host's own ends of one path in
                    // and one out to two different hosts waiting on the network: its receive
                    // of the path in and its send of the path out. A knock-on hop's sender
                    // waits for data, not for the network, so its send side is not slow.
                    let peers = |leaving: bool| -> BTreeSet<&str> {
                        self.slow
                            .iter()
                            .filter_map(|p| match leaving {
                                true if host(p.0) == *h => Some(host(p.1)),
                                false if host(p.1) == *h => Some(host(p.0)),
                                _ => None,
                            })
                            .collect()
                    };
                    let (out, into) = (peers(true), peers(false));
                    if out.len() < 2 && into.len() < 2 && !self.own_ends_slow(state, h, &out, &into)
                    {
                        return Component::Paths;
                    }
                    let rank = if host(first.0) == *h {
                        first.0
                    } else {
                        first.1
                    };
                    return Component::Nic {
                        host: h.to_string(),
                        rank,
                        touch,
                    };
                }
                // Two hosts explain it equally (only the paths between them are known): the
                // link between them is all that can be named.
                _ => return Component::Paths,
            }
        }
        // Congestion: the slow paths share no host but do share a switch.
        let shared_host = [host(first.0), host(first.1)]
            .into_iter()
            .any(|h| self.slow.iter().all(|p| touches(p, h, Touch::Either)));
        if shared_host {
            return Component::Paths;
        }
        let switch = |r: Rank| {
            state
                .ranks
                .get(r)
                .and_then(|s| s.info.as_deref())
                .map_or("", |m| m.switch.as_str())
        };
        let common = [switch(first.0), switch(first.1)].into_iter().find(|s| {
            !s.is_empty()
                && self
                    .slow
                    .iter()
                    .all(|p| switch(p.0) == *s || switch(p.1) == *s)
        });
        match common {
            Some(sw) => {
                let hosts: BTreeSet<&str> = self
                    .slow
                    .iter()
                    .flat_map(|p| [host(p.0), host(p.1)])
                    .collect();
                Component::Switch {
                    name: sw.to_string(),
                    hosts: hosts.len(),
                }
            }
            None => Component::Paths,
        }
    }
}

impl Paths {
    /// The slow paths of host `h` go in from one host and out to another, and every one is
    /// slow at `h`'s own end: received slowly by its ranks, sent slowly by its ranks.
    fn own_ends_slow(
        &self,
        state: &State,
        h: &str,
        out: &BTreeSet<&str>,
        into: &BTreeSet<&str>,
    ) -> bool {
        out.len() == 1
            && into.len() == 1
            && out != into
            && self.slow.iter().all(|p| {
                if host(state, p.1) == h {
                    self.received_slow.contains(p)
                } else {
                    self.sent_slow.contains(p)
                }
            })
    }
}

/// The host a rank introduced itself with ("" if unknown).
pub(crate) fn host(state: &State, r: Rank) -> &str {
    state.ranks.get(r).map_or("", |s| s.host())
}

/// Both ends are on known, different hosts: the path leaves a host through its NIC.
fn inter_host(state: &State, from: Rank, to: Rank) -> bool {
    let (a, b) = (host(state, from), host(state, to));
    !a.is_empty() && !b.is_empty() && a != b
}
