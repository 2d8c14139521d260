//! The failover baseline: Debian's `keepalived` (VRRP) moving one VIP between gateway hosts
//! that each carry the same kernel-forwarding data path ([`crate::kernel_gw`]).
//!
//! Each host runs `keepalived --dont-fork --log-console --log-detail --no-syslog --vrrp` under
//! `ip netns exec` (started through the topology, so it is killed when the topology is dropped)
//! with its own config and pid files in the run directory. One VRRP instance on `eth0`: unicast
//! adverts to the other gateway hosts (no multicast), every host starting as BACKUP with a
//! distinct priority (the first host listed highest), preemption on (the default), the VIP as a
//! /32 on `eth0`. Everything else is keepalived's default unless [`VrrpSettings`] says so.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{io_err, Error, Result};
use crate::kernel_gw::has_addr;
use crate::process::Process;
use crate::topology::Topology;

/// Where Debian installs it.
pub const KEEPALIVED_BIN: &str = "/usr/sbin/keepalived";

/// The VRRP settings of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct VrrpSettings {
    /// A short name for reports ("default", "fastest").
    pub name: String,
    /// 2 or 3.
    pub version: u8,
    /// Advert interval in seconds (VRRPv3 carries centiseconds, so 0.01 is its floor;
    /// VRRPv2 carries whole seconds).
    pub advert_int_s: f64,
    /// Master-down timer in advert intervals (`down_timer_adverts`, 1-100; `None`: the RFC's
    /// 3 plus skew).
    pub down_timer_adverts: Option<u8>,
    /// `vrrp_garp_master_delay` (s; `None`: keepalived's default, 5).
    pub garp_master_delay_s: Option<u32>,
    /// `vrrp_garp_master_repeat` (`None`: keepalived's default, 5).
    pub garp_master_repeat: Option<u32>,
}

impl VrrpSettings {
    /// keepalived as installed: VRRPv2, `advert_int 1`, master down after 3 adverts + skew
    /// (≈3.6 s), 5 GARPs on takeover and 5 more 5 s later.
    pub fn default_settings() -> Self {
        Self {
            name: "default".into(),
            version: 2,
            advert_int_s: 1.0,
            down_timer_adverts: None,
            garp_master_delay_s: None,
            garp_master_repeat: None,
        }
    }

    /// The fastest the man page documents without leaving the RFC: VRRPv3 with
    /// `advert_int 0.01` (its centisecond floor), master down after 3 adverts + skew
    /// (≈30-40 ms). `down_timer_adverts` 1 would be faster still but turns any one late advert
    /// on a busy 2-core VM into two masters; set it explicitly to try.
    pub fn fastest() -> Self {
        Self {
            name: "fastest".into(),
            version: 3,
            advert_int_s: 0.01,
            down_timer_adverts: None,
            garp_master_delay_s: None,
            garp_master_repeat: None,
        }
    }

    /// The master-down interval the RFC formula gives for a backup of `priority`
    /// (`down_timer_adverts × advert_int + skew`, skew = (256 − priority) × advert_int / 256).
    pub fn master_down_s(&self, priority: u8) -> f64 {
        let adverts = f64::from(self.down_timer_adverts.unwrap_or(3));
        let skew = (256.0 - f64::from(priority)) * self.advert_int_s / 256.0;
        adverts * self.advert_int_s
            + if self.down_timer_adverts.is_some() {
                0.0
            } else {
                skew
            }
    }

    /// The settings as JSON, for reports.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.name,
            "vrrp_version": self.version,
            "advert_int_s": self.advert_int_s,
            "down_timer_adverts": self.down_timer_adverts,
            "vrrp_garp_master_delay_s": self.garp_master_delay_s,
            "vrrp_garp_master_repeat": self.garp_master_repeat,
        })
    }
}

/// keepalived on some gateway hosts, guarding one VIP.
#[derive(Debug)]
pub struct Keepalived {
    vip: Ipv4Addr,
    settings: VrrpSettings,
    /// (host, namespace, priority, process, config path)
    members: Vec<Member>,
}

#[derive(Debug)]
struct Member {
    host: usize,
    ns: String,
    priority: u8,
    process: Option<Process>,
    config: PathBuf,
}

/// The priority of the `k`-th host listed (0-based): 200, 150, 100, …
fn priority(k: usize) -> u8 {
    u8::try_from(200usize.saturating_sub(50 * k).max(10)).unwrap_or(10)
}

