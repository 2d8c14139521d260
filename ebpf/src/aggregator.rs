//! `yard_agg`: gradient aggregation in XDP, the whole gradient of each job cached in a slot map
//! (`bpf/aggregator.bpf.c`), and `yard_agg_fanout`, the TC program that sends each fresh result
//! to every worker of its job.
//!
//! The daemon fills three tables from the cluster's job table ([`Aggregator::set_job`]): the
//! job (its epoch, slot range and shape), its members by source address and port (who may
//! contribute as which worker index), and the members' addresses for the fan-out. The slot map
//! is sized once, at load, from the host's aggregation memory budget: each job owns a range of
//! `2 x chunks` slots that the leader's placement hands out.
//!
//! Nothing is pinned: a restarted daemon starts with empty slots, and the round in flight is
//! finished by the workers' resends to the (re-created) job, as after a regrouping.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};

use aya::maps::{Array, HashMap, MapData, PerCpuArray, PerCpuHashMap};
use aya::programs::tc::{SchedClassifierLinkId, TcAttachType};
use aya::programs::xdp::XdpLinkId;
use aya::programs::{ProgramError, SchedClassifier, Xdp};
use aya::{Ebpf, EbpfLoader};
use yard_agg::wire::{Dtype, Geometry};

pub use yard_agg::model::Counter as AggCounter;

use crate::layout::{
    ip_to_map, AggJob, AggJobCounterKey, AggMember, AggMemberKey, AggPartial, AggPeer, AggPeerKey,
    AggSlot, GwCounter, AGG_COUNTER_MAX,
};
use crate::maps::{is_enoent, map_err, read_counter, take};
use crate::test_run::{run_bench, run_once, run_raw, TestOutcome};
use crate::{CounterValue, EbpfError, TcAction, XdpMode};

const OBJECT: &str = "aggregator.bpf.o";
const PROGRAM_XDP: &str = "yard_agg";
/// `yard_agg` built for multi-buffer XDP, for interfaces whose MTU exceeds one buffer.
const PROGRAM_XDP_FRAGS: &str = "yard_agg_frags";
const PROGRAM_FANOUT: &str = "yard_agg_fanout";

static BYTES: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/aggregator.bpf.o"));
static BYTES_LOCK_V1: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/aggregator_lock_v1.bpf.o"));
static BYTES_ATOMIC: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/aggregator_atomic.bpf.o"));
static BYTES_PERCPU: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/aggregator_percpu.bpf.o"));

const MAP_JOBS: &str = "agg_jobs";
const MAP_MEMBERS: &str = "agg_members";
const MAP_PEERS: &str = "agg_peers";
const MAP_SLOTS: &str = "agg_slots";
const MAP_COUNTERS: &str = "agg_counters";
const MAP_JOB_COUNTERS: &str = "agg_job_counters";
const MAP_PARTIALS: &str = "agg_partials";

/// How a chunk's slot sums its contributions: the shipped spin lock, or one of the strategies
/// issue 12 measures against it, compiled from the same source (`bpf/aggregator.bpf.c`, whose
/// head says how each works). Only [`SumVariant::SpinLock`] is used by the daemon; the others
/// exist for the agg_variants tests and the agg-sum-variants bench.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SumVariant {
    /// The shipped program: a `bpf_spin_lock` per slot, BPF ISA v3 like the variants.
    SpinLock,
    /// The shipped source built for the default ISA (v1): what v3 gains.
    SpinLockV1,
    /// `__sync_fetch_and_add` per value into the shared slot: int32 only (float32's re-scaling
    /// is a read-modify-write no atomic instruction does).
    Atomic,
    /// Per-CPU partial sums, merged by the completing contribution.
    PerCpu,
}

