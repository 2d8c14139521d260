//! Overlay tenants on compute hosts: Linux VXLAN tunnels from each compute host to a gateway VIP,
//! and one namespace per tenant behind a bridge on its host.
//!
//! Layout on compute host `h` for VNI `v` (made once per host and VNI):
//! - `vx<v>`: `type vxlan id <v> local <host addr> remote <VIP> dstport 4789 nolearning`, MTU
//!   1450 so the outer frame fits the underlay's 1500, TX checksum offload off;
//! - `br<v>`: a bridge holding `vx<v>` and one veth per tenant (`tp<n>`);
//! - a route `198.19.0.0/16 dev eth0`: the host reaches every VIP on-link, so it ARPs for the
//!   VIP on the underlay and whoever owns the VIP (the XDP gateway, or the kernel on a
//!   [`crate::kernel_gw`] host) answers.
//!
//! Each tenant is a namespace `yd<run>-t<n>` (made with [`Topology::add_namespace`], so the
//! topology's drop and the stale sweep remove it) whose `eth0` has the tenant's MAC, its address
//! in 198.19.0.0/16 (prefix /16, so every other tenant is on-link), MTU 1450 and TX checksum
//! offload off (veth carries unfinished checksums that native XDP cannot finish). Tenants get no
//! static neighbour entries: their ARP goes through the tunnel and must be answered by the
//! gateway (proxy ARP). IPv6 is off in tenants and on the devices the overlay adds to hosts, so
//! that no router solicitations or MLD reports wander through the tunnels and the gateway's
//! counters count only the test's traffic.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Output;
use std::thread;
use std::time::{Duration, Instant};

use crate::cmd;
use crate::error::{Error, Result};
use crate::topology::{thread_in_namespace, Topology};

/// The IANA VXLAN port every tunnel uses.
pub const VXLAN_PORT: u16 = 4789;

/// MTU of tenants and tunnels: 1500 minus the 50 bytes of outer Ethernet, IPv4, UDP and VXLAN.
pub const TENANT_MTU: u32 = 1450;

/// The prefix every VIP and tenant address comes from (198.19.0.0/16).
pub const OVERLAY_NET: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 0);

/// Tenants of one topology's compute hosts; see the module docs for the layout.
#[derive(Debug)]
pub struct Overlay<'a> {
    topo: &'a Topology,
    /// The VIP each (host, VNI) tunnel points at.
    tunnels: BTreeMap<(usize, u32), Ipv4Addr>,
    /// Hosts whose VIP route and IPv6 defaults are set.
    hosts_ready: Vec<usize>,
    tenants: Vec<Tenant>,
    next_tenant: usize,
}

/// One tenant: a namespace behind a compute host's bridge. Cheap to clone; it holds names, not
/// the topology, so threads and benchmark code can keep it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    ns: String,
    ip: Ipv4Addr,
    mac: [u8; 6],
    vni: u32,
    host: usize,
    host_addr: Ipv4Addr,
    vip: Ipv4Addr,
    port: String,
}

impl<'a> Overlay<'a> {
    /// An overlay with no tenants yet on `topo`.
    pub fn new(topo: &'a Topology) -> Self {
        Self {
            topo,
            tunnels: BTreeMap::new(),
            hosts_ready: Vec::new(),
            tenants: Vec::new(),
            next_tenant: 1,
        }
    }

