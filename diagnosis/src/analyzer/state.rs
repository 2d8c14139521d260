//! What the analyzer remembers about a job, updated one event at a time.
//!
//! Everything is bounded: per process group a ring of the last [`SEQ_WINDOW`] sequence numbers
//! per member, per (group, op, size) a fixed-size baseline, per pair of ranks one record for the
//! op in progress plus a baseline. Lookups on the hot path are Vec indexes (ranks, members,
//! slots); the only hashing is the group name and, for per-peer progress, the pair.
//!
//! Statistics for slow detection are computed when a sequence number completes on every member
//! (its last `End` arrives), which spreads their cost evenly over the events.

use super::baseline::{Baseline, Hits, Recent};
use super::hang::normalized;
use super::Config;
use crate::event::{
    Coll, Dtype, Event, Group, LinkCounters, Member, Op, PeerProgress, PgName, Phase,
};
use crate::event::{Dir, Rank};
use crate::verdict::{Class, PgRef, Subtype, Verdict};
use std::collections::HashMap;

/// How many recent sequence numbers of each group are kept per member. The slow rules look at
/// the last 8 to 32 ops and the hang rules at one, so 32 leaves room for members drifting apart
/// while keeping a 16k-rank group at ~30 MB.
pub(crate) const SEQ_WINDOW: usize = 32;

/// The highest rank accepted whatever a job declares: rank state is Vec-indexed (about 130
/// bytes a rank), so even a declared world is capped, at a size no job has reached.
pub(crate) const MAX_RANK: Rank = (1 << 20) - 1;

/// The ranks a job may use before any of its members declared the world size (the
/// `world_size` of a rank's HELLO): 65,536, four times the largest job tested (16k ranks),
/// so that one stray event of a job nobody introduced yet (a group listing, a rank number from
/// a corrupt client) costs at most ~8 MB rather than the ~130 MB of [`MAX_RANK`]. A bigger job
/// declares its size in the first event its ranks send, before any group listing.
pub const UNDECLARED_MAX_RANKS: u32 = 1 << 16;

/// Why an event was not taken. Nothing of it is kept; the analyzer counts it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("rank {rank} is outside the job's declared world size {world_size}")]
    OutsideWorld { rank: Rank, world_size: u32 },
    #[error(
        "rank {rank} is beyond the {limit} ranks a job may use before it declares its world size"
    )]
    Undeclared { rank: Rank, limit: u32 },
    #[error("rank {rank} is above the largest rank the analyzer takes ({max})", max = MAX_RANK)]
    TooLarge { rank: Rank },
    #[error("the event would take the job's analyzer state past its budget of {budget} bytes (it holds {held})")]
    OverBudget { held: usize, budget: usize },
}

/// How many of a rank's latest `End` times are kept to find the end of its previous op in any
/// group (its compute gap).
const END_RING: usize = 8;

/// What a rank said it was doing at a sequence number: the fields collectives must agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Sig {
    pub op: Op,
    pub dtype: Dtype,
    pub bytes: u64,
    /// Output elements, 0 when the source does not record them (see [`Coll::out_count`]).
    pub out: u64,
}

const HAS_ENQ: u8 = 1;
const HAS_START: u8 = 2;
const HAS_END: u8 = 4;

/// One member's record of one sequence number (times on the member's own clock).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rec {
    pub seq: u64,
    pub enq: u64,
    pub start: u64,
    pub end: u64,
    pub sig: Sig,
    pub peer: Option<Rank>,
    flags: u8,
}

impl Rec {
    const EMPTY: Rec = Rec {
        seq: 0,
        enq: 0,
        start: 0,
        end: 0,
        sig: Sig {
            op: Op::Other,
            dtype: Dtype::Other,
            bytes: 0,
            out: 0,
        },
        peer: None,
        flags: 0,
    };

    pub(crate) fn used(&self) -> bool {
        self.flags != 0
    }
    pub(crate) fn has_enq(&self) -> bool {
        self.flags & HAS_ENQ != 0
    }
    pub(crate) fn has_start(&self) -> bool {
        self.flags & HAS_START != 0
    }
    pub(crate) fn has_end(&self) -> bool {
        self.flags & HAS_END != 0
    }

    /// Local end − enqueue: how long this member spent in the op, waiting included.
    pub(crate) fn duration(&self) -> Option<u64> {
        (self.has_enq() && self.has_end() && self.end >= self.enq).then(|| self.end - self.enq)
    }
}

/// A member's position in its group's sequence.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MemberState {
    pub last_enq: Option<u64>,
    pub last_end: Option<u64>,
    pub in_flight: bool,
    /// The highest seq a per-peer record of this member shows: it was inside that op even if
    /// its collective reports were lost. Only kept for groups without a point-to-point stream
    /// of the same name, whose per-peer records could carry p2p sequence numbers.
    pub peer_seq: Option<u64>,
}

/// Completion bookkeeping of one slot of the ring.
#[derive(Clone, Copy, Debug, Default)]
struct SlotMeta {
    seq: u64,
    ended: u32,
    used: bool,
    done: bool,
}

/// One member's compute gap (its enqueue minus the end of its previous op, on its own clock)
/// relative to the median gap of its group at the same seq.
///
/// Judging a gap against the group's median at that very seq, rather than against a baseline
/// per op kind, makes the rule indifferent to ops of one kind that follow different amounts of
/// compute (the forward and backward all-reduces of a layer share (op, size) but follow a third
/// and two thirds of the step's compute), to a global slowdown (every gap grows, the ratio does
/// not) and to clock skew (each gap is one rank's own difference).
#[derive(Clone, Debug, Default)]
pub(crate) struct ComputeStats {
    /// The member's usual gap ÷ median gap: a persistent imbalance is learned as normal.
    pub base: Baseline,
    pub hits: Hits,
    /// The gap against its peers' at the same seq alone (no history): CCL-D's comparison,
    /// which also sees a rank slow from the job's first steps, whose own baseline learned the
    /// slowness as normal. Judged only where every member runs the same compute (see
    /// [`judge_gaps`]), live over a window of [`PEER_WINDOW`] ops.
    pub peer: Hits,
    /// The last gap was a strong outlier against its peers' (at least [`PEER_STRONG`] times
    /// their median): enough on its own, because at a 6-20x slowdown the next op that could
    /// confirm it is seconds away.
    pub peer_strong: bool,
    pub last_gap: f32,
    pub last_ratio: f32,
}

impl ComputeStats {
    /// Slow against its peers at the same seqs: the last [`PEER_WINDOW`] gaps were, or the
    /// last one by far.
    pub(crate) fn slow_by_peers(&self) -> bool {
        self.peer.active() || self.peer_strong
    }

    /// Slow against its own usual share of the group's pace, or against its peers.
    pub(crate) fn slow(&self) -> bool {
        self.hits.active() || self.slow_by_peers()
    }
}