impl SumVariant {
    pub const ALL: [SumVariant; 4] = [
        SumVariant::SpinLock,
        SumVariant::SpinLockV1,
        SumVariant::Atomic,
        SumVariant::PerCpu,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SumVariant::SpinLock => "spin-lock",
            SumVariant::SpinLockV1 => "spin-lock-v1",
            SumVariant::Atomic => "atomic",
            SumVariant::PerCpu => "per-cpu",
        }
    }

    fn object(self) -> (&'static [u8], &'static str) {
        match self {
            SumVariant::SpinLock => (BYTES, OBJECT),
            SumVariant::SpinLockV1 => (BYTES_LOCK_V1, "aggregator_lock_v1.bpf.o"),
            SumVariant::Atomic => (BYTES_ATOMIC, "aggregator_atomic.bpf.o"),
            SumVariant::PerCpu => (BYTES_PERCPU, "aggregator_percpu.bpf.o"),
        }
    }

    /// Whether slots are lock-free, and so must be prepared for a job's first round
    /// ([`Aggregator::prepare_round`]) and hold at most 32 workers.
    pub fn lock_free(self) -> bool {
        matches!(self, SumVariant::Atomic | SumVariant::PerCpu)
    }

    /// Workers a job may have: the lock-free slots claim a contributor's bit and the round
    /// in one 64-bit compare-and-swap, so their bitmap has 32 bits.
    pub fn max_workers(self) -> usize {
        if self.lock_free() {
            32
        } else {
            yard_agg::wire::WORKERS_MAX
        }
    }

    /// Whether jobs of `dtype` can be summed.
    pub fn sums(self, dtype: Dtype) -> bool {
        self != SumVariant::Atomic || dtype == Dtype::I32
    }
}

/// One member's arrival timing, cumulative ([`Aggregator::member_timing`]): the gaps between
/// its frames that came within `AGG_BURST_GAP_NS` of each other, and those frames' bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemberTiming {
    pub busy_ns: u64,
    pub bytes: u64,
}

/// Bytes of kernel memory one slot takes (its value; the array adds no per-entry overhead).
pub const SLOT_BYTES: u64 = std::mem::size_of::<AggSlot>() as u64;

/// A job as this host aggregates it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AggJobEntry {
    pub id: u32,
    pub epoch: u32,
    /// First of the job's `2 x chunks` slots.
    pub base: u32,
    pub geometry: Geometry,
    pub dtype: Dtype,
    /// This epoch's members by worker index: where each sends from.
    pub members: Vec<SocketAddrV4>,
    /// The token each member's frames must carry, by worker index: one per member (the
    /// control plane draws them, `yard_actors::aggregator::auth`).
    pub tokens: Vec<u32>,
    /// The token this aggregator's RESULT frames carry, which its members check.
    pub result_token: u32,
    /// The address results are sent from (this host's, as the workers address it).
    pub self_ip: Ipv4Addr,
    /// Where a cluster aggregator of a tree sends its partial sums; `None` at the root or a
    /// flat job's only aggregator.
    pub parent: Option<AggParent>,
}

/// A cluster aggregator's parent in a job's tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AggParent {
    /// The parent's aggregator address (its `AGG_PORT`).
    pub addr: SocketAddrV4,
    /// This host's worker index in the parent's sums.
    pub worker: u16,
    /// Next hop toward the parent: its MAC, or the router's (`[0; 6]` while unresolved: the
    /// partial sums are dropped and counted until it is set).
    pub mac: [u8; 6],
    /// This host's token at the parent: what its partial sums carry.
    pub token: u32,
    /// The parent's result token: a RESULT without it is foreign.
    pub result_token: u32,
}

impl AggJobEntry {
    /// Slots the job needs: two per chunk.
    pub fn slots(&self) -> u64 {
        u64::from(self.geometry.chunks()) * 2
    }
}

/// The loaded aggregator and its maps. Attachments last as long as this value.
pub struct Aggregator {
    jobs: HashMap<MapData, u32, AggJob>,
    members: HashMap<MapData, AggMemberKey, AggMember>,
    peers: HashMap<MapData, AggPeerKey, AggPeer>,
    slots: Array<MapData, AggSlot>,
    counters: PerCpuArray<MapData, GwCounter>,
    job_counters: PerCpuHashMap<MapData, AggJobCounterKey, GwCounter>,
    /// [`SumVariant::PerCpu`] only: each CPU's partial sums, indexed like `slots`.
    partials: Option<PerCpuArray<MapData, AggPartial>>,
    variant: SumVariant,
    slot_count: u32,
    /// This load's fan-out tag, written into every job ([`Aggregator::fanout_tag`]).
    fanout_tag: u32,
    /// The member keys written per job. Nothing else writes these maps (they are not pinned),
    /// so this is what they hold, and stale members are found without scanning the map.
    written: BTreeMap<u32, Vec<AggMemberKey>>,
    xdp_link: Option<XdpLinkId>,
    tc_link: Option<SchedClassifierLinkId>,
    ebpf: Ebpf,
}