    /// The topology underneath.
    pub fn topology(&self) -> &'a Topology {
        self.topo
    }

    /// Every tenant added so far, in order.
    pub fn tenants(&self) -> &[Tenant] {
        &self.tenants
    }

    /// Adds a tenant on compute host `host` in VNI `vni` whose traffic tunnels to `vip`: makes
    /// the host's tunnel and bridge for that VNI on first use (one VIP per host and VNI: a
    /// second tenant there must name the same VIP), then the tenant's namespace and veth, and
    /// waits until its links are up.
    pub fn add_tenant(
        &mut self,
        host: usize,
        vni: u32,
        ip: Ipv4Addr,
        mac: [u8; 6],
        vip: Ipv4Addr,
    ) -> Result<Tenant> {
        self.topo.check_host(host)?;
        if !in_overlay_net(ip) || !in_overlay_net(vip) {
            return Err(Error::Setup(format!(
                "tenant {ip} and VIP {vip} must both be in {OVERLAY_NET}/16"
            )));
        }
        if vni == 0 || vni >= 1 << 24 {
            return Err(Error::Setup(format!("VNI {vni} is not in 1..2^24")));
        }
        if mac[0] & 1 == 1 {
            return Err(Error::Setup(format!(
                "tenant MAC {} is a multicast address",
                mac_string(&mac)
            )));
        }
        if let Some(t) = self.tenants.iter().find(|t| t.ip == ip && t.vni == vni) {
            return Err(Error::Setup(format!(
                "VNI {vni} already has a tenant {ip} (in {})",
                t.ns
            )));
        }
        let hns = self.topo.ns_name(host);
        self.prepare_host(host, &hns)?;
        match self.tunnels.get(&(host, vni)) {
            Some(&v) if v != vip => {
                return Err(Error::Setup(format!(
                    "host {host} already tunnels VNI {vni} to {v}, not {vip}"
                )))
            }
            Some(_) => {}
            None => {
                self.make_tunnel(host, &hns, vni, vip)?;
                self.tunnels.insert((host, vni), vip);
            }
        }

        // Find a free tenant number (another overlay on the same topology may have used some).
        let n = loop {
            let n = self.next_tenant;
            self.next_tenant += 1;
            if n > 9999 {
                return Err(Error::Setup("too many tenants (at most 9999)".into()));
            }
            if !Path::new("/run/netns")
                .join(format!("yd{}-t{n}", self.topo.run_id()))
                .exists()
            {
                break n;
            }
        };
        let tns = self.topo.add_namespace(&format!("t{n}"))?;
        let port = format!("tp{n}");
        let mtu = TENANT_MTU.to_string();
        sysctl(
            &tns,
            &[
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            ],
        )?;
        run_ip(&[
            "-n", &hns, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &tns,
        ])?;
        run_ip(&["-n", &hns, "link", "set", &port, "mtu", &mtu])?;
        run_ip(&[
            "-n",
            &hns,
            "link",
            "set",
            &port,
            "master",
            &format!("br{vni}"),
            "up",
        ])?;
        let mac_s = mac_string(&mac);
        run_ip(&[
            "-n", &tns, "link", "set", "eth0", "address", &mac_s, "mtu", &mtu,
        ])?;
        run_ip(&[
            "-n",
            &tns,
            "addr",
            "add",
            &format!("{ip}/16"),
            "dev",
            "eth0",
        ])?;
        run_ip(&["-n", &tns, "link", "set", "eth0", "up"])?;
        ethtool_tx_off(&tns, "eth0")?;
        let tenant = Tenant {
            ns: tns,
            ip,
            mac,
            vni,
            host,
            host_addr: self.topo.addr(host),
            vip,
            port,
        };
        wait_tenant_up(&hns, &tenant)?;
        self.tenants.push(tenant.clone());
        Ok(tenant)
    }

    /// Once per compute host: IPv6 off for the devices made from now on, TX checksum offload
    /// off on `eth0` (the topology does that already; repeated so the overlay does not depend
    /// on it), and the on-link route to the VIPs.
    fn prepare_host(&mut self, host: usize, hns: &str) -> Result<()> {
        if self.hosts_ready.contains(&host) {
            return Ok(());
        }
        sysctl(hns, &["net.ipv6.conf.default.disable_ipv6=1"])?;
        ethtool_tx_off(hns, "eth0")?;
        run_ip(&[
            "-n",
            hns,
            "route",
            "replace",
            &format!("{OVERLAY_NET}/16"),
            "dev",
            "eth0",
        ])?;
        self.hosts_ready.push(host);
        Ok(())
    }

    fn make_tunnel(&self, host: usize, hns: &str, vni: u32, vip: Ipv4Addr) -> Result<()> {
        let vx = format!("vx{vni}");
        let br = format!("br{vni}");
        let local = self.topo.addr(host).to_string();
        run_ip(&[
            "-n",
            hns,
            "link",
            "add",
            &vx,
            "type",
            "vxlan",
            "id",
            &vni.to_string(),
            "local",
            &local,
            "remote",
            &vip.to_string(),
            "dstport",
            &VXLAN_PORT.to_string(),
            "nolearning",
        ])?;
        run_ip(&[
            "-n",
            hns,
            "link",
            "set",
            &vx,
            "mtu",
            &TENANT_MTU.to_string(),
        ])?;
        run_ip(&["-n", hns, "link", "add", &br, "type", "bridge"])?;
        run_ip(&["-n", hns, "link", "set", &vx, "master", &br, "up"])?;
        run_ip(&["-n", hns, "link", "set", &br, "up"])?;
        ethtool_tx_off(hns, &vx)
    }
}