/// Statistics of one (group, op, size bucket).
#[derive(Clone, Debug)]
pub(crate) struct KeyStats {
    pub op: Op,
    pub bucket: u8,
    /// Transfer time: the last-arriving member's local duration (min over members).
    pub transfer: Baseline,
    pub transfer_hits: Hits,
    pub last_transfer: f32,
    /// Recent transfer times, for the hang threshold.
    pub recent: Recent,
    pub completed: u64,
    pub last_seq: u64,
}

/// Bytes and blocked time one side reported for the pair's current op.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Side {
    pub bytes: u64,
    pub busy: u64,
    pub seen: bool,
}

/// Per-peer progress of one (from → to) pair in one group.
#[derive(Clone, Debug, Default)]
pub(crate) struct PairState {
    pub cur_seq: u64,
    pub send: Side,
    pub recv: Side,
    /// Throughput (bytes per ns) of completed ops.
    pub base: Baseline,
    /// Slower by the factor and by `slow_min_delta_ns` of busy time: enough to raise a verdict.
    pub hits: Hits,
    /// Slower by the factor alone. Too weak to raise anything (a small transfer's jitter is a
    /// large ratio), but once a verdict is raised it says which other paths share the
    /// slowdown, e.g. the small pipeline sends through the same NIC.
    pub rel_hits: Hits,
    pub last_thr: f32,
    /// When the pair last reported (the analyzer's clock): the peer comparison of paths
    /// counts a path as normal only if it carried data since the slow ones did.
    pub seen_ns: u64,
}

impl PairState {
    /// Bytes moved in `seq`: `None` if the pair already reports a later op.
    pub(crate) fn bytes_at(&self, seq: u64) -> Option<u64> {
        match self.cur_seq.cmp(&seq) {
            std::cmp::Ordering::Equal => Some(self.send.bytes.max(self.recv.bytes)),
            std::cmp::Ordering::Less => Some(0),
            std::cmp::Ordering::Greater => None,
        }
    }
}

/// One process group's stream: collectives and point-to-point ops are separate streams because
/// Flight Recorder numbers them separately (`collective_seq_id` and `p2p_seq_id`).
#[derive(Clone, Debug)]
pub(crate) struct Pg {
    pub name: PgName,
    pub p2p: bool,
    /// Membership in group-rank order, once a `Group` event declared it.
    pub declared: Option<Vec<Rank>>,
    /// The rank set (sorted) of the group this stream belongs to (for a point-to-point
    /// stream, its collective twin's declaration): with it, streams that share a name are
    /// told apart, whatever order a declaration lists the ranks in.
    pub scope: Option<Vec<Rank>>,
    pub members: Vec<Rank>,
    pub state: Vec<MemberState>,
    recs: Vec<Rec>,
    slots: Vec<SlotMeta>,
    pub first_seq: Option<u64>,
    /// Receive time of the last progress by any member.
    pub last_progress: u64,
    /// Members with an op enqueued and not ended.
    pub in_flight: u32,
    pub keys: Vec<KeyStats>,
    pub pairs: HashMap<(Rank, Rank), PairState>,
    /// Per member: its compute gap relative to the group's.
    pub compute: Vec<ComputeStats>,
    /// Members whose compute condition is active.
    pub stragglers: u32,
    /// The last seq whose gaps were judged, and the group's median gap then.
    pub gap_seq: u64,
    pub gap_median: f32,
    /// Reused buffer of (member, gap) of the seq being judged.
    gaps: Vec<(usize, f32)>,
    /// The first seq every member completed while disagreeing about the op: a mismatch is a
    /// program bug whether or not NCCL happened to finish, and, as in FR's analyzer, only
    /// the first one is kept because pairing after it is unreliable.
    pub completed_mismatch: Option<Box<CompletedMismatch>>,
    /// Seqs kept per member: [`SEQ_WINDOW`] live, more offline when a record's ranks ran
    /// further ahead of their oldest unfinished op (see [`State::window`]).
    pub window: usize,
    /// What the group is for, as its declaration says ("TENSOR_MODEL_PARALLEL_GROUP",
    /// "replica", …): groups of one description and size are one program's siblings.
    pub desc: String,
}

/// Members' signatures at a completed seq whose members disagreed, kept when it completed
/// (the ring of records is overwritten long before an evaluation may ask).
#[derive(Clone, Debug)]
pub(crate) struct CompletedMismatch {
    pub seq: u64,
    /// (member index, signature).
    pub sigs: Vec<(usize, Sig)>,
}

impl Pg {
    /// A verdict about this group's `seq` (`op` as the majority ran it), its culprits,
    /// links and evidence still to be filled in.
    pub fn verdict(&self, class: Class, subtype: Subtype, seq: u64, op: Option<Op>) -> Verdict {
        Verdict {
            class,
            subtype,
            culprits: Vec::new(),
            links: Vec::new(),
            pg: Some(PgRef {
                name: self.name.to_string(),
                ranks: self.ranks(),
            }),
            seq: Some(seq),
            op,
            evidence: Vec::new(),
            confidence: 0.0,
            detected_ns: 0,
        }
    }

    fn new(name: PgName, p2p: bool, now: u64, window: usize) -> Pg {
        Pg {
            name,
            p2p,
            declared: None,
            scope: None,
            members: Vec::new(),
            state: Vec::new(),
            recs: Vec::new(),
            slots: vec![SlotMeta::default(); window],
            first_seq: None,
            last_progress: now,
            in_flight: 0,
            keys: Vec::new(),
            pairs: HashMap::new(),
            compute: Vec::new(),
            stragglers: 0,
            gap_seq: 0,
            gap_median: 0.0,
            gaps: Vec::new(),
            completed_mismatch: None,
            window,
            desc: String::new(),
        }
    }

    /// Member `m`'s record of `seq`, if still in the window.
    pub(crate) fn rec(&self, m: usize, seq: u64) -> Option<&Rec> {
        let r = self.recs.get(m * self.window + slot(seq, self.window))?;
        (r.used() && r.seq == seq).then_some(r)
    }

    /// The member index of a global rank (linear: used off the hot path only).
    pub(crate) fn member_of(&self, rank: Rank) -> Option<usize> {
        self.members.iter().position(|&r| r == rank)
    }

    /// The kind of group: streams of one kind run one program's ops (the data-parallel
    /// replicas' tensor-parallel groups, DiLoCo's replica groups). Its description when it has
    /// one (`split_group` and `new_group` name each group apart), else its name (shared by
    /// groups `split_group` made alike), with its size and whether it is point-to-point.
    pub(crate) fn family(&self) -> (&str, usize, bool) {
        let kind = if self.desc.is_empty() {
            &*self.name
        } else {
            self.desc.as_str()
        };
        (kind, self.members.len(), self.p2p)
    }

    /// Members in group-rank order when declared, else sorted.
    pub(crate) fn ranks(&self) -> Vec<Rank> {
        match &self.declared {
            Some(d) => d.clone(),
            None => {
                let mut r = self.members.clone();
                r.sort_unstable();
                r
            }
        }
    }