impl std::fmt::Debug for Aggregator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Aggregator")
            .field("slot_count", &self.slot_count)
            .field("attached", &self.xdp_link.is_some())
            .finish_non_exhaustive()
    }
}

/// A random non-zero fan-out tag from the kernel's generator.
fn draw_fanout_tag() -> Result<u32, EbpfError> {
    loop {
        let mut buf = [0u8; 4];
        let n = rustix::rand::getrandom(&mut buf, rustix::rand::GetRandomFlags::empty())
            .map_err(|e| EbpfError::Random(std::io::Error::from(e)))?;
        let tag = u32::from_ne_bytes(buf);
        if n == buf.len() && tag != 0 {
            return Ok(tag);
        }
    }
}

fn prog_err(action: &'static str, program: &'static str) -> impl FnOnce(ProgramError) -> EbpfError {
    move |source| EbpfError::Program {
        action,
        program,
        source,
    }
}

impl Aggregator {
    /// Loads both programs with a slot map of `slot_count` entries ([`SLOT_BYTES`] each) and no
    /// job; attaches nothing.
    pub fn load(slot_count: u32) -> Result<Self, EbpfError> {
        Self::load_variant(slot_count, SumVariant::SpinLock)
    }

    /// [`Aggregator::load`] with the sum strategy `variant` (tests and benches).
    pub fn load_variant(slot_count: u32, variant: SumVariant) -> Result<Self, EbpfError> {
        let slot_count = slot_count.max(1);
        let mut loader = EbpfLoader::new();
        loader.map_max_entries(MAP_SLOTS, slot_count);
        if variant == SumVariant::PerCpu {
            loader.map_max_entries(MAP_PARTIALS, slot_count);
        }
        let (bytes, object) = variant.object();
        let mut ebpf = crate::program::load_object(&mut loader, bytes, object)?;
        crate::program::xdp_mut(&mut ebpf, PROGRAM_XDP)?
            .load()
            .map_err(prog_err("load", PROGRAM_XDP))?;
        crate::program::get_mut::<SchedClassifier>(&mut ebpf, PROGRAM_FANOUT)?
            .load()
            .map_err(prog_err("load", PROGRAM_FANOUT))?;
        let partials = match variant {
            SumVariant::PerCpu => Some(take(&mut ebpf, MAP_PARTIALS)?),
            _ => None,
        };
        Ok(Self {
            partials,
            variant,
            jobs: take(&mut ebpf, MAP_JOBS)?,
            members: take(&mut ebpf, MAP_MEMBERS)?,
            peers: take(&mut ebpf, MAP_PEERS)?,
            slots: take(&mut ebpf, MAP_SLOTS)?,
            counters: take(&mut ebpf, MAP_COUNTERS)?,
            job_counters: take(&mut ebpf, MAP_JOB_COUNTERS)?,
            slot_count,
            fanout_tag: draw_fanout_tag()?,
            written: BTreeMap::new(),
            xdp_link: None,
            tc_link: None,
            ebpf,
        })
    }

    /// Entries of the slot map.
    pub fn slot_count(&self) -> u32 {
        self.slot_count
    }

    /// The tag this load's XDP program writes into the fresh results it hands to the fan-out
    /// (drawn at random at load, never 0): the fan-out clones only frames that carry it, so a
    /// frame that reaches TC ingress without passing through the XDP program (which drops every
    /// received fan-out frame) is not multiplied. It never leaves the host; tests read it to
    /// build a genuine fan-out frame.
    pub fn fanout_tag(&self) -> u32 {
        self.fanout_tag
    }

