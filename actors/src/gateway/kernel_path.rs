//! The kernel path for frames to compute hosts the gateway has no MAC for, and what it must not
//! open besides.
//!
//! The XDP program hands such a frame to the stack re-addressed to the host (source: the VIP,
//! a local address), and asks the kernel's FIB for neighbours the daemon has not resolved: both
//! need IPv4 `forwarding` on the gateway interface, and the first needs `accept_local`. Set
//! alone, those settings make the node a router for anything that reaches the interface
//! (checked on namespaces: a fabric host routed ICMP through the gateway node into a network
//! on its other interface) and let the fabric deliver packets to the node's own sockets under
//! the node's own addresses (a UDP datagram with the gateway's address as its source reached
//! the gateway's UDP layer). The design needs neither. So before turning them on, the daemon
//! installs an nftables table (`ip yard_gateway`) that confines them to what the XDP program
//! hands over:
//! - forwarded from the interface: only UDP to the VXLAN port, and only back out of it;
//! - delivered locally from the interface: nothing whose source is a local address.
//!
//! Without nftables the settings stay off: frames to an unresolved host are then dropped until
//! the daemon has resolved it (a new tenant's first frames are late), which is safe.

use std::io::Write as _;
use std::process::{Command, Stdio};

/// The nftables table the daemon owns (IPv4 only: only IPv4 settings are changed).
pub const TABLE: &str = "yard_gateway";

/// The VXLAN UDP port the XDP program forwards.
const VXLAN_PORT: u16 = 4789;

/// The ruleset for gateway interface `iface`, replacing any earlier one atomically (one `nft -f`
/// transaction: the table is created if absent, deleted, and created again).
pub fn ruleset(iface: &str) -> Result<String, String> {
    if iface.is_empty() || iface.contains(['"', '\\', '\n']) {
        return Err(format!(
            "interface name {iface:?} cannot be written in an nftables rule"
        ));
    }
    Ok(format!(
        "table ip {TABLE}\n\
         delete table ip {TABLE}\n\
         table ip {TABLE} {{\n\
         \tchain forward {{\n\
         \t\ttype filter hook forward priority filter; policy accept;\n\
         \t\tiifname \"{iface}\" oifname != \"{iface}\" drop\n\
         \t\tiifname \"{iface}\" meta l4proto != udp drop\n\
         \t\tiifname \"{iface}\" udp dport != {VXLAN_PORT} drop\n\
         \t}}\n\
         \tchain input {{\n\
         \t\ttype filter hook input priority filter; policy accept;\n\
         \t\tiifname \"{iface}\" fib saddr type local drop\n\
         \t}}\n\
         }}\n"
    ))
}

/// Installs [`ruleset`] with `nft -f -`.
pub fn confine(iface: &str) -> Result<(), String> {
    let rules = ruleset(iface)?;
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run nft: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(rules.as_bytes())
            .map_err(|e| format!("cannot write the ruleset to nft: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("nft did not finish: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft refused the ruleset: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ruleset_confines_forwarding_and_local_sources_to_the_interface() {
        let r = ruleset("eth0").unwrap();
        assert!(r.starts_with("table ip yard_gateway\ndelete table ip yard_gateway\n"));
        for rule in [
            "iifname \"eth0\" oifname != \"eth0\" drop",
            "iifname \"eth0\" meta l4proto != udp drop",
            "iifname \"eth0\" udp dport != 4789 drop",
            "iifname \"eth0\" fib saddr type local drop",
        ] {
            assert!(r.contains(rule), "{rule} missing from\n{r}");
        }
        assert!(ruleset("a\"b").is_err());
        assert!(ruleset("").is_err());
    }
}