    /// The key index for an op, if one has completed.
    pub(crate) fn key_of(&self, sig: Sig) -> Option<usize> {
        let b = bucket(sig.bytes);
        self.keys
            .iter()
            .position(|k| k.op == sig.op && k.bucket == b)
    }

    /// How many records the stream retains (for the boundedness tests).
    pub(crate) fn retained(&self) -> usize {
        self.recs.len() + self.slots.len() + self.pairs.len() + self.keys.len() + self.compute.len()
    }

    fn add_member(&mut self, rank: Rank) -> usize {
        self.members.push(rank);
        self.state.push(MemberState::default());
        self.recs
            .extend(std::iter::repeat_n(Rec::EMPTY, self.window));
        self.compute.push(ComputeStats::default());
        self.members.len() - 1
    }

    fn key_index(&mut self, sig: Sig) -> usize {
        if let Some(k) = self.key_of(sig) {
            return k;
        }
        self.keys.push(KeyStats {
            op: sig.op,
            bucket: bucket(sig.bytes),
            transfer: Baseline::default(),
            transfer_hits: Hits::default(),
            last_transfer: 0.0,
            recent: Recent::default(),
            completed: 0,
            last_seq: 0,
        });
        self.keys.len() - 1
    }
}

/// A group's ranks in their listed order, each once (a repeated GROUP frame can list a rank
/// twice; it is still one member).
fn dedup_keep_order(ranks: &[Rank]) -> Vec<Rank> {
    let mut seen = std::collections::HashSet::with_capacity(ranks.len());
    ranks.iter().copied().filter(|r| seen.insert(*r)).collect()
}

/// Bytes of a stream's declaration: its rank list and rank set.
fn decl_bytes(pg: &Pg) -> usize {
    let n = pg.declared.as_ref().map_or(0, Vec::len) + pg.scope.as_ref().map_or(0, Vec::len);
    n * std::mem::size_of::<Rank>()
}

/// A group's ranks as a set: sorted, without repeats.
fn rank_set(ranks: &[Rank]) -> Vec<Rank> {
    let mut set = ranks.to_vec();
    set.sort_unstable();
    set.dedup();
    set
}

/// The ring slot of `seq` in a window of `window` seqs, a power of two (a mask, not a division:
/// this is on every lookup of the hang rules).
fn slot(seq: u64, window: usize) -> usize {
    debug_assert!(window.is_power_of_two());
    (seq as usize) & (window - 1)
}

/// Size bucket: powers of two, so 1 MiB and 1.2 MiB share a baseline but 1 KiB does not.
pub(crate) fn bucket(bytes: u64) -> u8 {
    (64 - bytes.leading_zeros()) as u8
}

/// One rank's process.
#[derive(Clone, Debug, Default)]
pub(crate) struct RankState {
    /// Known: it sent something or a group lists it.
    pub known: bool,
    /// Receive time of its last event (any event is a heartbeat).
    pub last_seen: u64,
    pub exited: bool,
    /// The process that said goodbye introduced itself again (a replay of its HELLO): it is
    /// alive again only once it heartbeats.
    reannounced: bool,
    pub info: Option<Box<Member>>,
    ends: [u64; END_RING],
    ends_n: u8,
    /// The ring of ends has been filled once: all its entries hold ends (the count wraps).
    ends_full: bool,
    /// The latest enqueue time (own clock) of any of its ops that ended: every op it enqueued
    /// before that has finished too, since a rank waits for its ops in program order.
    pub done_enq: Option<u64>,
    /// (group stream, member index) of every stream the rank is in.
    pub pgs: Vec<(u32, u32)>,
    /// When the end of its latest op reached the analyzer (the analyzer's clock): with no op
    /// in flight since, it has been computing for about `now` minus this.
    pub end_recv_ns: u64,
}

impl RankState {
    fn push_end(&mut self, t: u64) {
        self.ends[usize::from(self.ends_n) % END_RING] = t;
        self.ends_full |= usize::from(self.ends_n) + 1 >= END_RING;
        self.ends_n = self.ends_n.wrapping_add(1);
    }

    /// The latest end of any of this rank's ops at or before `t` (its own clock).
    fn end_before(&self, t: u64) -> Option<u64> {
        // Past 255 ends the count wraps; the ring is still whole.
        let n = if self.ends_full {
            END_RING
        } else {
            usize::from(self.ends_n)
        };
        self.ends[..n].iter().copied().filter(|&e| e <= t).max()
    }

    /// Whether the end of its last op before `t` is still known: it is in the ring, or the
    /// ring never dropped an end (so there was none). A rank that ran ahead of a slow group
    /// pushes the end before that group's op out of the ring before the op is judged.
    fn end_known_before(&self, t: u64) -> bool {
        !self.ends_full || self.end_before(t).is_some()
    }

    pub(crate) fn host(&self) -> &str {
        self.info.as_deref().map_or("", |m| m.host.as_str())
    }
}

/// The job's ranks, stored sparsely: one entry per rank seen, whatever its number. Indexed
/// by rank through a hash map, because a Vec indexed by rank let one event with a large rank
/// number (up to the declared world, 2^20) allocate a million entries.
#[derive(Debug, Default)]
pub(crate) struct Ranks {
    index: HashMap<Rank, u32>,
    ids: Vec<Rank>,
    states: Vec<RankState>,
}

impl Ranks {
    pub(crate) fn get(&self, rank: Rank) -> Option<&RankState> {
        self.index.get(&rank).map(|&i| &self.states[i as usize])
    }

    pub(crate) fn get_mut(&mut self, rank: Rank) -> Option<&mut RankState> {
        self.index.get(&rank).map(|&i| &mut self.states[i as usize])
    }

    pub(crate) fn contains(&self, rank: Rank) -> bool {
        self.index.contains_key(&rank)
    }

    /// The rank's entry, created if new (the bool says whether it was).
    fn entry(&mut self, rank: Rank) -> (&mut RankState, bool) {
        match self.index.get(&rank) {
            Some(&i) => (&mut self.states[i as usize], false),
            None => {
                self.index.insert(rank, self.states.len() as u32);
                self.ids.push(rank);
                self.states.push(RankState::default());
                (self.states.last_mut().expect("just pushed"), true)
            }
        }
    }

    /// Every rank seen, in the order they were first seen.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Rank, &RankState)> {
        self.ids.iter().copied().zip(self.states.iter())
    }

    pub(crate) fn len(&self) -> usize {
        self.states.len()
    }
}

impl std::ops::Index<Rank> for Ranks {
    type Output = RankState;
    fn index(&self, rank: Rank) -> &RankState {
        self.get(rank).expect("rank is known")
    }
}

impl std::ops::IndexMut<Rank> for Ranks {
    fn index_mut(&mut self, rank: Rank) -> &mut RankState {
        self.get_mut(rank).expect("rank is known")
    }
}

/// What each piece of the state costs in heap bytes: the sizes of what is stored plus the
/// per-entry overhead of the hash maps, by element count (a Vec's spare capacity, at most
/// the size of what it holds, is not counted; the budgets leave room for it).
pub(crate) mod cost {
    use super::*;
    use std::mem::size_of;

