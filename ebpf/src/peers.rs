//! `yard_peers`: a training job's traffic per peer host and direction, counted by a TC program
//! on the host's interface (`bpf/peers.bpf.c`).
//!
//! The probe registers the job's ports ([`PeerCounters::set_ports`]); every IPv4 TCP or UDP
//! packet with a registered port on either side is added to its remote host's entry, per
//! direction. [`PeerCounters::read`] gives the totals, which the analyzer differentiates over
//! time to see whether the link to a peer is stalled or slow while a collective is stuck.
//!
//! The program has two entry points, one per direction ([`Direction`]), attached together by
//! [`PeerCounters::attach`]. It never changes, drops or decides a packet: it returns
//! "no verdict" (`TC_ACT_UNSPEC`), so whatever TC program comes after it still runs.
//!
//! Nothing is pinned: the counters describe the jobs of this daemon's lifetime, and a restarted
//! daemon starts from zero (the analyzer works on differences, so a reset is a new baseline).
//!
//! Only traffic through the kernel's network stack is visible here: NCCL over InfiniBand or
//! RoCE bypasses it; NCCL's socket transport, Gloo and the rendezvous store do not.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use aya::maps::{HashMap, MapData, PerCpuArray, PerCpuHashMap};
use aya::programs::tc::{self, SchedClassifierLinkId, TcAttachType, TcError};
use aya::programs::{ProgramError, SchedClassifier};
use aya::util::KernelVersion;
use aya::{Ebpf, EbpfLoader};

use crate::layout::{
    ip_from_map, GwCounter, PeersKey, PeersValue, PEERS_COUNTER_MAX, PEERS_DIR_EGRESS,
    PEERS_DIR_INGRESS, PEERS_PORTS_MAX,
};
use crate::maps::{is_enoent, map_err, read_counter, take};
use crate::test_run::{run_bench, run_raw};
use crate::{CounterValue, EbpfError};

const OBJECT: &str = "peers.bpf.o";
const PROGRAM_INGRESS: &str = "yard_peers_ingress";
const PROGRAM_EGRESS: &str = "yard_peers_egress";

static BYTES: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/peers.bpf.o"));

const MAP_PORTS: &str = "peers_ports";
const MAP_PEERS: &str = "peers";
const MAP_COUNTERS: &str = "peers_counters";

/// Which way a packet went, seen from this host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// Received from the peer.
    Ingress,
    /// Sent to the peer.
    Egress,
}

impl Direction {
    /// Both directions, in the order of their C values.
    pub const ALL: [Direction; 2] = [Direction::Ingress, Direction::Egress];

    /// Stable name, used as a metric label: never rename.
    pub fn name(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }

    fn from_raw(raw: u8) -> Option<Self> {
        match raw {
            PEERS_DIR_INGRESS => Some(Direction::Ingress),
            PEERS_DIR_EGRESS => Some(Direction::Egress),
            _ => None,
        }
    }

    fn program(self) -> &'static str {
        match self {
            Direction::Ingress => PROGRAM_INGRESS,
            Direction::Egress => PROGRAM_EGRESS,
        }
    }

    fn attach_type(self) -> TcAttachType {
        match self {
            Direction::Ingress => TcAttachType::Ingress,
            Direction::Egress => TcAttachType::Egress,
        }
    }
}

impl std::fmt::Display for Direction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A TC program's verdict (`TC_ACT_*` in `linux/pkt_cls.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcAction {
    /// `TC_ACT_UNSPEC` (-1): no verdict; the next program (tcx: `TCX_NEXT`), then the stack.
    Unspec,
    /// `TC_ACT_OK` (0): pass, ending the TC chain.
    Ok,
    /// `TC_ACT_SHOT` (2): drop.
    Shot,
    /// `TC_ACT_REDIRECT` (7).
    Redirect,
    /// Any other value.
    Other(i32),
}

impl TcAction {
    /// Decodes the program's return value (an `int` the kernel reports as `u32`).
    pub fn from_raw(raw: u32) -> Self {
        match i32::from_ne_bytes(raw.to_ne_bytes()) {
            -1 => TcAction::Unspec,
            0 => TcAction::Ok,
            2 => TcAction::Shot,
            7 => TcAction::Redirect,
            other => TcAction::Other(other),
        }
    }
}