    /// Attaches the XDP program to `iface` in `mode` and the fan-out to its TC ingress (in the
    /// calling thread's network namespace). Either failing leaves neither attached.
    pub fn attach(&mut self, iface: &str, mode: XdpMode) -> Result<(), EbpfError> {
        if self.xdp_link.is_some() {
            return Ok(());
        }
        if !crate::peers::attaches_through_tcx() {
            crate::peers::ensure_clsact(iface)?;
        }
        let tc = crate::program::get_mut::<SchedClassifier>(&mut self.ebpf, PROGRAM_FANOUT)?
            .attach(iface, TcAttachType::Ingress)
            .map_err(prog_err("attach", PROGRAM_FANOUT))?;
        let mut xdp =
            crate::program::xdp_mut(&mut self.ebpf, PROGRAM_XDP)?.attach(iface, mode.to_aya());
        if xdp.is_err() && mode == XdpMode::Native {
            // A driver refuses a single-buffer program while the MTU exceeds one buffer (veth:
            // about a page, so jumbo frames): the multi-buffer build of the same program
            // attaches there. If it fails too, the first refusal is the one reported.
            if let Ok(id) = self.attach_frags(iface, mode) {
                xdp = Ok(id);
            }
        }
        match xdp {
            Ok(id) => {
                self.xdp_link = Some(id);
                self.tc_link = Some(tc);
                Ok(())
            }
            Err(e) => {
                // Best effort: the attach error is the one worth reporting.
                let _ = crate::program::get_mut::<SchedClassifier>(&mut self.ebpf, PROGRAM_FANOUT)
                    .map(|p| p.detach(tc));
                Err(prog_err("attach", PROGRAM_XDP)(e))
            }
        }
    }

    /// Loads (once) and attaches the multi-buffer build of the XDP program.
    fn attach_frags(&mut self, iface: &str, mode: XdpMode) -> Result<XdpLinkId, EbpfError> {
        let prog = crate::program::xdp_mut(&mut self.ebpf, PROGRAM_XDP_FRAGS)?;
        if prog.fd().is_err() {
            prog.load().map_err(prog_err("load", PROGRAM_XDP_FRAGS))?;
        }
        prog.attach(iface, mode.to_aya())
            .map_err(prog_err("attach", PROGRAM_XDP_FRAGS))
    }

    /// One BPF_PROG_TEST_RUN of the multi-buffer build of `yard_agg` on `frame` (loading it
    /// first if no attach did), against this value's maps.
    pub fn test_run_frags(&mut self, frame: &[u8]) -> Result<TestOutcome, EbpfError> {
        let prog = crate::program::xdp_mut(&mut self.ebpf, PROGRAM_XDP_FRAGS)?;
        if prog.fd().is_err() {
            prog.load().map_err(prog_err("load", PROGRAM_XDP_FRAGS))?;
        }
        run_once(prog, PROGRAM_XDP_FRAGS, frame)
    }