    /// One hash-map entry beyond its key and value: a control byte, and the table kept at
    /// most 7/8 full, rounded up.
    const MAP_SLACK: usize = 2;

    /// A rank: its state, its id and its index entry.
    pub const RANK: usize =
        size_of::<RankState>() + size_of::<Rank>() + size_of::<(Rank, u32)>() + MAP_SLACK;
    /// A member of a stream: its window of records, its position and compute statistics, its
    /// entry in the rank's list of streams, and room for its gap and its signature in a
    /// mismatch (both kept per member at most once).
    pub const MEMBER: usize = SEQ_WINDOW * size_of::<Rec>()
        + size_of::<MemberState>()
        + size_of::<ComputeStats>()
        + size_of::<Rank>()
        + size_of::<(u32, u32)>()
        + size_of::<(usize, f32)>()
        + size_of::<(usize, Sig)>();
    /// A rank listed in a group's declaration: the list in group order and the sorted set.
    pub const DECLARED: usize = 2 * size_of::<Rank>();
    /// A stream, without its members and name.
    pub const PG: usize =
        size_of::<Pg>() + SEQ_WINDOW * size_of::<SlotMeta>() + size_of::<u32>() + MAP_SLACK;
    /// A new group name in the index (its bytes are counted apart).
    pub const NAME: usize = size_of::<(PgName, Vec<u32>)>() + MAP_SLACK + 16;
    /// A pair's per-peer progress.
    pub const PAIR: usize = size_of::<((Rank, Rank), PairState)>() + MAP_SLACK;
    /// Statistics of one (op, size bucket) of a stream.
    pub const KEY: usize = size_of::<KeyStats>();
    /// A host pair's counters, without its two addresses.
    pub const COUNTER: usize = size_of::<((String, String), CounterState)>() + MAP_SLACK;
    /// A rank's introduction, without its strings.
    pub const INFO: usize = size_of::<Member>();

    pub fn member_info(m: &Member) -> usize {
        INFO + m.host.len() + m.addr.len() + m.nic.len() + m.switch.len()
    }
}

/// Cumulative eBPF counters of one host pair, reduced to a tx rate and its baseline.
#[derive(Clone, Debug, Default)]
pub(crate) struct CounterState {
    last_t: u64,
    last_tx: u64,
    pub rate: f32,
    pub base: Baseline,
}

/// The whole job.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub pgs: Vec<Pg>,
    /// Streams by name. A name usually has one stream, but `torch.distributed.split_group`
    /// and `new_group` give every DP group (every TP group, …) the same name, so a group is
    /// its name *and* its rank set; a rank is in at most one group of a name, which is how
    /// a rank's op finds its stream (as FR's analyzer keys groups by name and rank).
    coll_index: HashMap<PgName, Vec<u32>>,
    p2p_index: HashMap<PgName, Vec<u32>>,
    pub ranks: Ranks,
    /// (host addr, peer addr) → counters.
    pub counters: HashMap<(String, String), CounterState>,
    /// The largest world size a member declared (capped at [`MAX_RANK`] + 1).
    world: Option<u32>,
    /// The events are a finished record (Flight Recorder dumps), whose entries each carry
    /// their op's final state, rather than a live stream whose reports can be lost.
    pub offline: bool,
    /// Seqs kept per stream member, when an offline record needs more than [`SEQ_WINDOW`]
    /// (see [`State::window`]).
    pub seq_window: Option<usize>,
    /// Heap bytes this state holds, by the estimate of [`cost`]: counted where it allocates,
    /// so that a budget can be checked per event without walking the state.
    bytes: usize,
}

impl State {
    /// Seqs kept per stream member: [`SEQ_WINDOW`], or what an offline record needs. A rank's
    /// host keeps enqueuing past a stuck op until the step's host sync, 40 or more ops of a
    /// tensor-parallel group; the stuck op's records must outlive them.
    pub(crate) fn window(&self) -> usize {
        self.seq_window
            .unwrap_or(SEQ_WINDOW)
            .max(SEQ_WINDOW)
            .next_power_of_two()
    }

    /// Whether a stream's members run the same compute (see [`peer_comparable`]).
    pub(crate) fn peer_comparable(&self, pg: &Pg) -> bool {
        peer_comparable(pg, &self.ranks)
    }

    /// Takes one event received at `now`, unless it names a rank outside the job's world
    /// (then nothing of it is kept).
    ///
    /// An event that could take the state past `budget` bytes (by [`cost`]'s estimate) is
    /// refused whole, before anything of it is stored.
    pub(crate) fn ingest(
        &mut self,
        ev: &Event,
        now: u64,
        cfg: &Config,
        budget: usize,
    ) -> Result<(), Rejected> {
        self.check(ev)?;
        if self.bytes.saturating_add(self.growth(ev)) > budget {
            return Err(Rejected::OverBudget {
                held: self.bytes,
                budget,
            });
        }
        if let Some(rank) = ev.rank() {
            self.heartbeat(rank, now);
        }
        match ev {
            Event::Member(m) => {
                let info = cost::member_info(m);
                let r = &mut self.ranks[m.rank];
                let old = r.info.as_deref().map_or(0, cost::member_info);
                // A new introduction is a new process, alive again even if an earlier one
                // said goodbye; but the same process introducing itself again after its
                // goodbye is a replay of its HELLO (a node re-announcing its ranks to the
                // analyzer), and only its next heartbeat says it runs. Not the pid alone: a
                // restarted container's rank can be pid 1 again.
                let same_process = m.pid != 0
                    && r.info
                        .as_deref()
                        .is_some_and(|old| old.pid == m.pid && old.host == m.host);
                if r.exited && same_process {
                    r.reannounced = true;
                } else {
                    r.exited = false;
                    r.reannounced = false;
                }
                r.info = Some(Box::new(m.clone()));
                self.bytes = self.bytes + info - old;
            }
            Event::Group(g) => self.group(g, now),
            Event::Coll(c) => self.coll(c, now, cfg),
            Event::Peer(p) => self.peer(p, now, cfg),
            Event::Heartbeat { rank, .. } => {
                let r = &mut self.ranks[*rank];
                if std::mem::take(&mut r.reannounced) {
                    r.exited = false;
                }
            }
            Event::Exit { rank, .. } => {
                let r = &mut self.ranks[*rank];
                r.exited = true;
                r.reannounced = false;
            }
            Event::Counters(c) => self.counters(c, cfg),
        }
        Ok(())
    }

    /// Declares the job's world size (a member's `world_size`, or an offline record's world);
    /// the largest declaration wins, capped at [`MAX_RANK`] + 1. Zero declares nothing.
    pub(crate) fn declare_world(&mut self, size: u32) {
        if size > 0 {
            let size = size.min(MAX_RANK + 1);
            self.world = Some(self.world.map_or(size, |w| w.max(size)));
        }
    }

