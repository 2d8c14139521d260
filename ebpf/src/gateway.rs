//! `yard_gateway`: loader, pinning and typed map access.
//!
//! # Surviving a daemon restart
//!
//! The requirement is that maps keep their contents and packets never stop being processed
//! when the daemon restarts. The mechanism, all under one pin directory (by default
//! `/sys/fs/bpf/yard/gateway`):
//!
//! - **Maps** are pinned by name (`<pin_dir>/gw_config`, `gw_vips`, `gw_endpoints`, `gw_hosts`,
//!   `gw_counters`). [`Gateway::open_pinned`] hands those paths to aya's
//!   `EbpfLoader::map_pin_path`, which reuses a pinned map when it exists and creates and pins it
//!   otherwise; so a restarted daemon's freshly loaded program is relocated against the very maps
//!   the running program uses. Before adopting, each pin's type, key and value size and capacity
//!   are compared with this build's definition, so an incompatible leftover is an error rather
//!   than misread entries.
//! - **The attachment** is a bpf_link (not a netlink attachment) pinned at
//!   `<pin_dir>/link_<iface>`: a pinned link stays attached when the process that made it dies,
//!   which is what keeps forwarding alive while no daemon runs. [`Gateway::attach`] on a restarted
//!   daemon opens that link and swaps its program for the newly loaded one with
//!   `BPF_LINK_UPDATE` (aya's `Xdp::attach_to_link`): an atomic replacement in the kernel, with
//!   no moment at which the interface has no program. The link (and its id) stays the same; the
//!   program id changes to the new load, which shares the maps, so an upgraded daemon also
//!   upgrades the program.
//! - **Fencing**: because a pinned program runs on with nobody behind it, it checks the lease
//!   deadline in `gw_config` itself; a dead daemon stops renewing and the node stops serving
//!   VIPs within one lease.
//!
//! [`Gateway::remove_pinned`] is the planned decommission: it detaches every pinned link at once
//! (BPF_LINK_DETACH, even if a process still holds it) and deletes the pins.

use std::collections::BTreeMap;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};

use aya::maps::{
    Array, HashMap, IterableMap, Map, MapData, MapInfo, MapType, PerCpuArray, PerCpuHashMap,
};
use aya::programs::links::{FdLink, PinnedLink};
use aya::programs::xdp::XdpLink;
use aya::programs::{ProgramError, Xdp};
use aya::{Ebpf, EbpfLoader};

use crate::layout::{
    ip_from_map, ip_to_map, GwConfig, GwCounter, GwEp, GwEpKey, GwHost, GwVip, COUNTER_MAX,
    ENDPOINTS_MAX, HOSTS_MAX, VIPS_MAX, VIP_FORWARD_ONLY, VIP_OWNED,
};
use crate::maps::{is_enoent, map_err, read_counter, take};
use crate::test_run::{run_bench, run_once};
use crate::{sys, Counter, CounterValue, EbpfError, TestOutcome};

const OBJECT: &str = "gateway.bpf.o";
const PROGRAM: &str = "yard_gateway";

static BYTES: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gateway.bpf.o"));

const MAP_CONFIG: &str = "gw_config";
const MAP_VIPS: &str = "gw_vips";
const MAP_ENDPOINTS: &str = "gw_endpoints";
const MAP_HOSTS: &str = "gw_hosts";
const MAP_COUNTERS: &str = "gw_counters";
const MAP_VIP_STATS: &str = "gw_vip_stats";

/// (name, type, key size, value size, max entries).
type MapShape = (&'static str, MapType, u32, u32, u32);

/// Every map of the object with the shape this build expects: (name, type, key size, value
/// size, max entries). Used to vet pinned maps before adopting them.
const MAPS: [MapShape; 6] = [
    (MAP_CONFIG, MapType::Array, 4, 16, 1),
    (MAP_VIPS, MapType::Hash, 4, 4, VIPS_MAX),
    (MAP_ENDPOINTS, MapType::Hash, 8, 12, ENDPOINTS_MAX),
    (MAP_HOSTS, MapType::Hash, 4, 8, HOSTS_MAX),
    (MAP_COUNTERS, MapType::PerCpuArray, 4, 16, COUNTER_MAX),
    (MAP_VIP_STATS, MapType::PerCpuHash, 4, 16, VIPS_MAX),
];

/// Prefix of a pinned link's file name; the interface name follows.
const LINK_PREFIX: &str = "link_";

/// How the program is attached to the interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum XdpMode {
    /// In the driver, before any sk_buff exists: the fast path on real NICs.
    Native,
    /// In the kernel's generic receive path: works on every device, slower.
    Generic,
}

