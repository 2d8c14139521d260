//! Faults between test hosts: links, partitions, loss and bandwidth.
//!
//! Every fault acts inside the host namespaces, so deleting them on drop clears every fault.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::fs;

use crate::cmd;
use crate::error::{io_err, Error, Result};
use crate::loss;
use crate::topology::Topology;

/// The nftables table holding partition rules in each host.
const CHAOS_TABLE: &str = "yard_chaos";

/// The nftables table holding control-port faults ([`Topology::control_fault`]) in each host,
/// apart from the partition table so that the two never replace each other.
const CONTROL_TABLE: &str = "yard_ctl";

/// A fault on one host's control traffic (its QUIC/UDP port), leaving every other packet —
/// the data plane, ARP — alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlFault {
    /// Drop `pct` percent of the control datagrams the host receives and of those it sends,
    /// each at random.
    Loss { pct: u8 },
    /// Drop every control datagram the host sends; what it receives still arrives.
    OutboundOnly,
    /// Drop every control datagram the host receives; what it sends still arrives.
    InboundOnly,
}

/// The TC filter priority of the loss program on `eth0` egress, so it can be replaced and
/// removed without touching any other filter.
const LOSS_PREF: &str = "1";

impl Topology {
    /// Sets host `i`'s `eth0` down: both ends lose carrier, as with a pulled cable, and local
    /// sends fail with "network unreachable" as they would on a real host.
    pub fn link_down(&self, i: usize) -> Result<()> {
        self.set_link(i, "down")
    }

    /// Sets host `i`'s `eth0` up again and waits until it carries traffic. Its address stays;
    /// routes come back with the link.
    pub fn link_up(&self, i: usize) -> Result<()> {
        self.set_link(i, "up")?;
        self.wait_links_up(&[i])
    }

    fn set_link(&self, i: usize, state: &str) -> Result<()> {
        self.check_host(i)?;
        cmd::run(
            "ip",
            &["-n", &self.ns_name(i), "link", "set", "eth0", state],
        )?;
        Ok(())
    }

    /// Cuts the network into sides: each group is a side, and every host named in no group
    /// forms one more side together. Hosts on different sides hear nothing from each other;
    /// hosts on one side are unaffected. Replaces any earlier partition.
    ///
    /// Each host drops, in the nftables input hook, what arrives from hosts on other sides,
    /// matched by their IPv4 address and by their MAC (which also catches traffic sent from
    /// VIPs they hold). Dropping on input at both ends is silent, as a cut cable is; dropping
    /// on output would make the sender's `sendto` fail with EPERM, which no real network does.
    /// ARP is not filtered, and XDP programs see packets before nftables does.
    pub fn partition(&self, groups: &[&[usize]]) -> Result<()> {
        let side = self.sides(groups)?;
        for i in 1..=self.hosts() {
            let blocked: Vec<usize> = (1..=self.hosts()).filter(|&j| side[j] != side[i]).collect();
            self.set_blocked(i, &blocked)?;
        }
        Ok(())
    }

    /// Cuts host `i` off from every other host: `partition(&[&[i]])`.
    pub fn isolate(&self, i: usize) -> Result<()> {
        self.partition(&[&[i]])
    }

    /// Removes every partition rule.
    pub fn heal(&self) -> Result<()> {
        for i in 1..=self.hosts() {
            self.set_blocked(i, &[])?;
        }
        Ok(())
    }

    /// Side number of each host (index 0 unused); unlisted hosts share the last side.
    fn sides(&self, groups: &[&[usize]]) -> Result<Vec<usize>> {
        let rest = groups.len();
        let mut side = vec![rest; self.hosts() + 1];
        let mut seen = BTreeSet::new();
        for (g, group) in groups.iter().enumerate() {
            for &h in group.iter() {
                self.check_host(h)?;
                if !seen.insert(h) {
                    return Err(Error::DuplicateHost { host: h });
                }
                side[h] = g;
            }
        }
        Ok(side)
    }