    /// Whether every rank `ev` names is inside the job's world; a member declares the world
    /// first (and must be inside its own).
    fn check(&mut self, ev: &Event) -> Result<(), Rejected> {
        if let Event::Member(m) = ev {
            if m.world_size > 0 && m.rank >= m.world_size {
                return Err(Rejected::OutsideWorld {
                    rank: m.rank,
                    world_size: m.world_size,
                });
            }
            self.declare_world(m.world_size);
        }
        let inside = |rank: Rank| -> Result<(), Rejected> {
            if rank > MAX_RANK {
                return Err(Rejected::TooLarge { rank });
            }
            match self.world {
                Some(world_size) if rank >= world_size => {
                    Err(Rejected::OutsideWorld { rank, world_size })
                }
                None if rank >= UNDECLARED_MAX_RANKS => Err(Rejected::Undeclared {
                    rank,
                    limit: UNDECLARED_MAX_RANKS,
                }),
                _ => Ok(()),
            }
        };
        if let Some(rank) = ev.rank() {
            inside(rank)?;
        }
        match ev {
            Event::Group(g) => g.ranks.iter().try_for_each(|&r| inside(r)),
            Event::Coll(c) => c.peer.map_or(Ok(()), inside),
            Event::Peer(p) => inside(p.peer),
            _ => Ok(()),
        }
    }

    /// At most how many bytes `ev` could add to the state: exact for the common events (a
    /// rank's op in a stream it is in, a heartbeat), an upper bound where it would create a
    /// stream or declare a group.
    fn growth(&self, ev: &Event) -> usize {
        let rank = |r: Rank| {
            if self.ranks.contains(r) {
                0
            } else {
                cost::RANK
            }
        };
        let stream = |r: Rank, name: &PgName, p2p: bool| {
            let known = self.ranks.get(r).is_some_and(|s| {
                s.pgs.iter().any(|&(p, _)| {
                    let pg = &self.pgs[p as usize];
                    pg.p2p == p2p && pg.name == *name
                })
            });
            if known {
                0
            } else {
                cost::PG + cost::NAME + name.len() + cost::MEMBER
            }
        };
        let mut bytes = ev.rank().map_or(0, rank);
        bytes += match ev {
            Event::Member(m) => cost::member_info(m),
            Event::Group(g) => {
                let same = self.coll_index.get(&g.name).is_some_and(|streams| {
                    streams
                        .iter()
                        .any(|&i| self.pgs[i as usize].declared.as_ref() == Some(&g.ranks))
                });
                if same {
                    0
                } else {
                    let per: usize = g
                        .ranks
                        .iter()
                        .map(|&r| rank(r) + cost::MEMBER + cost::DECLARED)
                        .sum();
                    cost::PG + cost::NAME + g.name.len() + per
                }
            }
            Event::Coll(c) => stream(c.rank, &c.pg, c.op.is_p2p()) + cost::KEY,
            Event::Peer(p) => stream(p.rank, &p.pg, false) + cost::PAIR,
            Event::Counters(c) => cost::COUNTER + c.addr.len() + c.peer_addr.len(),
            Event::Heartbeat { .. } | Event::Exit { .. } => 0,
        };
        bytes
    }

    /// Heap bytes the state holds, by [`cost`]'s estimate.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// How many records are retained in total (for the boundedness tests).
    pub(crate) fn retained(&self) -> usize {
        self.pgs.iter().map(Pg::retained).sum::<usize>() + self.ranks.len() + self.counters.len()
    }

    fn rank_mut(&mut self, rank: Rank, now: u64) -> &mut RankState {
        let (r, new) = self.ranks.entry(rank);
        if new {
            self.bytes += cost::RANK;
        }
        if !r.known {
            r.known = true;
            r.last_seen = now;
        }
        r
    }

    fn heartbeat(&mut self, rank: Rank, now: u64) {
        let r = self.rank_mut(rank, now);
        r.last_seen = r.last_seen.max(now);
        // Not `exited = false`: a summary may carry a rank's last heartbeat after its EXIT
        // (coalesced heartbeats travel last), and only a new Member revives a rank.
    }

