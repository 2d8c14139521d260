//! Who may tunnel into a tenant's network, pure: the (VNI, outer source) pairs the data plane
//! accepts tunnel frames from (`gw_sources`), derived from the replicated endpoint table.
//!
//! The rule: a compute host may send for a VNI when it hosts at least one endpoint of that VNI.
//! The endpoint table already says which host each tenant address lives on (the gateway
//! forwards to it), so the tie needs no table of its own and cannot drift from where the
//! gateway sends: a host that receives a VNI's traffic may send it, and no other. A host that
//! only knows a VNI (an underlay neighbour, a tenant of another VNI on a shared host) cannot
//! inject frames into it. A VTEP must therefore send from the underlay address its endpoints
//! are registered with (`--host`), which is also the address the gateway answers to.
//!
//! The set is kept as reference counts (endpoints per pair), so a change of one endpoint is one
//! lookup, and the data plane is written only when a pair appears or disappears.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use yard_raft_store::gateway::{EndpointKey, EndpointRecord};

/// One allowed pair: (VNI, the outer source address, i.e. a compute host's underlay IPv4).
pub type Source = (u32, Ipv4Addr);

/// The allowed pairs with the number of endpoints behind each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sources {
    counts: BTreeMap<Source, usize>,
}

/// What one endpoint change does to the allowed set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SourceChange {
    /// A pair that became allowed (the first endpoint of its VNI on that host).
    pub allowed: Option<Source>,
    /// A pair that is no longer allowed (the host's last endpoint of that VNI went).
    pub withdrawn: Option<Source>,
}

impl Sources {
    /// The allowed set of a whole endpoint table.
    pub fn of_table<'a>(
        endpoints: impl IntoIterator<Item = (&'a EndpointKey, &'a EndpointRecord)>,
    ) -> Self {
        let mut counts = BTreeMap::new();
        for (key, record) in endpoints {
            *counts.entry((key.vni, record.host)).or_insert(0) += 1;
        }
        Self { counts }
    }

    /// The endpoint `key` moved from host `old` to host `new` (`None`: it did not exist, or
    /// was removed). An unchanged host changes nothing.
    pub fn update(
        &mut self,
        key: &EndpointKey,
        old: Option<Ipv4Addr>,
        new: Option<Ipv4Addr>,
    ) -> SourceChange {
        let mut change = SourceChange::default();
        if old == new {
            return change;
        }
        if let Some(host) = new {
            let n = self.counts.entry((key.vni, host)).or_insert(0);
            *n += 1;
            if *n == 1 {
                change.allowed = Some((key.vni, host));
            }
        }
        if let Some(host) = old {
            let pair = (key.vni, host);
            if let Some(n) = self.counts.get_mut(&pair) {
                *n -= 1;
                if *n == 0 {
                    self.counts.remove(&pair);
                    change.withdrawn = Some(pair);
                }
            }
        }
        change
    }

    /// Whether `source` may send for `vni`.
    pub fn allows(&self, vni: u32, source: Ipv4Addr) -> bool {
        self.counts.contains_key(&(vni, source))
    }

    /// Every allowed pair, in order.
    pub fn pairs(&self) -> BTreeSet<Source> {
        self.counts.keys().copied().collect()
    }

    pub fn len(&self) -> usize {
        self.counts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }
}