impl Tenant {
    /// Its namespace, `yd<run>-t<n>`.
    pub fn ns(&self) -> &str {
        &self.ns
    }

    /// Its address on `eth0`.
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// Its `eth0` MAC.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// Its MAC as `aa:bb:cc:dd:ee:ff`, as `ip` and the yard CLI take it.
    pub fn mac_string(&self) -> String {
        mac_string(&self.mac)
    }

    /// Its VNI.
    pub fn vni(&self) -> u32 {
        self.vni
    }

    /// The compute host (1-based) it sits on.
    pub fn host(&self) -> usize {
        self.host
    }

    /// That host's underlay address: the `--host` of a gateway endpoint.
    pub fn host_addr(&self) -> Ipv4Addr {
        self.host_addr
    }

    /// The VIP its host's tunnel for its VNI points at.
    pub fn vip(&self) -> Ipv4Addr {
        self.vip
    }

    /// Its veth's name in the compute host (a port of `br<vni>`).
    pub fn host_port(&self) -> &str {
        &self.port
    }

    /// The line `yard gateway endpoint import` takes for it: `vni ip mac host`.
    pub fn endpoint_line(&self) -> String {
        format!(
            "{} {} {} {}",
            self.vni,
            self.ip,
            self.mac_string(),
            self.host_addr
        )
    }

