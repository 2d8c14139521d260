//! Encoding the tables ([`StateMachineData`]) so that the previous release reads them, and
//! decoding them as any release wrote them: a node upgraded in place reads the snapshot its
//! previous release stored, an agent takes a watch snapshot from a replica on either release,
//! and a member downgraded during a rolling upgrade reads what the new release stored.
//!
//! Why by hand: the encoding (bincode) is positional, so the fields later releases appended
//! to the tables are simply absent from an earlier release's bytes, and `#[serde(default)]`
//! does not help a positional format (the derived decoder fails at the end of the input).
//! This decoder reads the fields every release wrote, then each appended field in the order
//! they were appended until the input ends, and gives the rest their defaults. Fields are only
//! ever appended, never reordered or removed; a new one goes at the end of the struct and of
//! [`APPENDED`].
//!
//! The encoder writes every field the oldest release it must stay readable by knows
//! ([`DOWNGRADE_TO`]), and each later field only when it, or one after it, holds data: the
//! previous release then reads the new release's tables for as long as the cluster uses
//! nothing that release lacks (as etcd's cluster version holds new features back during an
//! upgrade, the data a new feature writes is what ends the window).
//!
//! An input that ends inside an appended field (a truncated store value) would read as if the
//! field were absent; sled checks its values' integrity and the watch travels over TLS, so that
//! is not a case this needs to catch.

use serde::de::{self, Deserialize, Deserializer, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeStruct, Serializer};

use crate::StateMachineData;

/// The fields the first release wrote, in order.
const FIRST: [&str; 7] = [
    "last_applied",
    "last_membership",
    "revision",
    "kv",
    "nodes",
    "tokens",
    "gateway",
];

/// The fields later releases appended, in the order they were appended.
const APPENDED: [&str; 8] = [
    "diagnosis",
    "sessions",
    "aggregation",
    "hosts_down",
    "bound_tokens",
    "revoked",
    "cluster_level",
    "drained",
];

const FIELDS: [&str; 15] = [
    FIRST[0],
    FIRST[1],
    FIRST[2],
    FIRST[3],
    FIRST[4],
    FIRST[5],
    FIRST[6],
    APPENDED[0],
    APPENDED[1],
    APPENDED[2],
    APPENDED[3],
    APPENDED[4],
    APPENDED[5],
    APPENDED[6],
    APPENDED[7],
];

/// How many of [`APPENDED`] the oldest release that must read these tables knows: release
/// 63c7ee8 knows all but `revoked`.
const DOWNGRADE_TO: usize = 5;

impl Serialize for StateMachineData {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // The appended fields written: those the oldest reader knows, then up to the last
        // that holds data.
        let holds = [
            self.diagnosis != Default::default(),
            self.sessions != Default::default(),
            self.aggregation != Default::default(),
            !self.hosts_down.is_empty(),
            !self.bound_tokens.is_empty(),
            !self.revoked.is_empty(),
            self.cluster_level != 0,
            !self.drained.is_empty(),
        ];
        let appended = holds
            .iter()
            .rposition(|h| *h)
            .map_or(DOWNGRADE_TO, |last| (last + 1).max(DOWNGRADE_TO));
        let mut st = s.serialize_struct("StateMachineData", FIRST.len() + appended)?;
        st.serialize_field(FIRST[0], &self.last_applied)?;
        st.serialize_field(FIRST[1], &self.last_membership)?;
        st.serialize_field(FIRST[2], &self.revision)?;
        st.serialize_field(FIRST[3], &self.kv)?;
        st.serialize_field(FIRST[4], &self.nodes)?;
        st.serialize_field(FIRST[5], &self.tokens)?;
        st.serialize_field(FIRST[6], &self.gateway)?;
        macro_rules! appended {
            ($($i:literal: $field:ident),*) => {$(
                if $i < appended {
                    st.serialize_field(APPENDED[$i], &self.$field)?;
                }
            )*};
        }
        appended!(
            0: diagnosis,
            1: sessions,
            2: aggregation,
            3: hosts_down,
            4: bound_tokens,
            5: revoked,
            6: cluster_level,
            7: drained
        );
        st.end()
    }
}

impl<'de> Deserialize<'de> for StateMachineData {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_struct("StateMachineData", &FIELDS, Tables)
    }
}