/// What to write to bring a data plane holding `programmed` to `want`: (pairs to add, pairs
/// to remove), each in order.
pub fn diff(programmed: &BTreeSet<Source>, want: &BTreeSet<Source>) -> (Vec<Source>, Vec<Source>) {
    (
        want.difference(programmed).copied().collect(),
        programmed.difference(want).copied().collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(vni: u32, last: u8) -> EndpointKey {
        EndpointKey {
            vni,
            ip: Ipv4Addr::new(198, 19, 1, last),
        }
    }

    fn rec(host: u8) -> EndpointRecord {
        EndpointRecord {
            mac: [2, 0, 0, 0, 0, host],
            host: host_ip(host),
        }
    }

    fn host_ip(n: u8) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, 0, n)
    }

    #[test]
    fn a_host_may_send_for_exactly_the_vnis_it_has_endpoints_in() {
        let table: BTreeMap<EndpointKey, EndpointRecord> = [
            (key(100, 1), rec(10)),
            (key(100, 2), rec(10)),
            (key(100, 3), rec(11)),
            (key(200, 1), rec(11)),
        ]
        .into_iter()
        .collect();
        let s = Sources::of_table(&table);
        assert_eq!(
            s.pairs(),
            [(100, host_ip(10)), (100, host_ip(11)), (200, host_ip(11))]
                .into_iter()
                .collect()
        );
        // Host 10 knows VNI 200 exists (its tenant may even talk to it), but hosts none of it.
        assert!(!s.allows(200, host_ip(10)));
        // A host with no endpoint at all, in a VNI that exists.
        assert!(!s.allows(100, host_ip(66)));
        // Two endpoints on one host are one pair.
        assert_eq!(s.len(), 3);
    }

    #[test]
    fn a_pair_is_allowed_with_its_first_endpoint_and_withdrawn_with_its_last() {
        let mut s = Sources::default();
        let h = Some(host_ip(10));
        assert_eq!(
            s.update(&key(100, 1), None, h),
            SourceChange {
                allowed: Some((100, host_ip(10))),
                withdrawn: None
            }
        );
        assert_eq!(s.update(&key(100, 2), None, h), SourceChange::default());
        assert_eq!(s.update(&key(100, 1), h, None), SourceChange::default());
        assert!(s.allows(100, host_ip(10)));
        // A move to another host: the new pair in, the old one (now unused) out.
        assert_eq!(
            s.update(&key(100, 2), h, Some(host_ip(11))),
            SourceChange {
                allowed: Some((100, host_ip(11))),
                withdrawn: Some((100, host_ip(10)))
            }
        );
        // A rewrite that keeps the host (a new MAC) changes nothing.
        assert_eq!(
            s.update(&key(100, 2), Some(host_ip(11)), Some(host_ip(11))),
            SourceChange::default()
        );
        assert_eq!(
            s.update(&key(100, 2), Some(host_ip(11)), None).withdrawn,
            Some((100, host_ip(11)))
        );
        assert!(s.is_empty());
    }

    #[test]
    fn diff_writes_only_what_differs() {
        let programmed: BTreeSet<Source> = [(1, host_ip(1)), (2, host_ip(2))].into();
        let want: BTreeSet<Source> = [(2, host_ip(2)), (3, host_ip(3))].into();
        assert_eq!(
            diff(&programmed, &want),
            (vec![(3, host_ip(3))], vec![(1, host_ip(1))])
        );
        assert_eq!(diff(&want, &want), (vec![], vec![]));
    }

    proptest! {
        /// Following changes one at a time ends where deriving from the final table does, and
        /// the allowed/withdrawn reports, applied to a set, track it exactly.
        #[test]
        fn incremental_updates_equal_the_derivation_from_the_table(
            ops in proptest::collection::vec((1u32..4, 0u8..6, proptest::option::of(0u8..4)), 0..80)
        ) {
            let mut table: BTreeMap<EndpointKey, EndpointRecord> = BTreeMap::new();
            let mut s = Sources::default();
            let mut programmed: BTreeSet<Source> = BTreeSet::new();
            for (vni, ip, host) in ops {
                let k = key(vni, ip);
                let new = host.map(rec);
                let old = match new {
                    Some(r) => table.insert(k, r),
                    None => table.remove(&k),
                };
                let c = s.update(&k, old.map(|r| r.host), new.map(|r| r.host));
                if let Some(p) = c.allowed {
                    prop_assert!(programmed.insert(p));
                }
                if let Some(p) = c.withdrawn {
                    prop_assert!(programmed.remove(&p));
                }
                let derived = Sources::of_table(&table);
                prop_assert_eq!(&s, &derived);
                prop_assert_eq!(&programmed, &derived.pairs());
            }
        }
    }
}
