//! The per-host eBPF traffic counters (`Event::Counters`): cumulative bytes and packets each
//! host sent to and received from each peer host. They come from the host, not the training
//! process, so they keep ticking (flat) when a rank freezes or crashes.

use std::collections::BTreeMap;

/// Bytes per packet on the wire (a RoCE MTU), for packet counts.
const PACKET_BYTES: u64 = 4096;

/// Traffic from one node to another.
#[derive(Default)]
struct Direction {
    /// Transfers not yet counted, by the true time they finish.
    pending: BTreeMap<u64, u64>,
    bytes: u64,
    /// True time of the last counted transfer, 0 if none.
    last_ns: u64,
}

/// Cumulative traffic between every pair of nodes that has exchanged data.
#[derive(Default)]
pub(super) struct HostCounters {
    dirs: BTreeMap<(u32, u32), Direction>,
}

/// One host's view of one peer host at a tick.
pub(super) struct Reading {
    pub node: u32,
    pub peer: u32,
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub rx_packets: u64,
    /// True time of the last transfer received from the peer, 0 if none.
    pub last_rx_ns: u64,
}

impl HostCounters {
    /// Notes `bytes` sent from node `from` to node `to`, finishing at true time `end`.
    pub(super) fn record(&mut self, from: u32, to: u32, bytes: u64, end: u64) {
        if from == to || bytes == 0 {
            return;
        }
        *self
            .dirs
            .entry((from, to))
            .or_default()
            .pending
            .entry(end)
            .or_default() += bytes;
        self.dirs.entry((to, from)).or_default();
    }

    /// Both hosts' readings of every known pair at true time `t`; transfers finishing after `t`
    /// are not counted yet.
    pub(super) fn read(&mut self, t: u64) -> Vec<Reading> {
        for dir in self.dirs.values_mut() {
            let later = dir.pending.split_off(&(t.saturating_add(1)));
            for (&end, &bytes) in &dir.pending {
                dir.bytes += bytes;
                dir.last_ns = dir.last_ns.max(end);
            }
            dir.pending = later;
        }
        self.dirs
            .iter()
            .map(|(&(node, peer), out)| {
                let back = self.dirs.get(&(peer, node));
                let rx_bytes = back.map_or(0, |d| d.bytes);
                Reading {
                    node,
                    peer,
                    tx_bytes: out.bytes,
                    rx_bytes,
                    tx_packets: out.bytes.div_ceil(PACKET_BYTES),
                    rx_packets: rx_bytes.div_ceil(PACKET_BYTES),
                    last_rx_ns: back.map_or(0, |d| d.last_ns),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_count_only_finished_transfers_from_both_ends() {
        let mut c = HostCounters::default();
        c.record(0, 1, 100, 10);
        c.record(0, 1, 50, 30);
        c.record(1, 0, 7, 5);
        c.record(2, 2, 999, 1);
        let at20 = c.read(20);
        assert_eq!(at20.len(), 2, "one reading per host of the pair");
        let a = at20.iter().find(|r| r.node == 0).unwrap();
        assert_eq!(
            (a.peer, a.tx_bytes, a.rx_bytes, a.last_rx_ns),
            (1, 100, 7, 5)
        );
        assert_eq!(a.tx_packets, 1);
        let b = c.read(30).into_iter().find(|r| r.node == 1).unwrap();
        assert_eq!((b.tx_bytes, b.rx_bytes, b.last_rx_ns), (7, 150, 30));
    }
}