/// What `yard_peers` made of a packet; every packet counts exactly one (packets and bytes).
///
/// The discriminant is the index into `peers_counters` and matches `enum peers_counter_idx` in
/// `bpf/yard.h` (a unit test compares the two lists). Whatever the reason, the packet goes on
/// unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum PeerCounter {
    /// Added to its peer's entry.
    Counted = 0,
    /// TCP or UDP, but neither port is registered: not the job's traffic.
    NotJob,
    /// Not IPv4 (IPv6, ARP, a second VLAN tag, ...).
    NonIpv4,
    /// IPv4 of another protocol than TCP and UDP (ICMP, ...).
    NotTcpUdp,
    /// An IPv4 fragment: only the first carries ports, so none is attributed.
    Fragment,
    /// The frame ends before the headers the program reads, or before the IPv4 total length.
    Truncated,
    /// IPv4 version not 4, IHL below 5, or a total length shorter than the IPv4 header.
    Malformed,
    /// A new peer found the peer map full ([`crate::layout::PEERS_MAX`] entries): not counted.
    PeersFull,
}

impl PeerCounter {
    /// Every counter in index order.
    pub const ALL: [PeerCounter; 8] = [
        PeerCounter::Counted,
        PeerCounter::NotJob,
        PeerCounter::NonIpv4,
        PeerCounter::NotTcpUdp,
        PeerCounter::Fragment,
        PeerCounter::Truncated,
        PeerCounter::Malformed,
        PeerCounter::PeersFull,
    ];

    /// Stable snake_case name, used as the metric label (`reason="counted"`): never rename.
    pub fn name(self) -> &'static str {
        match self {
            PeerCounter::Counted => "counted",
            PeerCounter::NotJob => "not_job",
            PeerCounter::NonIpv4 => "non_ipv4",
            PeerCounter::NotTcpUdp => "not_tcp_udp",
            PeerCounter::Fragment => "fragment",
            PeerCounter::Truncated => "truncated",
            PeerCounter::Malformed => "malformed",
            PeerCounter::PeersFull => "peers_full",
        }
    }

    /// Index into `peers_counters`.
    pub fn index(self) -> u32 {
        self as u32
    }

    /// The counter at `index`, if there is one.
    pub fn from_index(index: u32) -> Option<PeerCounter> {
        PeerCounter::ALL.get(usize::try_from(index).ok()?).copied()
    }
}

impl std::fmt::Display for PeerCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One peer's traffic in one direction since it was first seen (or since [`PeerCounters::clear`]),
/// summed over CPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerStat {
    /// The remote host.
    pub peer: Ipv4Addr,
    pub dir: Direction,
    /// Ethernet frame bytes as TC sees them: headers included, no FCS; a GSO packet counts its
    /// payload once with one set of headers.
    pub bytes: u64,
    /// Wire packets: a GSO packet counts its segments.
    pub packets: u64,
    /// `bpf_ktime_get_ns()` ([`crate::ktime_now_ns`]) of the latest packet.
    pub last_ns: u64,
}

/// The two TC attachments of one interface.
struct Attachment {
    ingress: SchedClassifierLinkId,
    egress: SchedClassifierLinkId,
}

/// The loaded per-peer counter program and its maps.
///
/// Attachments live as long as this value (or until [`PeerCounters::detach`]): dropping it
/// detaches both programs from every interface.
pub struct PeerCounters {
    ports: HashMap<MapData, u16, u8>,
    peers: PerCpuHashMap<MapData, PeersKey, PeersValue>,
    counters: PerCpuArray<MapData, GwCounter>,
    attached: BTreeMap<String, Attachment>,
    ebpf: Ebpf,
}

impl std::fmt::Debug for PeerCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerCounters")
            .field("attached", &self.attached.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

fn prog_err(action: &'static str, dir: Direction) -> impl FnOnce(ProgramError) -> EbpfError {
    move |source| EbpfError::Program {
        action,
        program: dir.program(),
        source,
    }
}

/// Whether aya attaches TC programs through tcx links (kernel 6.6 and later, the same test aya
/// makes), which need no qdisc; older kernels attach through netlink to a clsact qdisc.
pub(crate) fn attaches_through_tcx() -> bool {
    KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(6, 6, 0))
}

/// Adds the clsact qdisc to `iface` unless it is there already.
pub(crate) fn ensure_clsact(iface: &str) -> Result<(), EbpfError> {
    match tc::qdisc_add_clsact(iface) {
        Ok(()) | Err(TcError::AlreadyAttached) => Ok(()),
        Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
        Err(source) => Err(EbpfError::Qdisc {
            iface: iface.to_string(),
            source,
        }),
    }
}

impl PeerCounters {
    /// Loads both programs with fresh, empty maps and no port registered (nothing is counted
    /// until [`PeerCounters::set_ports`]); attaches nothing.
    pub fn load() -> Result<Self, EbpfError> {
        let mut ebpf = crate::program::load_object(&mut EbpfLoader::new(), BYTES, OBJECT)?;
        for dir in Direction::ALL {
            crate::program::get_mut::<SchedClassifier>(&mut ebpf, dir.program())?
                .load()
                .map_err(prog_err("load", dir))?;
        }
        Ok(Self {
            ports: take(&mut ebpf, MAP_PORTS)?,
            peers: take(&mut ebpf, MAP_PEERS)?,
            counters: take(&mut ebpf, MAP_COUNTERS)?,
            attached: BTreeMap::new(),
            ebpf,
        })
    }

