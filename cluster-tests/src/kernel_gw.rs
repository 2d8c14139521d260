//! The baseline gateway: the same overlay forwarded by the Linux kernel instead of the XDP
//! gateway.
//!
//! On the gateway host, per VNI `v`:
//! - `vx<v>`: `type vxlan id <v> local <VIP> dstport 4789 nolearning`, MTU 1450, TX checksum
//!   offload off, the only port of bridge `br<v>`, with `hairpin on` (a frame that came in
//!   through the tunnel from one compute host goes back out of it to another) and `proxy_arp on`;
//! - per tenant: a VXLAN FDB entry `<tenant mac> dst <compute host>` (where to tunnel frames
//!   for it), a static bridge FDB entry `<tenant mac> → vx<v>` and a permanent neighbour entry
//!   `<tenant ip> lladdr <tenant mac>` on `br<v>`.
//!
//! ARP: the bridge answers a tenant's ARP request that arrives through the tunnel from its
//! neighbour table (the port's `proxy_arp`), so the kernel gateway, like the XDP one, answers
//! tenant ARP itself. There is no all-zeros FDB entry, so broadcasts are not flooded back to the
//! compute hosts: flooding would reflect a tenant's own ARP request back to its host, whose
//! bridge would then learn the tenant's MAC on the tunnel port and black-hole its replies
//! (tried: that breaks tenant-to-tenant ARP on the first exchange). `neigh_suppress` is no
//! alternative: the bridge never answers requests that arrive on a suppressing port, and here
//! every request arrives on the tunnel port.
//!
//! The VIP itself is a /32 on `eth0` ([`KernelGateway::assign_vip`]), and the kernel answers ARP
//! for it on the underlay; under keepalived, keepalived adds and removes it instead, and every
//! gateway host carries the same data path.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use crate::error::{Error, Result};
use crate::overlay::{ethtool_tx_off, run_ip, sysctl, Tenant, TENANT_MTU, VXLAN_PORT};
use crate::topology::Topology;

/// A kernel-forwarding gateway on one host.
#[derive(Debug, Clone)]
pub struct KernelGateway {
    host: usize,
    ns: String,
    vip: Ipv4Addr,
    vnis: BTreeSet<u32>,
}

impl KernelGateway {
    /// Prepares host `host` as a kernel gateway for `vip` (no VNI yet; IPv6 off for the devices
    /// it will make). The VIP is not assigned: call [`KernelGateway::assign_vip`], or let
    /// keepalived do it.
    pub fn new(topo: &Topology, host: usize, vip: Ipv4Addr) -> Result<Self> {
        topo.check_host(host)?;
        let ns = topo.ns_name(host);
        sysctl(&ns, &["net.ipv6.conf.default.disable_ipv6=1"])?;
        Ok(Self {
            host,
            ns,
            vip,
            vnis: BTreeSet::new(),
        })
    }

    /// [`KernelGateway::new`], the endpoints of every tenant given, and (if `own_vip`) the VIP
    /// on `eth0`.
    pub fn install(
        topo: &Topology,
        host: usize,
        vip: Ipv4Addr,
        tenants: &[Tenant],
        own_vip: bool,
    ) -> Result<Self> {
        let mut gw = Self::new(topo, host, vip)?;
        gw.add_endpoints(tenants)?;
        if own_vip {
            gw.assign_vip()?;
        }
        Ok(gw)
    }

    /// The host it runs on.
    pub fn host(&self) -> usize {
        self.host
    }

    /// The VIP its tunnels use as local address.
    pub fn vip(&self) -> Ipv4Addr {
        self.vip
    }