    /// The stream of `name` whose scope is `scope`, created if there is none.
    fn intern(&mut self, name: &PgName, p2p: bool, scope: Option<&[Rank]>, now: u64) -> usize {
        let index = if p2p {
            &mut self.p2p_index
        } else {
            &mut self.coll_index
        };
        let streams = match index.entry(name.clone()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                self.bytes += cost::NAME + name.len();
                e.insert(Vec::new())
            }
        };
        if let Some(&i) = streams
            .iter()
            .find(|&&i| self.pgs[i as usize].scope.as_deref() == scope)
        {
            return i as usize;
        }
        let i = self.pgs.len();
        streams.push(i as u32);
        let mut pg = Pg::new(name.clone(), p2p, now, self.window());
        pg.scope = scope.map(<[Rank]>::to_vec);
        self.bytes += cost::PG + decl_bytes(&pg);
        self.pgs.push(pg);
        i
    }

    /// A group declaration: the stream of this name with this rank set, or an undeclared one
    /// whose members all belong to it (ops that arrived before the declaration), or a new one.
    ///
    /// A declaration that extends an earlier one of the same name (a large group arrives as
    /// several GROUP frames, announced again with the ranks so far after each) widens that
    /// group's stream rather than making one stream per partial list, and a repeated
    /// declaration changes nothing: neither grows the state beyond the group's final size.
    fn group(&mut self, g: &Group, now: u64) {
        let listed = dedup_keep_order(&g.ranks);
        let scope = rank_set(&listed);
        let widened = self.coll_index.get(&g.name).and_then(|streams| {
            streams.iter().map(|&i| i as usize).find(|&i| {
                self.pgs[i]
                    .declared
                    .as_ref()
                    .is_some_and(|d| d.len() < listed.len() && listed.starts_with(d))
            })
        });
        if let Some(i) = widened {
            let old = self.pgs[i].scope.clone();
            let twins: Vec<usize> = self.p2p_index.get(&g.name).map_or(Vec::new(), |s| {
                s.iter()
                    .map(|&j| j as usize)
                    .filter(|&j| self.pgs[j].scope == old)
                    .collect()
            });
            for j in twins.into_iter().chain([i]) {
                let before = decl_bytes(&self.pgs[j]);
                self.pgs[j].scope = Some(scope.clone());
                self.bytes = self.bytes + decl_bytes(&self.pgs[j]) - before;
            }
        }
        let desc = g.desc.clone();
        let g = &Group {
            name: g.name.clone(),
            desc: String::new(),
            ranks: listed,
        };
        let adopt = |pgs: &[Pg], index: &HashMap<PgName, Vec<u32>>| {
            index.get(&g.name).and_then(|streams| {
                streams.iter().map(|&i| i as usize).find(|&i| {
                    pgs[i].scope.is_none() && pgs[i].members.iter().all(|r| g.ranks.contains(r))
                })
            })
        };
        let exists = self.coll_index.get(&g.name).is_some_and(|s| {
            s.iter()
                .any(|&i| self.pgs[i as usize].scope.as_ref() == Some(&scope))
        });
        if !exists {
            for p2p in [false, true] {
                let index = if p2p {
                    &self.p2p_index
                } else {
                    &self.coll_index
                };
                if let Some(i) = adopt(&self.pgs, index) {
                    let before = decl_bytes(&self.pgs[i]);
                    self.pgs[i].scope = Some(scope.clone());
                    self.bytes = self.bytes + decl_bytes(&self.pgs[i]) - before;
                }
            }
        }
        let pg = self.intern(&g.name, false, Some(&scope), now);
        for &rank in &g.ranks {
            self.member(pg, rank, now);
        }
        if self.pgs[pg].declared.as_ref() != Some(&g.ranks) {
            let before = decl_bytes(&self.pgs[pg]);
            self.pgs[pg].declared = Some(g.ranks.clone());
            self.bytes = self.bytes + decl_bytes(&self.pgs[pg]) - before;
        }
        if self.pgs[pg].desc.is_empty() && !desc.is_empty() {
            self.bytes += desc.len();
            self.pgs[pg].desc = desc;
        }
        let twins: Vec<usize> = self.p2p_index.get(&g.name).map_or(Vec::new(), |s| {
            s.iter()
                .map(|&i| i as usize)
                .filter(|&i| self.pgs[i].scope.as_ref() == Some(&scope))
                .collect()
        });
        for p in twins {
            self.inherit_desc(p);
        }
    }

    /// Gives point-to-point stream `p` the description of its group (the collective stream of
    /// its name and rank set), which only the group's declaration carries. Siblings are found
    /// by description: pipelines whose groups each have a name of their own (`new_group` per
    /// pipeline) are one program's siblings only through it.
    fn inherit_desc(&mut self, p: usize) {
        if !self.pgs[p].p2p || !self.pgs[p].desc.is_empty() {
            return;
        }
        let Some(scope) = self.pgs[p].scope.as_ref() else {
            return;
        };
        let desc = self.coll_index.get(&self.pgs[p].name).and_then(|streams| {
            streams
                .iter()
                .map(|&i| &self.pgs[i as usize])
                .find(|c| c.scope.as_ref() == Some(scope) && !c.desc.is_empty())
                .map(|c| c.desc.clone())
        });
        if let Some(desc) = desc {
            self.bytes += desc.len();
            self.pgs[p].desc = desc;
        }
    }

    /// The stream and member index of `rank`'s op in the group it calls `name`: a stream of
    /// that name it is already in, else the one of the group of that name that lists it, else
    /// the name's undeclared stream.
    fn stream(&mut self, rank: Rank, name: &PgName, p2p: bool, now: u64) -> (usize, usize) {
        if let Some(r) = self.ranks.get(rank) {
            let found = r.pgs.iter().find(|(p, _)| {
                let pg = &self.pgs[*p as usize];
                pg.p2p == p2p && pg.name == *name
            });
            if let Some(&(p, m)) = found {
                return (p as usize, m as usize);
            }
        }
        let scope = self.coll_index.get(name).and_then(|streams| {
            streams
                .iter()
                .filter_map(|&i| self.pgs[i as usize].scope.as_ref())
                .find(|ranks| ranks.binary_search(&rank).is_ok())
                .cloned()
        });
        let pg = self.intern(name, p2p, scope.as_deref(), now);
        self.inherit_desc(pg);
        let m = self.member(pg, rank, now);
        (pg, m)
    }

    /// The member index of `rank` in stream `pg`, adding it if new.
    fn member(&mut self, pg: usize, rank: Rank, now: u64) -> usize {
        let r = self.rank_mut(rank, now);
        if let Some(&(_, m)) = r.pgs.iter().find(|(p, _)| *p as usize == pg) {
            return m as usize;
        }
        let m = self.pgs[pg].add_member(rank);
        self.ranks[rank].pgs.push((pg as u32, m as u32));
        self.bytes += cost::MEMBER;
        m
    }

    /// The stream a verdict names: of that name and kind, the one with exactly these ranks
    /// if there is one, else the first.
    pub(crate) fn find_pg(&self, name: &str, ranks: &[Rank], p2p: bool) -> Option<usize> {
        let index = if p2p {
            &self.p2p_index
        } else {
            &self.coll_index
        };
        let streams = index.get(name)?;
        streams
            .iter()
            .find(|&&i| self.pgs[i as usize].ranks() == ranks)
            .or(streams.first())
            .map(|&i| i as usize)
    }

    /// Whether collective stream `pg` has a point-to-point stream of the same group.
    pub(crate) fn has_p2p_twin(&self, pg: &Pg) -> bool {
        self.p2p_index
            .get(&pg.name)
            .is_some_and(|s| s.iter().any(|&i| self.pgs[i as usize].scope == pg.scope))
    }

    fn coll(&mut self, c: &Coll, now: u64, cfg: &Config) {
        let (pgi, m) = self.stream(c.rank, &c.pg, c.op.is_p2p(), now);
        let pg = &mut self.pgs[pgi];
        let idx = m * pg.window + slot(c.seq, pg.window);
        let rec = &mut pg.recs[idx];
        if rec.used() && rec.seq != c.seq {
            if c.seq < rec.seq {
                return; // older than the window: nothing left to compare it with
            }
            *rec = Rec::EMPTY;
        }
        rec.seq = c.seq;
        rec.sig = Sig {
            op: c.op,
            dtype: c.dtype,
            bytes: c.bytes,
            out: c.out_count,
        };
        rec.peer = c.peer;
        let flag = match c.phase {
            Phase::Enqueue => HAS_ENQ,
            Phase::Start => HAS_START,
            Phase::End => HAS_END,
        };
        let fresh = rec.flags & flag == 0;
        rec.flags |= flag;
        match c.phase {
            Phase::Enqueue => rec.enq = c.t_ns,
            Phase::Start => rec.start = c.t_ns,
            Phase::End => rec.end = c.t_ns,
        }
        pg.first_seq = Some(pg.first_seq.map_or(c.seq, |f| f.min(c.seq)));

        // Any phase implies the op was enqueued on this member.
        let ms = &mut pg.state[m];
        if ms.last_enq < Some(c.seq) {
            ms.last_enq = Some(c.seq);
        }
        if c.phase == Phase::End && ms.last_end < Some(c.seq) {
            ms.last_end = Some(c.seq);
        }
        let in_flight = ms.last_enq > ms.last_end;
        if in_flight != ms.in_flight {
            ms.in_flight = in_flight;
            if in_flight {
                pg.in_flight += 1;
            } else {
                pg.in_flight = pg.in_flight.saturating_sub(1);
            }
        }
        if !fresh {
            return;
        }
        pg.last_progress = pg.last_progress.max(now);
        if c.phase != Phase::End {
            return;
        }
        // The rank's own record of finished ops, whatever the stream's completion state.
        let rec = pg.recs[idx];
        let began = if rec.has_enq() {
            Some(rec.enq)
        } else if rec.has_start() {
            Some(rec.start)
        } else {
            None
        };
        let rs = &mut self.ranks[c.rank];
        rs.push_end(c.t_ns);
        rs.end_recv_ns = rs.end_recv_ns.max(now);
        rs.done_enq = rs.done_enq.max(began);
        let pg = &mut self.pgs[pgi];
        let window = pg.window;
        let sm = &mut pg.slots[slot(c.seq, window)];
        if !sm.used || sm.seq != c.seq {
            if sm.used && c.seq < sm.seq {
                return;
            }
            *sm = SlotMeta {
                seq: c.seq,
                ended: 0,
                used: true,
                done: false,
            };
        }
        sm.ended += 1;
        let complete = !pg.p2p && !sm.done && sm.ended as usize >= pg.members.len();
        if complete {
            sm.done = true;
        }
        if complete {
            let keys = self.pgs[pgi].keys.len();
            complete_seq(&mut self.pgs[pgi], &self.ranks, c.seq, cfg, !self.offline);
            self.bytes += (self.pgs[pgi].keys.len() - keys) * cost::KEY;
        }
    }

    fn peer(&mut self, p: &PeerProgress, now: u64, cfg: &Config) {
        let (pgi, m) = self.stream(p.rank, &p.pg, false, now);
        let pg = &mut self.pgs[pgi];
        let ms = &mut pg.state[m];
        ms.peer_seq = ms.peer_seq.max(Some(p.seq));
        let key = match p.dir {
            Dir::Send => (p.rank, p.peer),
            Dir::Recv => (p.peer, p.rank),
        };
        if !pg.pairs.contains_key(&key) {
            self.bytes += cost::PAIR;
        }
        let pair = pg.pairs.entry(key).or_default();
        let any = pair.send.seen || pair.recv.seen;
        if !any || p.seq > pair.cur_seq {
            if any {
                finish_pair(pair, cfg);
            }
            pair.cur_seq = p.seq;
            pair.send = Side::default();
            pair.recv = Side::default();
        } else if p.seq < pair.cur_seq {
            return;
        }
        let side = match p.dir {
            Dir::Send => &mut pair.send,
            Dir::Recv => &mut pair.recv,
        };
        let grew = p.bytes > side.bytes || !side.seen;
        side.seen = true;
        pair.seen_ns = pair.seen_ns.max(now);
        side.bytes = side.bytes.max(p.bytes);
        side.busy = side.busy.max(p.busy_ns);
        if grew && p.bytes > 0 {
            pg.last_progress = pg.last_progress.max(now);
        }
    }

    fn counters(&mut self, c: &LinkCounters, cfg: &Config) {
        let key = (c.addr.clone(), c.peer_addr.clone());
        if !self.counters.contains_key(&key) {
            self.bytes += cost::COUNTER + c.addr.len() + c.peer_addr.len();
        }
        let s = self.counters.entry(key).or_default();
        if s.last_t != 0 && c.t_ns > s.last_t && c.tx_bytes >= s.last_tx {
            let rate = (c.tx_bytes - s.last_tx) as f32 / (c.t_ns - s.last_t) as f32;
            let normal = s
                .base
                .value()
                .is_none_or(|b| rate * cfg.slow_factor as f32 > b);
            s.base.observe(rate, normal);
            s.rate = rate;
        }
        if c.t_ns > s.last_t {
            s.last_t = c.t_ns;
            s.last_tx = c.tx_bytes;
        }
    }
}