    /// Serves `entry` (a new job, or a new epoch or membership of one). Members are written
    /// before the job, so no frame of the new epoch meets a job without its members; members
    /// of the previous membership that are no longer in it are removed last.
    pub fn set_job(&mut self, entry: &AggJobEntry) -> Result<(), EbpfError> {
        let end = u64::from(entry.base) + entry.slots();
        if end > u64::from(self.slot_count) {
            return Err(EbpfError::SlotRange {
                job: entry.id,
                base: entry.base,
                end,
                have: self.slot_count,
            });
        }
        if entry.members.len() > yard_agg::wire::WORKERS_MAX {
            return Err(EbpfError::TooManyWorkers {
                job: entry.id,
                count: entry.members.len(),
            });
        }
        if entry.members.len() > self.variant.max_workers() {
            return Err(EbpfError::SumVariant {
                variant: self.variant.name(),
                reason: "holds at most 32 workers per job",
            });
        }
        if entry.tokens.len() != entry.members.len() {
            return Err(EbpfError::Tokens {
                job: entry.id,
                members: entry.members.len(),
                tokens: entry.tokens.len(),
            });
        }
        if !self.variant.sums(entry.dtype) {
            return Err(EbpfError::SumVariant {
                variant: self.variant.name(),
                reason: "sums int32 jobs only",
            });
        }
        let stale_members = self.written.get(&entry.id).cloned().unwrap_or_default();
        let mut wanted = Vec::with_capacity(entry.members.len());
        for (worker, (addr, token)) in entry.members.iter().zip(&entry.tokens).enumerate() {
            let worker16 = u16::try_from(worker).unwrap_or(u16::MAX);
            let key = AggMemberKey {
                job: entry.id,
                ip: ip_to_map(*addr.ip()),
                port: addr.port().to_be(),
                pad: 0,
            };
            self.members
                .insert(
                    key,
                    AggMember {
                        worker: worker16,
                        pad: 0,
                        token: *token,
                    },
                    0,
                )
                .map_err(map_err("update", MAP_MEMBERS))?;
            wanted.push(key);
            let pkey = AggPeerKey {
                job: entry.id,
                worker: u32::from(worker16),
            };
            // Keep a learnt MAC and the arrival timing if the worker kept its address (the
            // program may update them meanwhile: a frame's timing lost at a rewrite is one gap).
            let peer = match self.peers.get(&pkey, 0) {
                Ok(p) if p.ip == key.ip && p.port == key.port => p,
                _ => AggPeer {
                    ip: key.ip,
                    port: key.port,
                    ..AggPeer::default()
                },
            };
            self.peers
                .insert(pkey, peer, 0)
                .map_err(map_err("update", MAP_PEERS))?;
        }
        let job = AggJob {
            epoch: entry.epoch,
            base: entry.base,
            chunks: entry.geometry.chunks(),
            values: entry.geometry.values,
            chunk_values: entry.geometry.chunk_values,
            workers: u16::try_from(entry.members.len()).unwrap_or(u16::MAX),
            dtype: entry.dtype as u8,
            pad: [0; 3],
            self_ip: ip_to_map(entry.self_ip),
            parent_ip: entry.parent.map_or(0, |p| ip_to_map(*p.addr.ip())),
            parent_port: entry.parent.map_or(0, |p| p.addr.port().to_be()),
            parent_worker: entry.parent.map_or(0, |p| p.worker),
            parent_mac: entry.parent.map_or([0; 6], |p| p.mac),
            pad2: [0; 2],
            fanout_tag: self.fanout_tag,
            result_token: entry.result_token,
            up_token: entry.parent.map_or(0, |p| p.token),
            parent_token: entry.parent.map_or(0, |p| p.result_token),
        };
        self.jobs
            .insert(entry.id, job, 0)
            .map_err(map_err("update", MAP_JOBS))?;
        for key in stale_members.iter().filter(|k| !wanted.contains(k)) {
            self.remove_member(key)?;
        }
        for worker in entry.members.len()..stale_members.len() {
            self.remove_peer(entry.id, worker)?;
        }
        self.written.insert(entry.id, wanted);
        Ok(())
    }

    /// The sum strategy this value loaded.
    pub fn variant(&self) -> SumVariant {
        self.variant
    }

    /// Lock-free strategies only (nothing to do for the spin lock, whose first contributor
    /// initialises a slot): makes `entry`'s slots ready for `round`, the first the workers
    /// will send, in its epoch: round's parity tagged `round`, the other `round + 1`, sums and
    /// bitmaps empty. From then on each completion recycles the other parity's slot. Call it
    /// after [`Aggregator::set_job`], before any frame of the epoch, and again for a new epoch.
    pub fn prepare_round(&mut self, entry: &AggJobEntry, round: u32) -> Result<(), EbpfError> {
        if !self.variant.lock_free() {
            return Ok(());
        }
        let empty = match &self.partials {
            Some(_) => {
                let cpus = aya::util::nr_cpus()
                    .map_err(|(what, source)| EbpfError::Cpus { what, source })?;
                Some(vec![AggPartial::default(); cpus])
            }
            None => None,
        };
        for c in 0..entry.geometry.chunks() {
            for parity in 0..2u32 {
                let tag = if parity == round & 1 {
                    round
                } else {
                    round.wrapping_add(1)
                };
                let index = entry.base + c * 2 + parity;
                let slot = AggSlot {
                    job: entry.id,
                    epoch: entry.epoch,
                    round: tag,
                    seen: u64::from(tag) << 32,
                    ..AggSlot::default()
                };
                self.slots
                    .set(index, slot, 0)
                    .map_err(map_err("update", MAP_SLOTS))?;
                if let (Some(partials), Some(empty)) = (self.partials.as_mut(), empty.as_ref()) {
                    let values =
                        aya::maps::PerCpuValues::try_from(empty.clone()).map_err(|source| {
                            EbpfError::Cpus {
                                what: "one partial per possible CPU",
                                source,
                            }
                        })?;
                    partials
                        .set(index, values, 0)
                        .map_err(map_err("update", MAP_PARTIALS))?;
                }
            }
        }
        Ok(())
    }