    /// The VNIs it forwards.
    pub fn vnis(&self) -> impl Iterator<Item = u32> + '_ {
        self.vnis.iter().copied()
    }

    /// Adds the VIP as a /32 on `eth0` (idempotent).
    pub fn assign_vip(&self) -> Result<()> {
        run_ip(&[
            "-n",
            &self.ns,
            "addr",
            "replace",
            &format!("{}/32", self.vip),
            "dev",
            "eth0",
        ])?;
        Ok(())
    }

    /// Removes the VIP from `eth0` (nothing to do if it is not there).
    pub fn remove_vip(&self) -> Result<()> {
        if self.has_vip()? {
            run_ip(&[
                "-n",
                &self.ns,
                "addr",
                "del",
                &format!("{}/32", self.vip),
                "dev",
                "eth0",
            ])?;
        }
        Ok(())
    }

    /// Whether `eth0` carries the VIP now.
    pub fn has_vip(&self) -> Result<bool> {
        has_addr(&self.ns, self.vip)
    }

    /// Makes the tunnel and bridge of `vni` if this gateway has none yet.
    pub fn add_vni(&mut self, vni: u32) -> Result<()> {
        if self.vnis.contains(&vni) {
            return Ok(());
        }
        let ns = self.ns.as_str();
        let vx = format!("vx{vni}");
        let br = format!("br{vni}");
        run_ip(&[
            "-n",
            ns,
            "link",
            "add",
            &vx,
            "type",
            "vxlan",
            "id",
            &vni.to_string(),
            "local",
            &self.vip.to_string(),
            "dstport",
            &VXLAN_PORT.to_string(),
            "nolearning",
        ])?;
        run_ip(&["-n", ns, "link", "set", &vx, "mtu", &TENANT_MTU.to_string()])?;
        run_ip(&["-n", ns, "link", "add", &br, "type", "bridge"])?;
        run_ip(&["-n", ns, "link", "set", &vx, "master", &br])?;
        run_ip(&[
            "-n",
            ns,
            "link",
            "set",
            "dev",
            &vx,
            "type",
            "bridge_slave",
            "hairpin",
            "on",
            "proxy_arp",
            "on",
        ])?;
        run_ip(&["-n", ns, "link", "set", &vx, "up"])?;
        run_ip(&["-n", ns, "link", "set", &br, "up"])?;
        ethtool_tx_off(ns, &vx)?;
        self.vnis.insert(vni);
        Ok(())
    }

    /// Forwards to `t`: its VNI's tunnel, and the FDB and neighbour entries for it.
    pub fn add_endpoint(&mut self, t: &Tenant) -> Result<()> {
        self.add_vni(t.vni())?;
        let ns = self.ns.as_str();
        let vx = format!("vx{}", t.vni());
        let br = format!("br{}", t.vni());
        let mac = t.mac_string();
        bridge(&[
            "-n",
            ns,
            "fdb",
            "replace",
            &mac,
            "dev",
            &vx,
            "dst",
            &t.host_addr().to_string(),
            "self",
            "permanent",
        ])?;
        bridge(&[
            "-n", ns, "fdb", "replace", &mac, "dev", &vx, "master", "static",
        ])?;
        run_ip(&[
            "-n",
            ns,
            "neigh",
            "replace",
            &t.ip().to_string(),
            "lladdr",
            &mac,
            "dev",
            &br,
            "nud",
            "permanent",
        ])?;
        Ok(())
    }

    /// [`KernelGateway::add_endpoint`] for each.
    pub fn add_endpoints(&mut self, tenants: &[Tenant]) -> Result<()> {
        tenants.iter().try_for_each(|t| self.add_endpoint(t))
    }

    /// Packets the gateway has sent back into the tunnels of every VNI (the VXLAN devices' TX
    /// packet counters): what it forwarded, ARP replies included.
    pub fn forwarded_packets(&self) -> Result<u64> {
        let mut total = 0;
        for vni in &self.vnis {
            let out = run_ip(&[
                "-n",
                &self.ns,
                "-s",
                "-j",
                "link",
                "show",
                "dev",
                &format!("vx{vni}"),
            ])?;
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| {
                Error::Setup(format!(
                    "unreadable `ip -s -j link` output for vx{vni}: {e}"
                ))
            })?;
            total += v[0]["stats64"]["tx"]["packets"].as_u64().unwrap_or(0);
        }
        Ok(total)
    }
}

/// Whether `eth0` in namespace `ns` carries `addr`.
pub fn has_addr(ns: &str, addr: Ipv4Addr) -> Result<bool> {
    let out = run_ip(&["-n", ns, "-4", "-o", "addr", "show", "dev", "eth0"])?;
    let needle = format!(" {addr}/");
    Ok(String::from_utf8_lossy(&out.stdout).contains(&needle))
}

fn bridge(args: &[&str]) -> Result<()> {
    crate::cmd::run("bridge", args)?;
    Ok(())
}