/// A slow time: a ratio over the baseline and an absolute excess, so near-zero baselines do
/// not turn jitter into ratios.
pub(crate) fn slow_time(x: f32, base: f32, cfg: &Config) -> bool {
    x >= base * cfg.slow_factor as f32 && x - base >= cfg.slow_min_delta_ns as f32
}

/// Closes a pair's record of one op: its throughput against the pair's own baseline.
fn finish_pair(pair: &mut PairState, cfg: &Config) {
    let bytes = pair.send.bytes.max(pair.recv.bytes);
    let busy = pair.send.busy.max(pair.recv.busy);
    if bytes == 0 || busy == 0 {
        return;
    }
    let thr = bytes as f32 / busy as f32;
    let base = pair.base.value();
    // Slower by the factor *and* by at least `slow_min_delta_ns` in absolute time, so a
    // sub-millisecond transfer jittering on a busy host is not a slow link.
    let hit = base.is_some_and(|b| {
        let expected_busy = bytes as f32 / b;
        thr * (cfg.slow_factor as f32) <= b
            && busy as f32 - expected_busy >= cfg.slow_min_delta_ns as f32
    });
    let rel_hit = base.is_some_and(|b| thr * (cfg.slow_factor as f32) <= b);
    // Relatively slow observations are not learned either, so a slowed small transfer keeps
    // showing as slowed instead of drifting into the baseline.
    pair.base.observe(thr, !hit && !rel_hit);
    pair.last_thr = thr;
    if base.is_some() {
        pair.hits.push(hit, cfg.slow_window);
        pair.rel_hits.push(rel_hit, cfg.slow_window);
    }
}

/// A sequence number ended on every member: update transfer time and compute gaps.
fn complete_seq(pg: &mut Pg, ranks: &Ranks, seq: u64, cfg: &Config, live: bool) {
    let mut transfer: Option<u64> = None;
    let mut sig = None;
    let mut agree = true;
    for m in 0..pg.members.len() {
        if let Some(rec) = pg.rec(m, seq) {
            let first = *sig.get_or_insert(rec.sig);
            agree &= normalized(first) == normalized(rec.sig);
            if let Some(d) = rec.duration() {
                transfer = Some(transfer.map_or(d, |t| t.min(d)));
            }
        }
    }
    if !agree && pg.completed_mismatch.is_none() {
        let sigs = (0..pg.members.len())
            .filter_map(|m| pg.rec(m, seq).map(|r| (m, r.sig)))
            .collect();
        pg.completed_mismatch = Some(Box::new(CompletedMismatch { seq, sigs }));
    }
    let (Some(t), Some(sig)) = (transfer, sig) else {
        return;
    };
    let k = pg.key_index(sig);
    let t = t as f32;
    {
        let ks = &mut pg.keys[k];
        ks.recent.push(t);
        let base = ks.transfer.value();
        let hit = base.is_some_and(|b| slow_time(t, b, cfg));
        ks.transfer.observe(t, !hit);
        ks.last_transfer = t;
        if base.is_some() {
            ks.transfer_hits.push(hit, cfg.slow_window);
        }
        ks.completed += 1;
        ks.last_seq = seq;
    }
    judge_gaps(pg, ranks, seq, cfg, live);
}

/// Fewest members with a gap for the peer comparison. Two are enough because the pace is the
/// lower median (see [`judge_gaps`]): of two members it is the faster one's gap, which no fault
/// shortens, so a member slower than it by the factor is slower than its peer could go. A
/// tensor-parallel group of two is the commonest group a straggler sits in.
pub(crate) const PEER_MIN_MEMBERS: usize = 2;