/// keepalived's config for `host` among `hosts`.
pub fn config(
    topo: &Topology,
    hosts: &[usize],
    host: usize,
    vip: Ipv4Addr,
    settings: &VrrpSettings,
    router_id: u8,
) -> Result<String> {
    let k = hosts
        .iter()
        .position(|&h| h == host)
        .ok_or_else(|| Error::Setup(format!("host {host} is not among {hosts:?}")))?;
    let mut c = String::new();
    let _ = writeln!(c, "global_defs {{");
    let _ = writeln!(c, "    router_id gw{host}");
    let _ = writeln!(c, "    vrrp_version {}", settings.version);
    if let Some(d) = settings.garp_master_delay_s {
        let _ = writeln!(c, "    vrrp_garp_master_delay {d}");
    }
    if let Some(r) = settings.garp_master_repeat {
        let _ = writeln!(c, "    vrrp_garp_master_repeat {r}");
    }
    let _ = writeln!(c, "}}");
    let _ = writeln!(c, "vrrp_instance VI_GW {{");
    let _ = writeln!(c, "    state BACKUP");
    let _ = writeln!(c, "    interface eth0");
    let _ = writeln!(c, "    virtual_router_id {router_id}");
    let _ = writeln!(c, "    priority {}", priority(k));
    let _ = writeln!(c, "    advert_int {}", settings.advert_int_s);
    if let Some(n) = settings.down_timer_adverts {
        let _ = writeln!(c, "    down_timer_adverts {n}");
    }
    let _ = writeln!(c, "    unicast_src_ip {}", topo.addr(host));
    let _ = writeln!(c, "    unicast_peer {{");
    for &peer in hosts.iter().filter(|&&h| h != host) {
        let _ = writeln!(c, "        {}", topo.addr(peer));
    }
    let _ = writeln!(c, "    }}");
    let _ = writeln!(c, "    virtual_ipaddress {{");
    let _ = writeln!(c, "        {vip}/32 dev eth0");
    let _ = writeln!(c, "    }}");
    let _ = writeln!(c, "}}");
    Ok(c)
}

impl Keepalived {
    /// Writes each host's config and starts keepalived on every host in `hosts` (the first
    /// gets the highest priority and so becomes master), each host already carrying the
    /// kernel data path for `vip`. Fails if the config does not pass `keepalived -t`.
    pub fn start(
        topo: &Topology,
        hosts: &[usize],
        vip: Ipv4Addr,
        settings: &VrrpSettings,
    ) -> Result<Self> {
        if !std::path::Path::new(KEEPALIVED_BIN).exists() {
            return Err(Error::Setup(format!(
                "{KEEPALIVED_BIN} not found; install Debian's keepalived (deploy/install-deps.sh)"
            )));
        }
        if hosts.len() < 2 {
            return Err(Error::Setup("keepalived needs at least two hosts".into()));
        }
        let router_id = 51;
        let mut members = Vec::new();
        for (k, &host) in hosts.iter().enumerate() {
            topo.check_host(host)?;
            let dir = topo.dir().join(format!("keepalived-{host}"));
            std::fs::create_dir_all(&dir).map_err(io_err(format!("create {}", dir.display())))?;
            let path = dir.join("keepalived.conf");
            let text = config(topo, hosts, host, vip, settings, router_id)?;
            std::fs::write(&path, text).map_err(io_err(format!("write {}", path.display())))?;
            let check = topo.exec(
                host,
                KEEPALIVED_BIN,
                &[
                    std::ffi::OsStr::new("--config-test"),
                    std::ffi::OsStr::new("--use-file"),
                    path.as_os_str(),
                ],
            )?;
            if !check.status.success() {
                return Err(Error::Setup(format!(
                    "keepalived rejects {}: {}{}",
                    path.display(),
                    String::from_utf8_lossy(&check.stdout).trim(),
                    String::from_utf8_lossy(&check.stderr).trim()
                )));
            }
            members.push(Member {
                host,
                ns: topo.ns_name(host),
                priority: priority(k),
                process: None,
                config: path,
            });
        }
        let mut ka = Self {
            vip,
            settings: settings.clone(),
            members,
        };
        for host in hosts {
            ka.start_host(topo, *host)?;
        }
        Ok(ka)
    }