    /// The arguments of `yard gateway endpoint add` that register this tenant.
    pub fn endpoint_add_args(&self) -> Vec<String> {
        [
            "gateway",
            "endpoint",
            "add",
            "--vni",
            &self.vni.to_string(),
            "--ip",
            &self.ip.to_string(),
            "--mac",
            &self.mac_string(),
            "--host",
            &self.host_addr.to_string(),
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// Runs a short command inside the tenant and returns its output whatever its exit status;
    /// killed after [`crate::EXEC_TIMEOUT`].
    pub fn exec<S: AsRef<OsStr>>(&self, program: impl AsRef<OsStr>, args: &[S]) -> Result<Output> {
        self.exec_with(program, args, crate::EXEC_TIMEOUT)
    }

    /// [`Tenant::exec`] with a timeout of your choosing.
    pub fn exec_with<S: AsRef<OsStr>>(
        &self,
        program: impl AsRef<OsStr>,
        args: &[S],
        timeout: Duration,
    ) -> Result<Output> {
        let mut full: Vec<&OsStr> = vec![
            OsStr::new("netns"),
            OsStr::new("exec"),
            OsStr::new(&self.ns),
            program.as_ref(),
        ];
        full.extend(args.iter().map(AsRef::as_ref));
        cmd::output(OsStr::new("ip"), &full, &[], None, timeout)
    }

    /// `ping -c count` from this tenant to `to` (200 ms apart, one second's wait for the last
    /// reply); `true` if every echo came back.
    pub fn ping(&self, to: Ipv4Addr, count: u32) -> Result<bool> {
        let out = self.ping_output(to, count)?;
        Ok(out.status.success() && ping_received(&out.stdout) == Some(count))
    }

    /// How many of `count` echoes to `to` came back.
    pub fn ping_count(&self, to: Ipv4Addr, count: u32) -> Result<u32> {
        let out = self.ping_output(to, count)?;
        Ok(ping_received(&out.stdout).unwrap_or(0))
    }

    fn ping_output(&self, to: Ipv4Addr, count: u32) -> Result<Output> {
        let count_s = count.max(1).to_string();
        self.exec_with(
            "ping",
            &[
                "-n",
                "-q",
                "-c",
                &count_s,
                "-i",
                "0.2",
                "-W",
                "1",
                &to.to_string(),
            ],
            Duration::from_secs(u64::from(count.max(1)) + 10),
        )
    }

    /// Pings `to` once at a time until one echo comes back, for up to `timeout`; returns how
    /// long that took.
    pub fn wait_reachable(&self, to: Ipv4Addr, timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        loop {
            let out = self.exec_with(
                "ping",
                &["-n", "-q", "-c", "1", "-W", "1", &to.to_string()],
                Duration::from_secs(5),
            )?;
            if out.status.success() {
                return Ok(start.elapsed());
            }
            if start.elapsed() >= timeout {
                return Err(Error::Setup(format!(
                    "tenant {} ({}) could not reach {to} within {timeout:?}",
                    self.ip, self.ns
                )));
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs `f` on a new thread inside this tenant's namespace (see
    /// [`Topology::thread_in_host`]): every socket it opens sends from the tenant.
    pub fn thread<T, F>(&self, f: F) -> Result<thread::JoinHandle<T>>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        thread_in_namespace(&self.ns, format!("tenant-{}", self.ip), f)
    }
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn mac_string(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A locally administered unicast MAC for tenant `n` of VNI `vni`: `02:77:<vni 3 bytes>:<n>`.
pub fn tenant_mac(vni: u32, n: u8) -> [u8; 6] {
    let v = vni.to_be_bytes();
    [0x02, 0x77, v[1], v[2], v[3], n]
}

fn in_overlay_net(a: Ipv4Addr) -> bool {
    let o = a.octets();
    o[0] == 198 && o[1] == 19
}

/// Parses `N received` from ping's summary line.
fn ping_received(stdout: &[u8]) -> Option<u32> {
    let text = String::from_utf8_lossy(stdout);
    let line = text.lines().find(|l| l.contains("received"))?;
    line.split(',')
        .find(|p| p.contains("received"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn wait_tenant_up(hns: &str, t: &Tenant) -> Result<()> {
    const TIMEOUT: Duration = Duration::from_secs(10);
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let port = cmd::run("ip", &["-n", hns, "-o", "link", "show", "dev", &t.port])?;
        let eth0 = cmd::run("ip", &["-n", &t.ns, "-o", "link", "show", "dev", "eth0"])?;
        let bport = cmd::run("bridge", &["-n", hns, "link", "show", "dev", &t.port])?;
        let up = |o: &Output| String::from_utf8_lossy(&o.stdout).contains("state UP");
        let fwd = String::from_utf8_lossy(&bport.stdout).contains("state forwarding");
        if up(&port) && up(&eth0) && fwd {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Error::LinkNotUp {
                what: format!("tenant {} ({}) and its port {}", t.ip, t.ns, t.port),
                timeout: TIMEOUT,
            });
        }
        thread::sleep(Duration::from_millis(20));
    }
}

pub(crate) fn run_ip(args: &[&str]) -> Result<Output> {
    cmd::run("ip", args)
}

pub(crate) fn ethtool_tx_off(ns: &str, dev: &str) -> Result<()> {
    cmd::run(
        "ip",
        &["netns", "exec", ns, "ethtool", "-K", dev, "tx", "off"],
    )?;
    Ok(())
}

pub(crate) fn sysctl(ns: &str, settings: &[&str]) -> Result<()> {
    let mut args = vec!["netns", "exec", ns, "sysctl", "-q", "-w"];
    args.extend_from_slice(settings);
    cmd::run("ip", &args)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_macs_and_endpoint_lines() {
        assert_eq!(tenant_mac(100, 7), [0x02, 0x77, 0, 0, 100, 7]);
        assert_eq!(
            mac_string(&tenant_mac(0x01_0203, 0xff)),
            "02:77:01:02:03:ff"
        );
        let t = Tenant {
            ns: "yd0000-t1".into(),
            ip: Ipv4Addr::new(198, 19, 1, 2),
            mac: tenant_mac(100, 1),
            vni: 100,
            host: 3,
            host_addr: Ipv4Addr::new(198, 18, 0, 3),
            vip: Ipv4Addr::new(198, 19, 255, 1),
            port: "tp1".into(),
        };
        assert_eq!(
            t.endpoint_line(),
            "100 198.19.1.2 02:77:00:00:64:01 198.18.0.3"
        );
    }

    #[test]
    fn reads_ping_summaries() {
        let out = b"--- 198.19.1.3 ping statistics ---\n3 packets transmitted, 2 received, 33% packet loss, time 407ms\n";
        assert_eq!(ping_received(out), Some(2));
        assert_eq!(ping_received(b"nothing"), None);
        assert!(in_overlay_net(Ipv4Addr::new(198, 19, 3, 4)));
        assert!(!in_overlay_net(Ipv4Addr::new(198, 18, 0, 4)));
    }
}