/// Live, a member's gap longer than its peers' by Δ is slow only if its peers waited for it,
/// in the op that followed, at least this share of Δ longer than it did (each wait is one
/// rank's own end minus its own enqueue, so clock skew plays no part). A gap that only looks
/// long, because the end of the member's previous op was lost on the way (its gap is then
/// measured from an op before), made nobody wait.
pub(crate) const PEER_WAITED: f32 = 0.5;

/// How much longer than member `m` the other members spent in `seq` (the median of theirs
/// minus its own), if their durations are known.
fn peers_waited(pg: &Pg, m: usize, seq: u64) -> Option<f32> {
    let own = pg.rec(m, seq)?.duration()? as f32;
    let mut others: Vec<f32> = (0..pg.members.len())
        .filter(|&o| o != m)
        .filter_map(|o| pg.rec(o, seq)?.duration())
        .map(|d| d as f32)
        .collect();
    if others.is_empty() {
        return None;
    }
    Some(super::baseline::median(&mut others) - own)
}

/// Fewest members for the peer comparison of an offline record (see [`judge_gaps`]): with
/// fewer, the median is one of the two ranks being compared.
pub(crate) const PEER_MIN_MEMBERS_OFFLINE: usize = 4;

/// Window of the live peer comparison: both of the last two gaps slower than the peers' median by
/// the factor. Two rather than most of eight, because the comparison needs no history and a
/// fault is to be named within seconds of its onset (a step is about a second); one odd step
/// (a garbage-collection pause) still raises nothing.
pub(crate) const PEER_WINDOW: u32 = 2;

/// A gap this many times its peers' median raises the peer condition on its own: no healthy
/// imbalance between ranks running the same compute comes near it.
pub(crate) const PEER_STRONG: f32 = 4.0;

/// In groups of at least four the gap must also lie this many robust standard deviations
/// (1.4826 × the median absolute deviation) above the median, so that a group whose members'
/// gaps are spread by design (uneven token routing) flags only a rank outside the spread.
pub(crate) const PEER_MAD_K: f32 = 3.5;

/// Whether a group's members run the same compute, so that one member's gap can be judged
/// against its peers' at the same seq without any history: not a group of the whole job
/// (its members span pipeline stages, whose compute differs by design). Data- and
/// tensor-parallel groups of a Megatron layout hold ranks of one stage.
pub(crate) fn peer_comparable(pg: &Pg, ranks: &Ranks) -> bool {
    let known = ranks.iter().filter(|(_, r)| r.known).count();
    !pg.p2p && pg.members.len() < known
}

/// The compute gaps of a completed seq: each member's gap against the group's median gap at
/// this seq, and against the member's own usual ratio to it.
///
/// Live, the peer comparison is the quick one ([`PEER_MIN_MEMBERS`], [`PEER_WINDOW`],
/// [`PEER_STRONG`]): a fault is to be named seconds after its onset. Offline it keeps the
/// slow window and groups of at least [`PEER_MIN_MEMBERS_OFFLINE`]: a Flight Recorder record's
/// times are when the watchdog noticed an op (polled, late by up to its interval), which
/// spreads two partners' gaps by more than the factor now and then, and a record is judged
/// once, with no hurry.
fn judge_gaps(pg: &mut Pg, ranks: &Ranks, seq: u64, cfg: &Config, live: bool) {
    let mut gaps = std::mem::take(&mut pg.gaps);
    gaps.clear();
    for m in 0..pg.members.len() {
        let Some(rec) = pg.rec(m, seq).copied() else {
            continue;
        };
        if !rec.has_enq() {
            continue;
        }
        // The end of the member's previous op in this group or, if later, in any group: time
        // spent waiting in another group's collective is not compute.
        let prev_here = seq
            .checked_sub(1)
            .and_then(|p| pg.rec(m, p))
            .filter(|r| r.has_end() && r.end <= rec.enq)
            .map(|r| r.end);
        let prev_any = ranks.get(pg.members[m]).and_then(|r| r.end_before(rec.enq));
        if let Some(prev) = prev_here.max(prev_any) {
            gaps.push((m, (rec.enq - prev) as f32));
        }
    }
    // The lower median, so that in a group of two the faster member sets the pace.
    let median = if gaps.len() >= 2 {
        let mid = (gaps.len() - 1) / 2;
        let mut sorted: Vec<f32> = gaps.iter().map(|g| g.1).collect();
        let (_, m, _) = sorted.select_nth_unstable_by(mid, f32::total_cmp);
        *m
    } else {
        0.0
    };
    // Ops issued back to back (a gradient all-reduce right after the last layer's) follow no
    // compute of their own: their gaps say nothing about anyone's speed.
    if median >= cfg.slow_min_delta_ns as f32 {
        pg.gap_seq = seq;
        pg.gap_median = median;
        let (min_members, window) = if live {
            (PEER_MIN_MEMBERS, PEER_WINDOW)
        } else {
            (PEER_MIN_MEMBERS_OFFLINE, cfg.slow_window)
        };
        let peers = peer_comparable(pg, ranks) && gaps.len() >= min_members;
        // The robust spread of the gaps: 1.4826 × MAD estimates σ of a normal spread.
        let spread = if gaps.len() >= 4 {
            let mut dev: Vec<f32> = gaps.iter().map(|g| (g.1 - median).abs()).collect();
            let mid = (dev.len() - 1) / 2;
            let (_, d, _) = dev.select_nth_unstable_by(mid, f32::total_cmp);
            1.4826 * *d
        } else {
            0.0
        };
        for &(m, gap) in &gaps {
            // Live, a gap slower than the peers' counts only if the peers waited for it
            // (below), which only needs asking of the few slow gaps.
            let candidate = live && peers && slow_time(gap, median, cfg);
            let waited = candidate
                .then(|| peers_waited(pg, m, seq))
                .flatten()
                .unwrap_or(0.0);
            // A gap measured from an older op than the last (the last one's end is no longer
            // known) is too long by that op: not evidence against the member.
            let exact = !candidate
                || pg.rec(m, seq).is_some_and(|r| {
                    ranks
                        .get(pg.members[m])
                        .is_none_or(|rs| rs.end_known_before(r.enq))
                });
            let cs = &mut pg.compute[m];
            let ratio = gap / median;
            let base = cs.base.value();
            let hit = base.is_some_and(|b| slow_time(gap, b * median, cfg));
            cs.base.observe(ratio, !hit);
            cs.last_gap = gap;
            cs.last_ratio = ratio;
            let was = cs.slow();
            if base.is_some() {
                cs.hits.push(hit, cfg.slow_window);
            }
            if peers {
                let corroborated = !live || (exact && waited >= PEER_WAITED * (gap - median));
                let outlier = slow_time(gap, median, cfg)
                    && gap - median > PEER_MAD_K * spread
                    && corroborated;
                cs.peer.push(outlier, window);
                cs.peer_strong = live && outlier && ratio >= PEER_STRONG;
            }
            match (was, cs.slow()) {
                (false, true) => pg.stragglers += 1,
                (true, false) => pg.stragglers = pg.stragglers.saturating_sub(1),
                _ => {}
            }
        }
    }
    pg.gaps = gaps;
}