    /// Stops serving job `id`: its frames count as an unknown job from now on, and its
    /// per-job counters are deleted (the table holds `AGG_JOBS_MAX` jobs' worth: a counter
    /// kept for every job that ever ran would fill it, and a full table makes new jobs'
    /// counts vanish without an error).
    pub fn remove_job(&mut self, id: u32) -> Result<(), EbpfError> {
        match self.jobs.remove(&id) {
            Err(e) if !is_enoent(&e) => return Err(map_err("delete from", MAP_JOBS)(e)),
            _ => {}
        }
        let members = self.written.remove(&id).unwrap_or_default();
        for key in &members {
            self.remove_member(key)?;
        }
        for worker in 0..members.len() {
            self.remove_peer(id, worker)?;
        }
        self.forget_job_counters(id)
    }

    /// Deletes job `id`'s per-job counters (every reason; absent ones are fine).
    pub fn forget_job_counters(&mut self, id: u32) -> Result<(), EbpfError> {
        for c in AggCounter::ALL {
            let key = AggJobCounterKey {
                job: id,
                reason: c.index(),
            };
            match self.job_counters.remove(&key) {
                Err(e) if !is_enoent(&e) => {
                    return Err(map_err("delete from", MAP_JOB_COUNTERS)(e))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The jobs that have per-job counters in the kernel's table.
    pub fn counted_jobs(&self) -> Result<std::collections::BTreeSet<u32>, EbpfError> {
        self.job_counters
            .keys()
            .map(|k| k.map(|k| k.job))
            .collect::<Result<_, _>>()
            .map_err(map_err("iterate", MAP_JOB_COUNTERS))
    }

    /// The jobs served, by id.
    pub fn job_ids(&self) -> Result<Vec<u32>, EbpfError> {
        let mut ids: Vec<u32> = self
            .jobs
            .keys()
            .collect::<Result<_, _>>()
            .map_err(map_err("iterate", MAP_JOBS))?;
        ids.sort_unstable();
        Ok(ids)
    }

    fn remove_member(&mut self, key: &AggMemberKey) -> Result<(), EbpfError> {
        match self.members.remove(key) {
            Err(e) if !is_enoent(&e) => Err(map_err("delete from", MAP_MEMBERS)(e)),
            _ => Ok(()),
        }
    }

    fn remove_peer(&mut self, job: u32, worker: usize) -> Result<(), EbpfError> {
        let key = AggPeerKey {
            job,
            worker: u32::try_from(worker).unwrap_or(u32::MAX),
        };
        match self.peers.remove(&key) {
            Err(e) if !is_enoent(&e) => Err(map_err("delete from", MAP_PEERS)(e)),
            _ => Ok(()),
        }
    }

    /// Job `job`'s arrival timing of each of its first `workers` members (by worker index):
    /// `(address, busy ns, bytes)`, cumulative since the member was written with that address
    /// (see `struct agg_peer`). A member without an entry is left out.
    pub fn member_timing(
        &self,
        job: u32,
        workers: usize,
    ) -> Result<Vec<(usize, MemberTiming)>, EbpfError> {
        let mut out = Vec::with_capacity(workers);
        for worker in 0..workers {
            let key = AggPeerKey {
                job,
                worker: u32::try_from(worker).unwrap_or(u32::MAX),
            };
            match self.peers.get(&key, 0) {
                Ok(p) => out.push((
                    worker,
                    MemberTiming {
                        busy_ns: p.busy_ns,
                        bytes: p.bytes,
                    },
                )),
                Err(e) if is_enoent(&e) => {}
                Err(e) => return Err(map_err("read", MAP_PEERS)(e)),
            }
        }
        Ok(out)
    }

    /// Every counter by reason, summed over CPUs, in [`AggCounter::ALL`] order.
    pub fn counters(&self) -> Result<Vec<(AggCounter, CounterValue)>, EbpfError> {
        debug_assert_eq!(AggCounter::ALL.len() as u32, AGG_COUNTER_MAX);
        AggCounter::ALL
            .iter()
            .map(|&c| Ok((c, read_counter(&self.counters, MAP_COUNTERS, c.index())?)))
            .collect()
    }

    /// Job `job`'s counters by reason, summed over CPUs, in [`AggCounter::ALL`] order (zero
    /// where the job never counted the reason).
    pub fn job_counters(&self, job: u32) -> Result<Vec<(AggCounter, CounterValue)>, EbpfError> {
        AggCounter::ALL
            .iter()
            .map(|&c| {
                let key = AggJobCounterKey {
                    job,
                    reason: c.index(),
                };
                let mut sum = CounterValue::default();
                match self.job_counters.get(&key, 0) {
                    Ok(per_cpu) => {
                        for v in per_cpu.iter() {
                            sum.packets = sum.packets.wrapping_add(v.packets);
                            sum.bytes = sum.bytes.wrapping_add(v.bytes);
                        }
                    }
                    Err(e) if is_enoent(&e) => {}
                    Err(e) => return Err(map_err("read", MAP_JOB_COUNTERS)(e)),
                }
                Ok((c, sum))
            })
            .collect()
    }

    /// Slot `index` as the kernel holds it (tests and diagnostics).
    pub fn slot(&self, index: u32) -> Result<AggSlot, EbpfError> {
        self.slots
            .get(&index, 0)
            .map_err(map_err("read", MAP_SLOTS))
    }

    /// One BPF_PROG_TEST_RUN of `yard_agg` on `frame`, against this value's maps.
    pub fn test_run(&self, frame: &[u8]) -> Result<TestOutcome, EbpfError> {
        run_once(self.xdp()?, PROGRAM_XDP, frame)
    }

    /// `repeat` kernel runs of `yard_agg` on `frame`: the mean ns per run. Map writes persist,
    /// so after the first run the frame takes the path its repeats take (a duplicate, or a
    /// stored-result answer: see the xdp-paths bench).
    pub fn bench_run(&self, frame: &[u8], repeat: u32) -> Result<u64, EbpfError> {
        run_bench(self.xdp()?, PROGRAM_XDP, frame, repeat)
    }

    /// One BPF_PROG_TEST_RUN of the fan-out on `frame`: its verdict and the frame as the
    /// program left it (the last copy's addresses).
    pub fn test_run_fanout(&self, frame: &[u8]) -> Result<(TcAction, Vec<u8>), EbpfError> {
        let prog = crate::program::get::<SchedClassifier>(&self.ebpf, PROGRAM_FANOUT)?;
        let (action, out) = run_raw(prog, PROGRAM_FANOUT, frame)?;
        Ok((TcAction::from_raw(action), out))
    }

    fn xdp(&self) -> Result<&Xdp, EbpfError> {
        crate::program::xdp(&self.ebpf, PROGRAM_XDP)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_match_the_c_enum_in_order() {
        let c_names = crate::counters::c_enum_names("agg_counter_idx", "AGG_");
        let rust: Vec<&str> = AggCounter::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(c_names, rust);
        for (i, c) in AggCounter::ALL.iter().enumerate() {
            assert_eq!(c.index() as usize, i);
        }
    }

    #[test]
    fn wire_constants_match_the_header() {
        let header = include_str!("../bpf/yard.h");
        use yard_agg::wire;
        assert!(header.contains(&format!("#define AGG_PORT {}", wire::PORT)));
        assert!(header.contains(&format!("#define AGG_MAGIC {:#010x}", wire::MAGIC)));
        assert!(header.contains(&format!("#define AGG_VERSION {}", wire::VERSION)));
        assert!(header.contains(&format!("#define AGG_VALUES_MAX {}", wire::VALUES_MAX)));
        assert!(header.contains(&format!("#define AGG_WORKERS_MAX {}", wire::WORKERS_MAX)));
        assert!(header.contains(&format!("#define AGG_F_RETX {:#04x}", wire::FLAG_RETX)));
        assert!(header.contains(&format!("#define AGG_F_REPLAY {:#04x}", wire::FLAG_REPLAY)));
        assert!(header.contains("YARD_ASSERT_SIZE(struct agg_hdr, 32);"));
        assert!(header.contains("YARD_ASSERT_SIZE(struct agg_job, 60);"));
        assert!(header.contains("YARD_ASSERT_OFFSET(struct agg_hdr, token, 28);"));
        assert_eq!(wire::HEADER_LEN, 32);
    }
}