    /// Replaces host `i`'s chaos table so that it drops input from `blocked` (none: no table).
    fn set_blocked(&self, i: usize, blocked: &[usize]) -> Result<()> {
        // Declaring the table before deleting it makes the delete succeed when there is none;
        // nft applies the whole script atomically.
        let mut script = format!("table inet {CHAOS_TABLE}\ndelete table inet {CHAOS_TABLE}\n");
        if !blocked.is_empty() {
            let addrs: Vec<String> = blocked.iter().map(|&j| self.addr(j).to_string()).collect();
            let macs: Vec<String> = blocked.iter().map(|&j| self.mac(j)).collect();
            let _ = write!(
                script,
                "table inet {CHAOS_TABLE} {{\n\
                 \tchain input {{\n\
                 \t\ttype filter hook input priority filter - 10; policy accept;\n\
                 \t\tip saddr {{ {} }} drop\n\
                 \t\tether saddr {{ {} }} drop\n\
                 \t}}\n\
                 }}\n",
                addrs.join(", "),
                macs.join(", ")
            );
        }
        cmd::run_with_stdin(
            "ip",
            &["netns", "exec", &self.ns_name(i), "nft", "-f", "-"],
            Some(&script),
        )?;
        Ok(())
    }

    /// Applies `fault` to the control traffic on UDP `port` (the port every node's QUIC
    /// endpoint uses for both its server and its client side) of each host in `faulted`,
    /// replacing any earlier control fault.
    ///
    /// Everything is dropped on input, silently as a bad link does: what a faulted host
    /// receives in its own input hook (`udp dport port`), what it sends in every other host's
    /// input hook (`ip saddr <host> udp sport port`). Dropping in its output hook instead would
    /// make its `sendmsg` fail with EPERM, which no real network does. Random loss uses
    /// nftables' `numgen random` (this kernel has no netem).
    pub fn control_fault(&self, faulted: &[usize], port: u16, fault: ControlFault) -> Result<()> {
        for &i in faulted {
            self.check_host(i)?;
        }
        let (inbound, outbound) = match fault {
            ControlFault::Loss { pct } => {
                if pct == 0 || pct > 100 {
                    return Err(Error::Setup(format!(
                        "control loss must be 1..=100 percent, not {pct}"
                    )));
                }
                (Some(pct), Some(pct))
            }
            ControlFault::OutboundOnly => (None, Some(100)),
            ControlFault::InboundOnly => (Some(100), None),
        };
        let drop_rule = |matcher: String, pct: u8| {
            if pct >= 100 {
                format!("{matcher} drop")
            } else {
                format!("{matcher} numgen random mod 100 < {pct} drop")
            }
        };
        for h in 1..=self.hosts() {
            let mut rules = Vec::new();
            if let (true, Some(p)) = (faulted.contains(&h), inbound) {
                rules.push(drop_rule(format!("udp dport {port}"), p));
            }
            if let Some(p) = outbound {
                for &f in faulted.iter().filter(|f| **f != h) {
                    rules.push(drop_rule(
                        format!("ip saddr {} udp sport {port}", self.addr(f)),
                        p,
                    ));
                }
            }
            self.set_control_rules(h, &rules)?;
        }
        Ok(())
    }

    /// Removes every control fault.
    pub fn clear_control_faults(&self) -> Result<()> {
        for h in 1..=self.hosts() {
            self.set_control_rules(h, &[])?;
        }
        Ok(())
    }

    /// Replaces host `h`'s control table with these input rules (none: no table).
    fn set_control_rules(&self, h: usize, rules: &[String]) -> Result<()> {
        let mut script = format!("table inet {CONTROL_TABLE}\ndelete table inet {CONTROL_TABLE}\n");
        if !rules.is_empty() {
            let _ = writeln!(
                script,
                "table inet {CONTROL_TABLE} {{\n\tchain input {{\n\t\ttype filter hook input priority filter - 5; policy accept;"
            );
            for rule in rules {
                let _ = writeln!(script, "\t\t{rule}");
            }
            let _ = writeln!(script, "\t}}\n}}");
        }
        cmd::run_with_stdin(
            "ip",
            &["netns", "exec", &self.ns_name(h), "nft", "-f", "-"],
            Some(&script),
        )?;
        Ok(())
    }