impl XdpMode {
    fn to_aya(self) -> aya::programs::XdpMode {
        match self {
            XdpMode::Native => aya::programs::XdpMode::Driver,
            XdpMode::Generic => aya::programs::XdpMode::Skb,
        }
    }
}

/// What this node does for a VIP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum VipMode {
    /// Answer ARP for it and forward tunnel traffic sent to it.
    Owned,
    /// Forward tunnel traffic sent to it but answer no ARP: used while the VIP is handed over to
    /// another node, so packets still in flight towards this node are not lost.
    ForwardOnly,
}

impl VipMode {
    fn to_raw(self) -> u32 {
        match self {
            VipMode::Owned => VIP_OWNED,
            VipMode::ForwardOnly => VIP_FORWARD_ONLY,
        }
    }

    fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            VIP_OWNED => Some(VipMode::Owned),
            VIP_FORWARD_ONLY => Some(VipMode::ForwardOnly),
            _ => None,
        }
    }
}

/// A tenant address and where it lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// VXLAN network identifier (24 bits).
    pub vni: u32,
    /// The tenant IPv4 address, unique inside its VNI.
    pub ip: Ipv4Addr,
    /// The tenant interface's MAC: destination of the inner frame.
    pub mac: [u8; 6],
    /// The compute host's underlay address: destination of the outer frame.
    pub host: Ipv4Addr,
}

/// The node-wide settings of the program (the lease deadline is set separately).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GatewayConfig {
    /// MAC of the interface the program is attached to: the source of everything it sends.
    pub mac: [u8; 6],
    /// Largest outer L3 (IPv4) size accepted; bigger frames are dropped, as the underlay would.
    /// Must not be 0: 0 means "not configured" to the program, which then passes everything.
    pub mtu: u16,
}

/// A pinned attachment as the kernel reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkState {
    pub link_id: u32,
    pub program_id: u32,
}

/// The loaded gateway program and its maps.
///
/// `Send` (and `Sync`): the daemon's gateway actor owns it on its own thread.
pub struct Gateway {
    config: Array<MapData, GwConfig>,
    vips: HashMap<MapData, u32, GwVip>,
    endpoints: HashMap<MapData, GwEpKey, GwEp>,
    hosts: HashMap<MapData, u32, GwHost>,
    counters: PerCpuArray<MapData, GwCounter>,
    vip_stats: VipStats,
    /// Links this value attached and pinned; kept only so that their fds close with it.
    pinned_links: Vec<PinnedLink>,
    pin_dir: Option<PathBuf>,
    ebpf: Ebpf,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("pin_dir", &self.pin_dir)
            .field("pinned_links", &self.pinned_links.len())
            .finish_non_exhaustive()
    }
}

fn prog_err(action: &'static str) -> impl FnOnce(ProgramError) -> EbpfError {
    move |source| EbpfError::Program {
        action,
        program: PROGRAM,
        source,
    }
}

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> EbpfError + 'a {
    move |source| EbpfError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// Checks that the map pinned at `path` has the shape this build defines.
