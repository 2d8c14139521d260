//! Next hops' MACs, read from the kernel's neighbour table. The XDP programs write destination
//! MACs themselves (the gateway's outer header to a compute host, a cluster aggregator's partial
//! sum to its parent), so their shells keep a host → MAC map filled from what the kernel has
//! resolved, and make it resolve a missing host by sending it one datagram.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};

/// Parses `/proc/net/arp`: complete entries on `iface` only.
pub fn parse_proc_arp(text: &str, iface: &str) -> BTreeMap<Ipv4Addr, [u8; 6]> {
    let mut out = BTreeMap::new();
    for line in text.lines().skip(1) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let [ip, _hw, flags, mac, _mask, dev] = cols[..] else {
            continue;
        };
        let complete =
            u32::from_str_radix(flags.trim_start_matches("0x"), 16).is_ok_and(|f| f & 0x2 != 0);
        if dev != iface || !complete {
            continue;
        }
        let (Ok(ip), Some(mac)) = (ip.parse::<Ipv4Addr>(), parse_mac(mac)) else {
            continue;
        };
        if mac != [0; 6] {
            out.insert(ip, mac);
        }
    }
    out
}

/// `aa:bb:cc:dd:ee:ff` → bytes.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// Looks `hosts` up; for those the kernel has not resolved, sends one empty datagram to the
/// discard port so that it does (the answer is read on a later lookup).
pub fn resolve(hosts: &[Ipv4Addr], iface: &str) -> BTreeMap<Ipv4Addr, [u8; 6]> {
    let table = std::fs::read_to_string("/proc/net/arp")
        .map(|t| parse_proc_arp(&t, iface))
        .unwrap_or_default();
    let missing: Vec<&Ipv4Addr> = hosts.iter().filter(|h| !table.contains_key(h)).collect();
    if !missing.is_empty() {
        if let Ok(sock) = UdpSocket::bind("0.0.0.0:0") {
            for host in missing {
                let _ = sock.send_to(&[], SocketAddrV4::new(*host, 9));
            }
        }
    }
    hosts
        .iter()
        .filter_map(|h| table.get(h).map(|m| (*h, *m)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_complete_entries_on_the_interface() {
        let text =
            "IP address       HW type     Flags       HW address            Mask     Device\n\
198.18.0.5       0x1         0x2         02:00:00:00:00:05     *        eth0\n\
198.18.0.6       0x1         0x0         00:00:00:00:00:00     *        eth0\n\
198.18.0.7       0x1         0x2         02:00:00:00:00:07     *        eth1\n\
garbage line\n";
        let t = parse_proc_arp(text, "eth0");
        assert_eq!(t.len(), 1);
        assert_eq!(t[&Ipv4Addr::new(198, 18, 0, 5)], [2, 0, 0, 0, 0, 5]);
        assert_eq!(parse_mac("02:00:00:00:00"), None);
        assert_eq!(parse_mac("02:00:00:00:00:05:06"), None);
    }
}