    /// Attaches the ingress and the egress program to `iface` (in the calling thread's network
    /// namespace), after whatever TC programs are there already. Attaching an interface twice
    /// is a no-op.
    ///
    /// On kernels with tcx (6.6+) the attachments are tcx links and no qdisc is involved; on
    /// older kernels the clsact qdisc is added first if missing. Either attachment failing
    /// leaves neither in place.
    pub fn attach(&mut self, iface: &str) -> Result<(), EbpfError> {
        if self.attached.contains_key(iface) {
            return Ok(());
        }
        if !attaches_through_tcx() {
            ensure_clsact(iface)?;
        }
        let ingress = self.attach_one(iface, Direction::Ingress)?;
        let egress = match self.attach_one(iface, Direction::Egress) {
            Ok(id) => id,
            Err(e) => {
                // Best effort: the attach error is the one worth reporting.
                let _ = self.detach_one(ingress, Direction::Ingress);
                return Err(e);
            }
        };
        self.attached
            .insert(iface.to_string(), Attachment { ingress, egress });
        Ok(())
    }

    /// Detaches both programs from `iface`; an interface not attached is not an error.
    ///
    /// What [`PeerCounters::attach`] added is removed, except a clsact qdisc it added on a
    /// pre-tcx kernel: that stays (empty, it costs nothing), because another tool may have
    /// attached filters to it since, and deleting the qdisc would delete those too.
    pub fn detach(&mut self, iface: &str) -> Result<(), EbpfError> {
        let Some(att) = self.attached.remove(iface) else {
            return Ok(());
        };
        let ingress = self.detach_one(att.ingress, Direction::Ingress);
        let egress = self.detach_one(att.egress, Direction::Egress);
        ingress.and(egress)
    }

    /// The interfaces this value has attached to, sorted.
    pub fn attached(&self) -> Vec<&str> {
        self.attached.keys().map(String::as_str).collect()
    }

    fn attach_one(
        &mut self,
        iface: &str,
        dir: Direction,
    ) -> Result<SchedClassifierLinkId, EbpfError> {
        self.program_mut(dir)?
            .attach(iface, dir.attach_type())
            .map_err(prog_err("attach", dir))
    }

    fn detach_one(&mut self, id: SchedClassifierLinkId, dir: Direction) -> Result<(), EbpfError> {
        self.program_mut(dir)?
            .detach(id)
            .map_err(prog_err("detach", dir))
    }

    /// Makes `ports` the job's registered ports, replacing the previous set. Ports kept from
    /// the previous set are never absent in between, so their traffic is counted throughout.
    pub fn set_ports(&mut self, ports: &[u16]) -> Result<(), EbpfError> {
        let wanted: BTreeSet<u16> = ports.iter().copied().collect();
        if wanted.len() > PEERS_PORTS_MAX as usize {
            return Err(EbpfError::TooManyPorts {
                count: wanted.len(),
                max: PEERS_PORTS_MAX,
            });
        }
        let current = self.ports()?;
        // Stale ones first, so that old and new together never exceed the map's capacity.
        for port in current.iter().filter(|p| !wanted.contains(p)) {
            match self.ports.remove(&port.to_be()) {
                Err(e) if !is_enoent(&e) => return Err(map_err("delete from", MAP_PORTS)(e)),
                _ => {}
            }
        }
        for port in wanted.iter().filter(|p| !current.contains(p)) {
            self.ports
                .insert(port.to_be(), 1, 0)
                .map_err(map_err("update", MAP_PORTS))?;
        }
        Ok(())
    }