struct Tables;

/// Whether a decoding error says the input ended (bincode's `UnexpectedEnd`), the one error
/// an earlier release's shorter tables produce.
fn ended<E: std::fmt::Display>(e: &E) -> bool {
    e.to_string().contains("UnexpectedEnd")
}

impl<'de> Visitor<'de> for Tables {
    type Value = StateMachineData;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the replicated tables")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StateMachineData, A::Error> {
        let mut d = StateMachineData::default();
        macro_rules! first {
            ($($field:ident),*) => {$(
                d.$field = seq
                    .next_element()?
                    .ok_or_else(|| de::Error::missing_field(stringify!($field)))?;
            )*};
        }
        first!(
            last_applied,
            last_membership,
            revision,
            kv,
            nodes,
            tokens,
            gateway
        );
        macro_rules! appended {
            ($($field:ident),*) => {$(
                match seq.next_element() {
                    Ok(Some(value)) => d.$field = value,
                    Ok(None) => return Ok(d),
                    Err(e) if ended(&e) => return Ok(d),
                    Err(e) => return Err(e),
                }
            )*};
        }
        appended!(
            diagnosis,
            sessions,
            aggregation,
            hosts_down,
            bound_tokens,
            revoked,
            cluster_level
        );
        // Tables of a later level may carry fields this release cannot read, after the
        // level or in place of the ones it knows: say so in one sentence, read before any
        // of them, instead of a decoding error about their bytes.
        if d.cluster_level > crate::version::LEVEL {
            return Err(de::Error::custom(crate::version::too_new(d.cluster_level)));
        }
        appended!(drained);
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{decode, encode};
    use crate::Command;

    /// Tables written by release 63c7ee8 (the one before `revoked` was appended): five keys
    /// and a VIP, encoded by that release's own code (`tests/fixtures/README.md` says how).
    const BEFORE_REVOKED: &[u8] = include_bytes!("../tests/fixtures/tables-63c7ee8.bin");

    #[test]
    fn the_previous_releases_tables_decode() {
        let d: StateMachineData = decode(BEFORE_REVOKED).expect("63c7ee8's tables");
        assert_eq!(d.kv.len(), 5);
        assert_eq!(d.kv["k3"].value, "v3");
        assert_eq!(d.gateway.vips.len(), 1);
        assert_eq!(d.revision, 6);
        assert!(d.revoked.is_empty());
    }

    /// What 63c7ee8 decodes: exactly its fields (its derived decoder needs all of them and
    /// refuses bytes after the last).
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct Release63c7ee8 {
        last_applied: Option<openraft::LogId<crate::NodeId>>,
        last_membership: openraft::StoredMembership<crate::NodeId, crate::NodeInfo>,
        revision: u64,
        kv: std::collections::BTreeMap<String, crate::Versioned>,
        nodes: std::collections::BTreeMap<u64, crate::NodeMeta>,
        tokens: std::collections::BTreeMap<String, crate::JoinToken>,
        gateway: crate::GatewayTables,
        diagnosis: crate::diagnosis::DiagnosisTables,
        sessions: crate::session::Sessions,
        aggregation: crate::aggregation::AggTables,
        hosts_down: std::collections::BTreeSet<u64>,
        bound_tokens: std::collections::BTreeMap<String, crate::BoundToken>,
    }

    /// What the derived decoder of this release's fields (the decoder before this module)
    /// made of 63c7ee8's tables: an error, so a node upgraded from it could not start.
    #[test]
    fn a_derived_decoder_refuses_the_previous_releases_tables() {
        // This release's fields in order, `revoked` with the `#[serde(default)]` it had.
        #[derive(serde::Deserialize)]
        #[allow(dead_code)]
        struct Flat(
            Option<openraft::LogId<crate::NodeId>>,
            openraft::StoredMembership<crate::NodeId, crate::NodeInfo>,
            u64,
            std::collections::BTreeMap<String, crate::Versioned>,
            std::collections::BTreeMap<u64, crate::NodeMeta>,
            std::collections::BTreeMap<String, crate::JoinToken>,
            crate::GatewayTables,
            crate::diagnosis::DiagnosisTables,
            crate::session::Sessions,
            crate::aggregation::AggTables,
            std::collections::BTreeSet<u64>,
            std::collections::BTreeMap<String, crate::BoundToken>,
            #[serde(default)] std::collections::BTreeSet<u64>,
        );
        assert!(decode::<Flat>(BEFORE_REVOKED).is_err());
        assert!(decode::<Release63c7ee8>(BEFORE_REVOKED).is_ok());
    }

