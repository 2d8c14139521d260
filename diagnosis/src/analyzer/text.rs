//! Wording of evidence: short lowercase sentences with numbers.

use super::state::{Pg, State};
use crate::event::Rank;

/// A duration: milliseconds below ten seconds, seconds above.
pub(crate) fn dur(ns: f64) -> String {
    if ns >= 10e9 {
        format!("{:.1} s", ns / 1e9)
    } else {
        format!("{:.1} ms", ns / 1e6)
    }
}

/// A rate given in bytes per nanosecond (= GB/s), in the unit that reads best: a throttled
/// link runs at a few MB/s and "0.00 GB/s" would hide it.
pub(crate) fn rate(bytes_per_ns: f64) -> String {
    let bps = bytes_per_ns * 1e9;
    if bps >= 1e9 {
        format!("{:.2} GB/s", bps / 1e9)
    } else if bps >= 1e6 {
        format!("{:.1} MB/s", bps / 1e6)
    } else {
        format!("{:.1} kB/s", bps / 1e3)
    }
}

/// A byte count in the unit that reads best.
pub(crate) fn bytes(b: u64) -> String {
    const KIB: u64 = 1024;
    if b >= KIB * KIB && b.is_multiple_of(KIB * KIB) {
        format!("{} MiB", b / (KIB * KIB))
    } else if b >= KIB * KIB {
        format!("{:.1} MiB", b as f64 / (KIB * KIB) as f64)
    } else if b >= KIB && b.is_multiple_of(KIB) {
        format!("{} KiB", b / KIB)
    } else {
        format!("{b} B")
    }
}

/// "rank 3", "ranks 1, 4 and 6"; long lists are cut after eight.
pub(crate) fn ranks(list: &[Rank]) -> String {
    const SHOWN: usize = 8;
    match list {
        [] => "no ranks".to_string(),
        [r] => format!("rank {r}"),
        _ => {
            let shown: Vec<String> = list.iter().take(SHOWN).map(|r| r.to_string()).collect();
            if list.len() > SHOWN {
                format!("ranks {} and {} more", shown.join(", "), list.len() - SHOWN)
            } else {
                let (last, head) = shown.split_last().map_or(("", &[][..]), |(l, h)| (l, h));
                format!("ranks {} and {last}", head.join(", "))
            }
        }
    }
}

/// "pg 0", or "pg 0 (p2p)" for the point-to-point stream.
pub(crate) fn pg(pg: &Pg) -> String {
    if pg.p2p {
        format!("pg {} (p2p)", pg.name)
    } else {
        format!("pg {}", pg.name)
    }
}

/// "rank 1 (h2)" when the rank introduced itself with a host.
pub(crate) fn rank_at(state: &State, rank: Rank) -> String {
    let host = state.ranks.get(rank).map_or("", |r| r.host());
    if host.is_empty() {
        format!("rank {rank}")
    } else {
        format!("rank {rank} ({host})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_units_read_naturally() {
        assert_eq!(ranks(&[3]), "rank 3");
        assert_eq!(ranks(&[1, 4, 6]), "ranks 1, 4 and 6");
        assert_eq!(
            ranks(&(0..10).collect::<Vec<_>>()),
            "ranks 0, 1, 2, 3, 4, 5, 6, 7 and 2 more"
        );
        assert_eq!(bytes(4096), "4 KiB");
        assert_eq!(bytes(3 << 20), "3 MiB");
        assert_eq!(bytes(100), "100 B");
        assert_eq!(dur(2_500_000.0), "2.5 ms");
        assert_eq!(dur(12e9), "12.0 s");
        assert_eq!(rate(12.5), "12.50 GB/s");
        assert_eq!(rate(0.0025), "2.5 MB/s");
        assert_eq!(rate(0.000_004), "4.0 kB/s");
    }
}