    /// (Re)starts keepalived on `host`.
    pub fn start_host(&mut self, topo: &Topology, host: usize) -> Result<Process> {
        let m = self
            .members
            .iter_mut()
            .find(|m| m.host == host)
            .ok_or_else(|| Error::Setup(format!("host {host} runs no keepalived here")))?;
        let dir = m
            .config
            .parent()
            .map(PathBuf::from)
            .unwrap_or_else(|| topo.dir().to_owned());
        let pid = dir.join("keepalived.pid");
        let vrrp_pid = dir.join("vrrp.pid");
        let checkers_pid = dir.join("checkers.pid");
        let bfd_pid = dir.join("bfd.pid");
        let args: Vec<std::ffi::OsString> = vec![
            "--dont-fork".into(),
            "--log-console".into(),
            "--log-detail".into(),
            "--no-syslog".into(),
            "--vrrp".into(),
            "--use-file".into(),
            m.config.clone().into(),
            "--pid".into(),
            pid.into(),
            "--vrrp_pid".into(),
            vrrp_pid.into(),
            "--checkers_pid".into(),
            checkers_pid.into(),
            "--bfd_pid".into(),
            bfd_pid.into(),
        ];
        let p = topo.spawn(
            host,
            KEEPALIVED_BIN,
            &args,
            &[],
            &format!("keepalived-{host}.log"),
        )?;
        m.process = Some(p.clone());
        Ok(p)
    }

    /// The VIP it guards.
    pub fn vip(&self) -> Ipv4Addr {
        self.vip
    }

    /// Its settings.
    pub fn settings(&self) -> &VrrpSettings {
        &self.settings
    }

    /// The hosts, highest priority first.
    pub fn hosts(&self) -> Vec<usize> {
        self.members.iter().map(|m| m.host).collect()
    }

    /// `host`'s VRRP priority.
    pub fn priority(&self, host: usize) -> Option<u8> {
        self.members
            .iter()
            .find(|m| m.host == host)
            .map(|m| m.priority)
    }

    /// `host`'s keepalived process, if started.
    pub fn process(&self, host: usize) -> Option<&Process> {
        self.members
            .iter()
            .find(|m| m.host == host)
            .and_then(|m| m.process.as_ref())
    }

    /// Fails, with the end of its log, if a keepalived has exited on its own.
    pub fn check_running(&self) -> Result<()> {
        self.members
            .iter()
            .filter_map(|m| m.process.as_ref())
            .try_for_each(Process::check_running)
    }

    /// The hosts whose `eth0` carries the VIP now (more than one: split brain).
    pub fn holders(&self) -> Result<Vec<usize>> {
        let mut out = Vec::new();
        for m in &self.members {
            if has_addr(&m.ns, self.vip)? {
                out.push(m.host);
            }
        }
        Ok(out)
    }

    /// Waits until exactly one host holds the VIP and returns it.
    pub fn wait_master(&self, timeout: Duration) -> Result<usize> {
        let start = Instant::now();
        loop {
            self.check_running()?;
            let h = self.holders()?;
            if h.len() == 1 {
                return Ok(h[0]);
            }
            if start.elapsed() >= timeout {
                return Err(Error::Setup(format!(
                    "keepalived: VIP {} held by {h:?} after {timeout:?}, not by exactly one host",
                    self.vip
                )));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until `host` holds the VIP and no other host does.
    pub fn wait_master_is(&self, host: usize, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            self.check_running()?;
            let h = self.holders()?;
            if h == [host] {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                return Err(Error::Setup(format!(
                    "keepalived: VIP {} held by {h:?} after {timeout:?}, not by host {host} alone",
                    self.vip
                )));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn master_down_follows_the_rfc_formula() {
        let d = VrrpSettings::default_settings();
        // 3 × 1 s + (256 − 100)/256 s.
        assert!((d.master_down_s(100) - 3.609_375).abs() < 1e-9);
        let f = VrrpSettings::fastest();
        assert!((f.master_down_s(150) - (0.03 + 106.0 * 0.01 / 256.0)).abs() < 1e-9);
        let mut one = VrrpSettings::fastest();
        one.down_timer_adverts = Some(1);
        assert!((one.master_down_s(150) - 0.01).abs() < 1e-9);
        assert_eq!((priority(0), priority(1), priority(2)), (200, 150, 100));
    }
}