    /// Drops `percent` percent of the packets host `i` sends, at random, with a TC-BPF program
    /// on `eth0` egress (this kernel has no netem). Replaces an earlier loss setting.
    ///
    /// Everything leaving the host is subject to it, ARP included, as on a bad link. Loss on
    /// both directions of a path needs `loss` on both hosts.
    pub fn loss(&self, i: usize, percent: f64) -> Result<()> {
        self.check_host(i)?;
        let object = loss::object_with_loss(percent)?;
        let path = self.dir().join(format!("loss-{i}.bpf.o"));
        fs::write(&path, object).map_err(io_err(format!("write {}", path.display())))?;
        let ns = self.ns_name(i);
        cmd::run(
            "tc",
            &["-n", &ns, "qdisc", "replace", "dev", "eth0", "clsact"],
        )?;
        let mut args: Vec<&OsStr> = [
            "-n", &ns, "filter", "replace", "dev", "eth0", "egress", "pref", LOSS_PREF, "handle",
            "1", "bpf", "da", "obj",
        ]
        .map(OsStr::new)
        .to_vec();
        args.extend([
            path.as_os_str(),
            OsStr::new("sec"),
            OsStr::new(loss::LOSS_SECTION),
        ]);
        cmd::run("tc", &args)?;
        Ok(())
    }

    /// Removes host `i`'s loss program; nothing to do if there is none.
    pub fn clear_loss(&self, i: usize) -> Result<()> {
        self.check_host(i)?;
        let ns = self.ns_name(i);
        let show = [
            "-n", &ns, "filter", "show", "dev", "eth0", "egress", "pref", LOSS_PREF,
        ];
        let shown = cmd::output(
            OsStr::new("tc"),
            &show.map(OsStr::new),
            &[],
            None,
            cmd::SETUP_TIMEOUT,
        )?;
        if !shown.status.success() || shown.stdout.is_empty() {
            return Ok(());
        }
        cmd::run(
            "tc",
            &[
                "-n", &ns, "filter", "del", "dev", "eth0", "egress", "pref", LOSS_PREF,
            ],
        )?;
        Ok(())
    }

    /// Limits what host `i` sends to `rate_mbit` Mbit/s with a TBF root qdisc on `eth0`;
    /// replaces an earlier limit.
    ///
    /// The bucket holds 10 ms of traffic (at least 10 full frames) so the limit is smooth at
    /// any timer frequency, and packets wait up to 50 ms before they are dropped, like a shallow
    /// switch buffer.
    pub fn rate_limit(&self, i: usize, rate_mbit: u32) -> Result<()> {
        self.check_host(i)?;
        self.tbf(&self.ns_name(i), "eth0", rate_mbit)
    }

    /// Limits what host `i` receives to `rate_mbit` Mbit/s: the same TBF on the fabric's bridge
    /// port toward it (with [`Topology::rate_limit`], a link limited both ways).
    pub fn rate_limit_toward(&self, i: usize, rate_mbit: u32) -> Result<()> {
        self.check_host(i)?;
        self.tbf(&self.fabric_ns(), &format!("h{i}"), rate_mbit)
    }

    fn tbf(&self, ns: &str, dev: &str, rate_mbit: u32) -> Result<()> {
        if rate_mbit == 0 {
            return Err(Error::BadRate);
        }
        let burst_bytes = (u64::from(rate_mbit) * 1_000_000 / 8 / 100).max(10 * 1514);
        cmd::run(
            "tc",
            &[
                "-n",
                ns,
                "qdisc",
                "replace",
                "dev",
                dev,
                "root",
                "tbf",
                "rate",
                &format!("{rate_mbit}mbit"),
                "burst",
                &burst_bytes.to_string(),
                "latency",
                "50ms",
            ],
        )?;
        Ok(())
    }

    /// Removes host `i`'s rate limit; nothing to do if there is none.
    pub fn clear_rate_limit(&self, i: usize) -> Result<()> {
        self.check_host(i)?;
        let ns = self.ns_name(i);
        let shown = cmd::run("tc", &["-n", &ns, "qdisc", "show", "dev", "eth0", "root"])?;
        if !String::from_utf8_lossy(&shown.stdout).contains("tbf") {
            return Ok(());
        }
        cmd::run("tc", &["-n", &ns, "qdisc", "del", "dev", "eth0", "root"])?;
        Ok(())
    }
}