fn vet_pinned(
    path: &Path,
    expect: &(&'static str, MapType, u32, u32, u32),
) -> Result<(), EbpfError> {
    let (name, ty, key, value, max) = *expect;
    let info = MapInfo::from_pin(path).map_err(map_err("inspect the pinned", name))?;
    let got_ty = info
        .map_type()
        .map_err(map_err("inspect the pinned", name))?;
    let got = (
        got_ty,
        info.key_size(),
        info.value_size(),
        info.max_entries(),
    );
    if got != (ty, key, value, max) {
        return Err(EbpfError::IncompatiblePin {
            path: path.to_path_buf(),
            detail: format!(
                "found type {:?} key {} value {} max {}, expected type {ty:?} key {key} value {value} max {max}",
                got.0, got.1, got.2, got.3
            ),
        });
    }
    Ok(())
}

/// The bpffs file name of the link for `iface`. bpffs refuses names containing '.', which
/// interface names may contain (VLANs: eth0.100), so '.' is written as '%'.
fn link_file_name(iface: &str) -> Result<String, EbpfError> {
    if iface.is_empty()
        || iface.len() >= libc::IFNAMSIZ
        || iface.contains(['/', '\0', '%'])
        || iface.chars().any(char::is_whitespace)
    {
        return Err(EbpfError::InvalidInterface(iface.to_string()));
    }
    Ok(format!("{LINK_PREFIX}{}", iface.replace('.', "%")))
}

/// The per-VIP traffic counters (`gw_vip_stats`), also opened on their own from the pin
/// directory by a reader that does not own the program (the daemon's rate sampler).
pub struct VipStats {
    map: PerCpuHashMap<MapData, u32, GwCounter>,
}

impl VipStats {
    /// Opens the counters pinned under `pin_dir` by [`Gateway::open_pinned`].
    pub fn open_pinned(pin_dir: &Path) -> Result<Self, EbpfError> {
        let path = pin_dir.join(MAP_VIP_STATS);
        let expect = MAPS
            .iter()
            .find(|m| m.0 == MAP_VIP_STATS)
            .expect("gw_vip_stats is one of the maps");
        vet_pinned(&path, expect)?;
        let data = MapData::from_pin(&path).map_err(map_err("open the pinned", MAP_VIP_STATS))?;
        let map = PerCpuHashMap::try_from(Map::PerCpuHashMap(data))
            .map_err(map_err("open", MAP_VIP_STATS))?;
        Ok(Self { map })
    }

    /// Frames and bytes per VIP, summed over CPUs (wrapping, as the kernel's u64s do).
    pub fn read(&self) -> Result<BTreeMap<Ipv4Addr, CounterValue>, EbpfError> {
        let mut out = BTreeMap::new();
        for entry in self.map.iter() {
            let (key, per_cpu) = entry.map_err(map_err("iterate", MAP_VIP_STATS))?;
            let mut sum = CounterValue::default();
            for v in per_cpu.iter() {
                sum.packets = sum.packets.wrapping_add(v.packets);
                sum.bytes = sum.bytes.wrapping_add(v.bytes);
            }
            out.insert(ip_from_map(key), sum);
        }
        Ok(out)
    }
}

impl Gateway {
    /// Loads the object without attaching or pinning (tests and benchmarks): fresh, empty maps
    /// that live as long as this value.
    pub fn load() -> Result<Self, EbpfError> {
        Self::load_with(None).map(|(gw, _)| gw)
    }

    /// Opens the gateway state pinned under `pin_dir` (e.g. `/sys/fs/bpf/yard/gateway`, which
    /// must be on a bpffs) if present, otherwise loads the object and pins its maps there.
    /// Returns whether it adopted existing state (every map was already pinned).
    ///
    /// Maps are re-adopted here; the attachment is re-adopted by [`Gateway::attach`], which
    /// needs the interface name. Between the two calls the old program keeps running on the old
    /// link, with the same maps, so forwarding never stops across a daemon restart.
    pub fn open_pinned(pin_dir: &Path) -> Result<(Self, bool), EbpfError> {
        std::fs::create_dir_all(pin_dir).map_err(io_err("create the pin directory", pin_dir))?;
        Self::load_with(Some(pin_dir))
    }

    fn load_with(pin_dir: Option<&Path>) -> Result<(Self, bool), EbpfError> {
        let mut loader = EbpfLoader::new();
        let mut adopted = pin_dir.is_some();
        let paths: Vec<(&'static str, PathBuf)> = match pin_dir {
            Some(dir) => MAPS.iter().map(|m| (m.0, dir.join(m.0))).collect(),
            None => Vec::new(),
        };
        for ((name, path), expect) in paths.iter().zip(MAPS.iter()) {
            if path.exists() {
                vet_pinned(path, expect)?;
            } else {
                adopted = false;
            }
            loader.map_pin_path(name, path.as_path());
        }
        let mut ebpf = crate::program::load_object(&mut loader, BYTES, OBJECT)?;
        xdp_mut(&mut ebpf)?.load().map_err(prog_err("load"))?;
        let gw = Gateway {
            config: take(&mut ebpf, MAP_CONFIG)?,
            vips: take(&mut ebpf, MAP_VIPS)?,
            endpoints: take(&mut ebpf, MAP_ENDPOINTS)?,
            hosts: take(&mut ebpf, MAP_HOSTS)?,
            counters: take(&mut ebpf, MAP_COUNTERS)?,
            vip_stats: VipStats {
                map: take(&mut ebpf, MAP_VIP_STATS)?,
            },
            pinned_links: Vec::new(),
            pin_dir: pin_dir.map(Path::to_path_buf),
            ebpf,
        };
        Ok((gw, adopted))
    }

    /// Attaches to `iface` in `mode`.
    ///
    /// With a pin directory: if a pinned link for `iface` exists, keeps that attachment and
    /// atomically swaps in this value's program (`BPF_LINK_UPDATE`; the link keeps its original
    /// mode); otherwise attaches through a new bpf_link and pins it, so the program keeps running
    /// if the daemon dies (the lease in `gw_config` fences it). A pinned link whose interface has
    /// gone (the kernel reports it defunct) is replaced by a fresh attachment.
    ///
    /// Without a pin directory ([`Gateway::load`]) the attachment lasts as long as this value.
    ///
    /// Namespaces: the interface is looked up in the calling thread's network namespace.
    pub fn attach(&mut self, iface: &str, mode: XdpMode) -> Result<(), EbpfError> {
        let file = link_file_name(iface)?;
        let Some(dir) = self.pin_dir.clone() else {
            self.xdp_mut()?
                .attach(iface, mode.to_aya())
                .map_err(prog_err("attach"))?;
            return Ok(());
        };
        let path = dir.join(file);
        if path.exists() {
            match self.adopt_link(&path) {
                Ok(()) => return Ok(()),
                Err(AdoptError::Defunct) => {
                    std::fs::remove_file(&path).map_err(io_err("remove the defunct link", &path))?
                }
                Err(AdoptError::Failed(e)) => return Err(e),
            }
        }
        let xdp = self.xdp_mut()?;
        let id = xdp
            .attach(iface, mode.to_aya())
            .map_err(prog_err("attach"))?;
        let link = xdp.take_link(id).map_err(prog_err("take the link of"))?;
        let fd_link = FdLink::try_from(link).map_err(|e| EbpfError::Link {
            action: "pin (the kernel attached through netlink, not a bpf_link)",
            path: path.clone(),
            source: io::Error::other(e),
        })?;
        let pinned = fd_link.pin(&path).map_err(|e| EbpfError::Link {
            action: "pin",
            path: path.clone(),
            source: io::Error::other(e),
        })?;
        self.pinned_links.push(pinned);
        Ok(())
    }

    /// Moves the pinned link at `path` onto this value's program.
    fn adopt_link(&mut self, path: &Path) -> Result<(), AdoptError> {
        let failed = |action: &'static str| {
            let path = path.to_path_buf();
            move |e: Box<dyn std::error::Error + Send + Sync>| {
                AdoptError::Failed(EbpfError::Link {
                    action,
                    path,
                    source: io::Error::other(e),
                })
            }
        };
        let pinned = PinnedLink::from_pin(path).map_err(|e| failed("open")(Box::new(e)))?;
        let link = XdpLink::try_from(FdLink::from(pinned))
            .map_err(|e| failed("open (not an XDP link)")(Box::new(e)))?;
        let xdp = self.xdp_mut().map_err(AdoptError::Failed)?;
        match xdp.attach_to_link(link) {
            Ok(_) => Ok(()),
            Err(ProgramError::SyscallError(s))
                if s.io_error.raw_os_error() == Some(libc::ENOLINK) =>
            {
                Err(AdoptError::Defunct)
            }
            Err(e) => Err(failed("update the program of")(Box::new(e))),
        }
    }

    /// The kernel's view of the link pinned for `iface` under `pin_dir`, if there is one: lets a
    /// caller (or test) see that a restart kept the attachment.
    pub fn pinned_link(pin_dir: &Path, iface: &str) -> Result<Option<LinkState>, EbpfError> {
        let path = pin_dir.join(link_file_name(iface)?);
        if !path.exists() {
            return Ok(None);
        }
        let err = |e: Box<dyn std::error::Error + Send + Sync>| EbpfError::Link {
            action: "inspect",
            path: path.clone(),
            source: io::Error::other(e),
        };
        let link = FdLink::from(PinnedLink::from_pin(&path).map_err(|e| err(Box::new(e)))?);
        let info = link.info().map_err(|e| err(Box::new(e)))?;
        Ok(Some(LinkState {
            link_id: info.id(),
            program_id: info.program_id(),
        }))
    }

    /// The kernel id of this value's program.
    pub fn program_id(&self) -> Result<u32, EbpfError> {
        Ok(self.xdp()?.info().map_err(prog_err("inspect"))?.id())
    }

    /// Detaches and removes every pinned object under `pin_dir` (planned decommission, tests'
    /// cleanup), then the directory itself. Links are detached with BPF_LINK_DETACH, so the
    /// program stops at once even if a live [`Gateway`] still holds the link. A missing
    /// directory is not an error.
    pub fn remove_pinned(pin_dir: &Path) -> Result<(), EbpfError> {
        let entries = match std::fs::read_dir(pin_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_err("list", pin_dir)(e)),
        };
        // Links first: the program must stop before its maps' pins go.
        let mut paths: Vec<PathBuf> = Vec::new();
        for entry in entries {
            paths.push(entry.map_err(io_err("list", pin_dir))?.path());
        }
        paths.sort_by_key(|p| {
            !p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(LINK_PREFIX))
        });
        for path in paths {
            let is_link = path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(LINK_PREFIX));
            if is_link {
                let fd = sys::obj_get(&path).map_err(|source| EbpfError::Link {
                    action: "open",
                    path: path.clone(),
                    source,
                })?;
                match sys::link_detach(&fd) {
                    // ENOLINK: already defunct (interface gone); nothing left to detach.
                    Err(e) if e.raw_os_error() != Some(libc::ENOLINK) => {
                        return Err(EbpfError::Link {
                            action: "detach",
                            path,
                            source: e,
                        })
                    }
                    _ => {}
                }
            }
            if path.is_dir() {
                std::fs::remove_dir_all(&path).map_err(io_err("remove", &path))?;
            } else {
                std::fs::remove_file(&path).map_err(io_err("remove", &path))?;
            }
        }
        match std::fs::remove_dir(pin_dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(io_err("remove the pin directory", pin_dir)(e))
            }
            _ => Ok(()),
        }
    }

    /// The pin directory, if this value was opened with [`Gateway::open_pinned`].
    pub fn pin_dir(&self) -> Option<&Path> {
        self.pin_dir.as_deref()
    }

    fn read_config(&self) -> Result<GwConfig, EbpfError> {
        self.config.get(&0, 0).map_err(map_err("read", MAP_CONFIG))
    }

    fn write_config(&mut self, cfg: GwConfig) -> Result<(), EbpfError> {
        self.config
            .set(0, cfg, 0)
            .map_err(map_err("update", MAP_CONFIG))
    }

    /// Sets the interface MAC and MTU, keeping the lease deadline.
    ///
    /// The whole 16-byte value is rewritten in place; a packet processed concurrently may see a
    /// mix of old and new MAC, which is why the MAC is set once at start-up.
    pub fn set_config(&mut self, cfg: &GatewayConfig) -> Result<(), EbpfError> {
        let old = self.read_config()?;
        self.write_config(GwConfig {
            mac: cfg.mac,
            mtu: cfg.mtu,
            lease_deadline_ns: old.lease_deadline_ns,
        })
    }

    /// Sets the lease deadline (a [`crate::ktime_now_ns`] value): from then on the program
    /// serves no VIP until it is renewed. 0 fences at once.
    pub fn set_lease_deadline(&mut self, ktime_ns: u64) -> Result<(), EbpfError> {
        let mut cfg = self.read_config()?;
        cfg.lease_deadline_ns = ktime_ns;
        self.write_config(cfg)
    }

    /// The lease deadline the program currently enforces.
    pub fn lease_deadline(&self) -> Result<u64, EbpfError> {
        Ok(self.read_config()?.lease_deadline_ns)
    }

    /// The current configuration, or `None` if it was never written (mtu 0).
    pub fn config(&self) -> Result<Option<GatewayConfig>, EbpfError> {
        let cfg = self.read_config()?;
        Ok((cfg.mtu != 0).then_some(GatewayConfig {
            mac: cfg.mac,
            mtu: cfg.mtu,
        }))
    }

    /// Adds a VIP or changes its mode.
    pub fn put_vip(&mut self, vip: Ipv4Addr, mode: VipMode) -> Result<(), EbpfError> {
        self.vips
            .insert(
                ip_to_map(vip),
                GwVip {
                    mode: mode.to_raw(),
                },
                0,
            )
            .map_err(map_err("update", MAP_VIPS))
    }

    /// Removes a VIP; removing an absent one is not an error.
    pub fn remove_vip(&mut self, vip: Ipv4Addr) -> Result<(), EbpfError> {
        match self.vips.remove(&ip_to_map(vip)) {
            Err(e) if !is_enoent(&e) => Err(map_err("delete from", MAP_VIPS)(e)),
            _ => Ok(()),
        }
    }

    /// Every VIP and its mode, sorted by address. Entries with an unknown mode (which the
    /// program ignores) are left out.
    pub fn vips(&self) -> Result<Vec<(Ipv4Addr, VipMode)>, EbpfError> {
        let mut out = Vec::new();
        for entry in self.vips.iter() {
            let (key, value) = entry.map_err(map_err("iterate", MAP_VIPS))?;
            if let Some(mode) = VipMode::from_raw(value.mode) {
                out.push((ip_from_map(key), mode));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Adds or replaces an endpoint. One map update (a syscall, ~1 µs): 100k endpoints take
    /// a fraction of a second; aya 0.14 has no batch update.
    pub fn put_endpoint(&mut self, ep: &Endpoint) -> Result<(), EbpfError> {
        if ep.vni >= 1 << 24 {
            return Err(EbpfError::InvalidVni(ep.vni));
        }
        let key = GwEpKey {
            vni: ep.vni,
            ip: ip_to_map(ep.ip),
        };
        let value = GwEp {
            mac: ep.mac,
            pad: 0,
            host: ip_to_map(ep.host),
        };
        self.endpoints
            .insert(key, value, 0)
            .map_err(map_err("update", MAP_ENDPOINTS))
    }

    /// Removes an endpoint; removing an absent one is not an error.
    pub fn remove_endpoint(&mut self, vni: u32, ip: Ipv4Addr) -> Result<(), EbpfError> {
        let key = GwEpKey {
            vni,
            ip: ip_to_map(ip),
        };
        match self.endpoints.remove(&key) {
            Err(e) if !is_enoent(&e) => Err(map_err("delete from", MAP_ENDPOINTS)(e)),
            _ => Ok(()),
        }
    }

    /// Every endpoint, sorted by (vni, ip).
    pub fn endpoints(&self) -> Result<Vec<Endpoint>, EbpfError> {
        let mut out = BTreeMap::new();
        for entry in self.endpoints.iter() {
            let (key, value) = entry.map_err(map_err("iterate", MAP_ENDPOINTS))?;
            let ip = ip_from_map(key.ip);
            out.insert(
                (key.vni, ip),
                Endpoint {
                    vni: key.vni,
                    ip,
                    mac: value.mac,
                    host: ip_from_map(value.host),
                },
            );
        }
        Ok(out.into_values().collect())
    }

    /// Sets the next-hop MAC of a compute host.
    pub fn put_host(&mut self, host: Ipv4Addr, mac: [u8; 6]) -> Result<(), EbpfError> {
        self.hosts
            .insert(ip_to_map(host), GwHost { mac, pad: 0 }, 0)
            .map_err(map_err("update", MAP_HOSTS))
    }

    /// Removes a compute host; removing an absent one is not an error.
    pub fn remove_host(&mut self, host: Ipv4Addr) -> Result<(), EbpfError> {
        match self.hosts.remove(&ip_to_map(host)) {
            Err(e) if !is_enoent(&e) => Err(map_err("delete from", MAP_HOSTS)(e)),
            _ => Ok(()),
        }
    }

    /// Every compute host and its MAC, sorted by address.
    pub fn hosts(&self) -> Result<Vec<(Ipv4Addr, [u8; 6])>, EbpfError> {
        let mut out = Vec::new();
        for entry in self.hosts.iter() {
            let (key, value) = entry.map_err(map_err("iterate", MAP_HOSTS))?;
            out.push((ip_from_map(key), value.mac));
        }
        out.sort();
        Ok(out)
    }

    /// Every counter, summed over CPUs, in [`Counter::ALL`] order. Pinned counters survive a
    /// daemon restart, so they behave as monotonic metrics.
    pub fn counters(&self) -> Result<Vec<(Counter, CounterValue)>, EbpfError> {
        let mut out = Vec::with_capacity(Counter::ALL.len());
        for counter in Counter::ALL {
            let sum = read_counter(&self.counters, MAP_COUNTERS, counter.index())?;
            out.push((counter, sum));
        }
        Ok(out)
    }

    /// Frames and bytes addressed to this gateway per VIP, summed over CPUs.
    pub fn vip_counters(&self) -> Result<BTreeMap<Ipv4Addr, CounterValue>, EbpfError> {
        self.vip_stats.read()
    }

    /// Kernel memory charged to each map (`memlock` in /proc/self/fdinfo), in bytes; `None`
    /// where the kernel does not report it.
    pub fn map_memory(&self) -> Vec<(&'static str, Option<u64>)> {
        let fds = [
            (MAP_CONFIG, self.config.map().fd().as_fd().as_raw_fd()),
            (MAP_VIPS, self.vips.map().fd().as_fd().as_raw_fd()),
            (MAP_ENDPOINTS, self.endpoints.map().fd().as_fd().as_raw_fd()),
            (MAP_HOSTS, self.hosts.map().fd().as_fd().as_raw_fd()),
            (MAP_COUNTERS, self.counters.map().fd().as_fd().as_raw_fd()),
            (
                MAP_VIP_STATS,
                self.vip_stats.map.map().fd().as_fd().as_raw_fd(),
            ),
        ];
        fds.into_iter()
            .map(|(name, fd)| (name, fdinfo_memlock(fd)))
            .collect()
    }

    /// One BPF_PROG_TEST_RUN of the program on `frame`: the action and the output frame. Runs
    /// against this value's maps (counters included).
    pub fn test_run(&self, frame: &[u8]) -> Result<TestOutcome, EbpfError> {
        run_once(self.xdp()?, PROGRAM, frame)
    }

    /// [`Gateway::test_run`] as if `frame` arrived on interface `ingress_ifindex` of the
    /// calling thread's network namespace (the kernel's routes and neighbours there are what
    /// the program's FIB lookup sees).
    pub fn test_run_on(
        &self,
        frame: &[u8],
        ingress_ifindex: u32,
    ) -> Result<TestOutcome, EbpfError> {
        crate::test_run::run_once_on(self.xdp()?, PROGRAM, frame, ingress_ifindex)
    }

    /// `repeat` runs in the kernel; returns the kernel-measured mean ns per run.
    ///
    /// The kernel runs all repeats on one buffer: from the second run on, the program sees the
    /// frame as it rewrote it. Choose `frame` and maps so that the rewritten frame takes the same
    /// path (or use a small `repeat`), and check [`Gateway::counters`] to confirm which path ran.
    pub fn bench_run(&self, frame: &[u8], repeat: u32) -> Result<u64, EbpfError> {
        run_bench(self.xdp()?, PROGRAM, frame, repeat)
    }

    fn xdp(&self) -> Result<&Xdp, EbpfError> {
        crate::program::xdp(&self.ebpf, PROGRAM)
    }

    fn xdp_mut(&mut self) -> Result<&mut Xdp, EbpfError> {
        xdp_mut(&mut self.ebpf)
    }
}

enum AdoptError {
    /// The link's interface is gone: the pin is stale.
    Defunct,
    Failed(EbpfError),
}

fn xdp_mut(ebpf: &mut Ebpf) -> Result<&mut Xdp, EbpfError> {
    crate::program::xdp_mut(ebpf, PROGRAM)
}

fn fdinfo_memlock(fd: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("memlock:"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn gateway_is_send_and_sync() {
        assert_send_sync::<Gateway>();
        assert_send_sync::<crate::Bounce>();
    }

    #[test]
    fn link_file_names_are_valid_on_bpffs() {
        assert_eq!(link_file_name("eth0").unwrap(), "link_eth0");
        assert_eq!(link_file_name("eth0.100").unwrap(), "link_eth0%100");
        for bad in ["", "a/b", "averyveryverylongname", "a b", "a%b"] {
            assert!(link_file_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn vip_modes_round_trip() {
        for m in [VipMode::Owned, VipMode::ForwardOnly] {
            assert_eq!(VipMode::from_raw(m.to_raw()), Some(m));
        }
        assert_eq!(VipMode::from_raw(0), None);
    }
}