    /// The registered ports, sorted.
    pub fn ports(&self) -> Result<Vec<u16>, EbpfError> {
        let mut out = Vec::new();
        for key in self.ports.keys() {
            out.push(u16::from_be(key.map_err(map_err("iterate", MAP_PORTS))?));
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Every peer and direction seen, summed over CPUs (last_ns: the latest of them), sorted
    /// by (peer, direction).
    pub fn read(&self) -> Result<Vec<PeerStat>, EbpfError> {
        let mut out = Vec::new();
        for entry in self.peers.iter() {
            let (key, per_cpu) = entry.map_err(map_err("iterate", MAP_PEERS))?;
            let Some(dir) = Direction::from_raw(key.dir) else {
                continue; // the program writes no other value
            };
            let mut stat = PeerStat {
                peer: ip_from_map(key.peer),
                dir,
                bytes: 0,
                packets: 0,
                last_ns: 0,
            };
            for v in per_cpu.iter() {
                stat.bytes = stat.bytes.wrapping_add(v.bytes);
                stat.packets = stat.packets.wrapping_add(v.packets);
                stat.last_ns = stat.last_ns.max(v.last_ns);
            }
            out.push(stat);
        }
        out.sort_by_key(|s| (s.peer, s.dir));
        Ok(out)
    }

    /// Forgets every peer (a job ended): frees the map for the next job's peers. Counters by
    /// reason are kept.
    pub fn clear(&mut self) -> Result<(), EbpfError> {
        let keys: Vec<PeersKey> = self
            .peers
            .keys()
            .collect::<Result<_, _>>()
            .map_err(map_err("iterate", MAP_PEERS))?;
        for key in keys {
            match self.peers.remove(&key) {
                Err(e) if !is_enoent(&e) => return Err(map_err("delete from", MAP_PEERS)(e)),
                _ => {}
            }
        }
        Ok(())
    }

    /// Every counter by reason, summed over CPUs, in [`PeerCounter::ALL`] order.
    pub fn counters(&self) -> Result<Vec<(PeerCounter, CounterValue)>, EbpfError> {
        debug_assert_eq!(PeerCounter::ALL.len() as u32, PEERS_COUNTER_MAX);
        PeerCounter::ALL
            .iter()
            .map(|&c| Ok((c, read_counter(&self.counters, MAP_COUNTERS, c.index())?)))
            .collect()
    }

    /// One BPF_PROG_TEST_RUN of the `dir` program on `frame`, against this value's maps: the
    /// verdict. The program only reads the frame (it copies headers out with
    /// `bpf_skb_load_bytes`), so there is no output frame to check.
    ///
    /// Frames shorter than 14 bytes are refused before the call ([`EbpfError::FrameTooShort`]);
    /// the kernel refuses (EINVAL, [`EbpfError::Program`]) one whose ethertype says IPv4 (IPv6)
    /// but that is shorter than 34 (54) bytes, because it pulls that header into the skb
    /// before running an skb program.
    pub fn test_run(&self, dir: Direction, frame: &[u8]) -> Result<TcAction, EbpfError> {
        let (action, _) = run_raw(self.program(dir)?, dir.program(), frame)?;
        Ok(TcAction::from_raw(action))
    }

    /// `repeat` runs of the `dir` program on `frame` in the kernel: the kernel-measured mean ns
    /// per run. The frame is never rewritten, so every run takes the same path; a counted frame
    /// adds `repeat` packets to its peer.
    pub fn bench_run(&self, dir: Direction, frame: &[u8], repeat: u32) -> Result<u64, EbpfError> {
        run_bench(self.program(dir)?, dir.program(), frame, repeat)
    }

    fn program(&self, dir: Direction) -> Result<&SchedClassifier, EbpfError> {
        crate::program::get(&self.ebpf, dir.program())
    }

    fn program_mut(&mut self, dir: Direction) -> Result<&mut SchedClassifier, EbpfError> {
        crate::program::get_mut(&mut self.ebpf, dir.program())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn peer_counters_are_send_and_sync() {
        assert_send_sync::<PeerCounters>();
    }

    #[test]
    fn counters_match_the_c_enum_in_order() {
        let c_names = crate::counters::c_enum_names("peers_counter_idx", "PEERS_");
        let rust: Vec<&str> = PeerCounter::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(c_names, rust);
        for (i, c) in PeerCounter::ALL.iter().enumerate() {
            assert_eq!(c.index() as usize, i);
            assert_eq!(PeerCounter::from_index(i as u32), Some(*c));
        }
        assert_eq!(PeerCounter::from_index(PEERS_COUNTER_MAX), None);
        assert_eq!(PeerCounter::ALL.len() as u32, PEERS_COUNTER_MAX);
    }

    #[test]
    fn directions_round_trip_and_match_the_c_enum() {
        assert_eq!(
            crate::counters::c_enum_names("peers_dir", "PEERS_"),
            ["dir_ingress", "dir_egress"]
        );
        assert_eq!(
            Direction::from_raw(PEERS_DIR_INGRESS),
            Some(Direction::Ingress)
        );
        assert_eq!(
            Direction::from_raw(PEERS_DIR_EGRESS),
            Some(Direction::Egress)
        );
        assert_eq!(Direction::from_raw(2), None);
    }

    #[test]
    fn tc_actions_decode_negative_values() {
        assert_eq!(TcAction::from_raw(u32::MAX), TcAction::Unspec);
        assert_eq!(TcAction::from_raw(0), TcAction::Ok);
        assert_eq!(TcAction::from_raw(2), TcAction::Shot);
        assert_eq!(TcAction::from_raw(7), TcAction::Redirect);
        assert_eq!(TcAction::from_raw(u32::MAX - 1), TcAction::Other(-2));
    }
}
