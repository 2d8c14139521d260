//! Decoding the tables ([`StateMachineData`]) as any release wrote them, so that a node
//! upgraded in place reads the snapshot its previous release stored, and an agent takes a
//! watch snapshot from a replica still on the previous release.
//!
//! Why by hand: the encoding (bincode) is positional, so the fields later releases appended
//! to the tables are simply absent from an earlier release's bytes, and `#[serde(default)]`
//! does not help a positional format (the derived decoder fails at the end of the input).
//! This decoder reads the fields every release wrote, then each appended field in the order
//! they were appended until the input ends, and gives the rest their defaults. Fields are only
//! ever appended, never reordered or removed; a new one goes at the end of the struct and of
//! [`APPENDED`].
//!
//! An input that ends inside an appended field (a truncated store value) would read as if the
//! field were absent; sled checks its values' integrity and the watch travels over TLS, so that
//! is not a case this needs to catch.

use serde::de::{self, Deserialize, Deserializer, SeqAccess, Visitor};

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
const APPENDED: [&str; 6] = [
    "diagnosis",
    "sessions",
    "aggregation",
    "hosts_down",
    "bound_tokens",
    "revoked",
];

const FIELDS: [&str; 13] = [
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
];

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
            revoked
        );
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

    #[test]
    fn tables_round_trip_and_every_shorter_release_decodes() {
        let mut d = StateMachineData::default();
        d.apply_command(&Command::Put {
            key: "k".into(),
            value: "v".into(),
        });
        d.hosts_down.insert(3);
        d.revoked.insert(4);
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
        ];
        let mut len = bytes.len();
        for (kept, size) in (0..APPENDED.len()).rev().zip(sizes.iter().rev()) {
            len -= size;
            let earlier: StateMachineData = decode(&bytes[..len]).unwrap();
            assert_eq!(earlier.kv, d.kv, "cut before {}", APPENDED[kept]);
            assert_eq!(earlier.hosts_down.len(), usize::from(kept > 3));
            assert!(earlier.revoked.is_empty());
        }
        // Cut inside the fields every release wrote, or with bytes after the last field: refused.
        assert!(decode::<StateMachineData>(&bytes[..len - 1]).is_err());
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode::<StateMachineData>(&longer).is_err());
    }
}