    #[test]
    fn the_previous_release_reads_tables_that_use_nothing_it_lacks() {
        let mut d: StateMachineData = decode(BEFORE_REVOKED).unwrap();
        d.apply_command(&Command::Put {
            key: "new".into(),
            value: "v".into(),
        });
        let old: Release63c7ee8 = decode(&encode(&d).unwrap()).expect("63c7ee8 reads it");
        assert_eq!(old.kv.len(), 6);
        // A removal's revocation is data 63c7ee8 cannot hold: from then on it cannot read.
        d.revoked.insert(4);
        assert!(decode::<Release63c7ee8>(&encode(&d).unwrap()).is_err());
        assert_eq!(decode::<StateMachineData>(&encode(&d).unwrap()).unwrap(), d);
    }

    #[test]
    fn tables_round_trip_and_every_shorter_release_decodes() {
        let mut d = StateMachineData::default();
        d.apply_command(&Command::Put {
            key: "k".into(),
            value: "v".into(),
        });
        d.hosts_down.insert(3);
        d.revoked.insert(4);
        d.cluster_level = 1;
        d.drained.insert(2);
        let bytes = encode(&d).unwrap();
        assert_eq!(decode::<StateMachineData>(&bytes).unwrap(), d);
        // What each earlier release wrote: the same fields, cut after the ones it had.
        let empty = StateMachineData::default();
        let sizes = [
            encode(&empty.diagnosis).unwrap().len(),
            encode(&empty.sessions).unwrap().len(),
            encode(&empty.aggregation).unwrap().len(),
            encode(&d.hosts_down).unwrap().len(),
            encode(&empty.bound_tokens).unwrap().len(),
            encode(&d.revoked).unwrap().len(),
            encode(&d.cluster_level).unwrap().len(),
            encode(&d.drained).unwrap().len(),
        ];
        let mut len = bytes.len();
        for (kept, size) in (0..APPENDED.len()).rev().zip(sizes.iter().rev()) {
            len -= size;
            let earlier: StateMachineData = decode(&bytes[..len]).unwrap();
            assert_eq!(earlier.kv, d.kv, "cut before {}", APPENDED[kept]);
            assert_eq!(earlier.hosts_down.len(), usize::from(kept > 3));
            assert_eq!(earlier.revoked.len(), usize::from(kept > 5));
            assert_eq!(earlier.cluster_level, u32::from(kept > 6));
            assert!(earlier.drained.is_empty());
        }
        // Cut inside the fields every release wrote, or with bytes after the last field: refused.
        assert!(decode::<StateMachineData>(&bytes[..len - 1]).is_err());
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode::<StateMachineData>(&longer).is_err());
    }

    /// Once the cluster level rose, an earlier release can no longer read the tables (that is
    /// what the level gates), and a release below the tables' level refuses them in one
    /// sentence naming both levels.
    #[test]
    fn tables_above_this_releases_level_are_refused_with_both_levels() {
        let mut d: StateMachineData = decode(BEFORE_REVOKED).unwrap();
        assert!(decode::<Release63c7ee8>(&encode(&d).unwrap()).is_ok());
        d.apply_command(&Command::SetClusterLevel {
            level: crate::version::LEVEL,
        });
        assert_eq!(d.cluster_level, crate::version::LEVEL);
        assert!(decode::<Release63c7ee8>(&encode(&d).unwrap()).is_err());
        assert_eq!(decode::<StateMachineData>(&encode(&d).unwrap()).unwrap(), d);
        // A later release's tables: a higher level, and a field this release does not know.
        d.cluster_level = crate::version::LEVEL + 1;
        let mut later = encode(&d).unwrap();
        later.extend_from_slice(&encode(&7u64).unwrap());
        let why = decode::<StateMachineData>(&later).unwrap_err().to_string();
        assert!(
            why.contains(&crate::version::too_new(crate::version::LEVEL + 1)),
            "{why}"
        );
    }
}
