//! A linearizability checker for per-key registers with compare-and-swap.
//!
//! A history is linearizable if every operation can be given one instant inside its
//! `[invoke, complete]` interval at which it atomically took effect, such that the resulting
//! sequential run of a register explains every observed result. Keys are independent registers,
//! so the history is split by key and each key is checked alone, which keeps the search small.
//!
//! Per key this is the Wing & Gong search with Lowe's memoization, as in Knossos and Porcupine:
//! a depth-first search that repeatedly picks an operation that may take effect next, with a cache
//! of (set of operations already placed, register value) so that a configuration reached along two
//! paths is explored once. A few reductions keep it fast without losing completeness:
//! - an operation that never changes the register (a read, a compare-and-swap that failed) is
//!   placed as soon as its check passes, without branching, since placing it earlier never
//!   constrains the rest;
//! - values written but never observed by anyone are indistinguishable, so they are merged into
//!   one "unobserved" value;
//! - unknown-outcome operations with the same effect are interchangeable, so only the earliest
//!   invoked unused one is ever offered;
//! - unknown-outcome operations may stay unused, so a configuration that has used a superset of
//!   the unknown operations used by an explored configuration (all else equal) is skipped;
//! - an unknown-outcome write whose (unique) value a successful operation observed certainly
//!   happened, before that observer completed, so it is treated as a known write with that
//!   deadline instead of an optional operation that could take effect at any later time.
//!
//! Outcomes map to the search as follows: `Ok` operations must be placed inside their interval;
//! `Unknown` writes, deletes and compare-and-swaps may be placed anywhere after their invoke, or
//! left out (their effect may never have happened); unknown reads observed nothing and are
//! dropped; `Fail(NotApplied)` operations did not happen and are dropped; `Fail(CasMismatch)` is
//! kept as a check that the register held something other than `expect`.
//!
//! Every key starts absent. A search that explores more than
//! [`CheckConfig::max_states_per_key`] configurations stops and reports the key as inconclusive,
//! so a pathological history costs bounded time and memory instead of hanging the run.

use std::collections::hash_map::Entry as MapEntry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::history::{Entry, FailReason, History, Op, OpResult, Outcome};

/// Limits that keep a check bounded.
#[derive(Debug, Clone, Serialize)]
pub struct CheckConfig {
    /// Configurations one key's search may explore before it is reported inconclusive. Each costs
    /// a bitset of the key's operations in memory, so this also bounds memory.
    pub max_states_per_key: u64,
    /// Wall-clock time spent shrinking a counterexample; when it runs out the smallest history
    /// found so far is reported, marked as not minimal.
    pub shrink_budget: Duration,
}

impl Default for CheckConfig {
    fn default() -> Self {
        Self {
            max_states_per_key: 500_000,
            shrink_budget: Duration::from_secs(10),
        }
    }
}

/// A history the checker cannot interpret; it points at a recording bug, not a store bug.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CheckError {
    /// An entry's outcome does not fit its operation, or its times are inconsistent.
    #[error("history entry {id} is malformed: {reason}")]
    Malformed { id: usize, reason: String },
}

/// The result of checking a whole history.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// True only if every key was proven linearizable: no violation and nothing inconclusive.
    pub linearizable: bool,
    /// Keys with at least one operation that constrains the register.
    pub keys_checked: usize,
    /// Operations that took part in the search (failed operations and unknown reads excluded).
    pub ops_checked: usize,
    /// Keys whose history is not linearizable, in key order.
    pub violating_keys: Vec<String>,
    /// A shrunk witness for the first violating key.
    pub counterexample: Option<Counterexample>,
    /// Keys whose search hit the state budget: neither proven nor refuted.
    pub inconclusive: Vec<InconclusiveKey>,
}

impl Verdict {
    /// Whether a violation was found (as opposed to proven linearizable or inconclusive).
    pub fn is_violation(&self) -> bool {
        !self.violating_keys.is_empty()
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = if self.linearizable {
            "linearizable"
        } else if self.is_violation() {
            "NOT linearizable"
        } else {
            "inconclusive"
        };
        writeln!(
            f,
            "{what}: {} keys, {} operations checked",
            self.keys_checked, self.ops_checked
        )?;
        if !self.violating_keys.is_empty() {
            writeln!(f, "violating keys: {}", self.violating_keys.join(", "))?;
        }
        for k in &self.inconclusive {
            writeln!(
                f,
                "inconclusive key {:?}: {} operations, gave up after {} states",
                k.key, k.ops, k.states_explored
            )?;
        }
        if let Some(c) = &self.counterexample {
            write!(f, "{c}")?;
        }
        Ok(())
    }
}

/// A key whose search ran out of budget.
#[derive(Debug, Clone, Serialize)]
pub struct InconclusiveKey {
    pub key: String,
    pub ops: usize,
    pub states_explored: u64,
}

/// A small non-linearizable sub-history of one key.
///
/// Shrinking removes operations while the rest stays non-linearizable, but only removals that
/// could not make a linearizable history non-linearizable (see `removal_is_sound`): so the
/// counterexample is a genuine witness against the run, not an artifact of what was cut. In
/// practice reads go freely, while the writer of a value that a remaining operation observed
/// stays. `minimal` is true when no single further such removal keeps it non-linearizable.
#[derive(Debug, Clone, Serialize)]
pub struct Counterexample {
    pub key: String,
    /// The remaining operations, in invoke order, as the checker judged them: unchanged from
    /// the original history, except that an operation still running at `violated_by_ns` is
    /// shown as unknown, because at that instant it was.
    pub entries: Vec<Entry>,
    /// How many of this key's operations took part before shrinking.
    pub original_ops: usize,
    /// When the violation became certain: the completion (nanoseconds since the run started)
    /// after which no linearization exists; `None` if shrinking had no time to find it.
    pub violated_by_ns: Option<u64>,
    /// Whether shrinking finished within [`CheckConfig::shrink_budget`].
    pub minimal: bool,
}

impl fmt::Display for Counterexample {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "key {:?}: these {} of its {} operations are not linearizable{}:",
            self.key,
            self.entries.len(),
            self.original_ops,
            if self.minimal {
                ""
            } else {
                " (shrinking ran out of time; not minimal)"
            }
        )?;
        if let Some(t) = self.violated_by_ns {
            writeln!(
                f,
                "  (no linearization exists once the operation completing at {}.{:03}ms has \
                 completed)",
                t / 1_000_000,
                (t / 1_000) % 1_000
            )?;
        }
        for e in &self.entries {
            writeln!(f, "  {e}")?;
        }
        Ok(())
    }
}

/// Checks a history with the default limits.
pub fn check(history: &History) -> Result<Verdict, CheckError> {
    check_with(history, &CheckConfig::default())
}

/// Checks a history: splits it by key, searches each key, and shrinks the first violation.
pub fn check_with(history: &History, config: &CheckConfig) -> Result<Verdict, CheckError> {
    let mut by_key: BTreeMap<&str, Vec<&Entry>> = BTreeMap::new();
    for entry in &history.entries {
        if participates(entry)? {
            by_key.entry(entry.op.key()).or_default().push(entry);
        }
    }

    let mut verdict = Verdict {
        linearizable: true,
        keys_checked: by_key.len(),
        ops_checked: by_key.values().map(Vec::len).sum(),
        violating_keys: Vec::new(),
        counterexample: None,
        inconclusive: Vec::new(),
    };
    for (key, entries) in by_key {
        match search(&entries, config.max_states_per_key) {
            Search::Linearizable => {}
            Search::Violation => {
                verdict.violating_keys.push(key.to_string());
                if verdict.counterexample.is_none() {
                    verdict.counterexample = Some(shrink(key, entries, config));
                }
            }
            Search::Inconclusive { states } => verdict.inconclusive.push(InconclusiveKey {
                key: key.to_string(),
                ops: entries.len(),
                states_explored: states,
            }),
        }
    }
    verdict.linearizable = verdict.violating_keys.is_empty() && verdict.inconclusive.is_empty();
    Ok(verdict)
}

/// Whether an entry constrains its register, after checking that it is well formed.
fn participates(e: &Entry) -> Result<bool, CheckError> {
    let bad = |reason: &str| CheckError::Malformed {
        id: e.id,
        reason: reason.to_string(),
    };
    if let Some(done) = e.complete_ns {
        if done < e.invoke_ns {
            return Err(bad("it completed before it was invoked"));
        }
    }
    let definite = match (&e.op, &e.outcome) {
        (Op::Read { .. }, Outcome::Ok(OpResult::Read(_))) => true,
        (Op::Read { .. }, Outcome::Unknown(_) | Outcome::Fail(FailReason::NotApplied(_))) => {
            return Ok(false)
        }
        (Op::Read { .. }, _) => return Err(bad("a read must return a value or fail")),
        (_, Outcome::Ok(OpResult::Read(_))) => {
            return Err(bad("only a read can return a value"));
        }
        (Op::Cas { .. }, Outcome::Fail(FailReason::CasMismatch)) => true,
        (_, Outcome::Fail(FailReason::CasMismatch)) => {
            return Err(bad("only a compare-and-swap can fail its precondition"));
        }
        (_, Outcome::Fail(FailReason::NotApplied(_))) => return Ok(false),
        (_, Outcome::Ok(OpResult::Applied)) => true,
        (_, Outcome::Unknown(_)) => return Ok(true),
    };
    if definite && e.complete_ns.is_none() {
        return Err(bad("a definite outcome needs a completion time"));
    }
    Ok(true)
}

/// A register value, interned per key; `None` is "absent".
type Val = Option<u32>;

/// What an operation does to the register, with values interned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    /// Requires the register to hold this value.
    Read(Val),
    /// Sets the register (a write, or a delete when `None`).
    Set(Val),
    /// Requires `expect`, then sets `new`.
    Cas { expect: Val, new: Val },
    /// Requires anything but this value (a compare-and-swap that failed).
    NotEqual(Val),
}

impl Kind {
    /// Whether the operation only checks the register and never changes it. Such an operation
    /// can be placed as soon as its check passes: moving it earlier changes nothing for the
    /// others. (A delete of an absent key leaves it unchanged too, but it would not at a later
    /// point, so it is not an observer.)
    fn is_observer(self) -> bool {
        match self {
            Kind::Read(_) | Kind::NotEqual(_) => true,
            Kind::Cas { expect, new } => expect == new,
            Kind::Set(_) => false,
        }
    }

    /// The register after this operation, or `None` if it cannot take effect on `state`.
    fn step(self, state: Val) -> Option<Val> {
        match self {
            Kind::Read(v) => (state == v).then_some(state),
            Kind::Set(v) => Some(v),
            Kind::Cas { expect, new } => (state == expect).then_some(new),
            Kind::NotEqual(v) => (state != v).then_some(state),
        }
    }
}

/// One operation as the search sees it.
#[derive(Debug, Clone)]
struct KOp {
    inv: u64,
    /// Completion time; `u64::MAX` for optional (unknown-outcome) operations.
    ret: u64,
    required: bool,
    kind: Kind,
    /// For an optional operation: the previous (earlier-invoked) optional operation with the same
    /// kind. It may only be placed once that one is, since interchangeable operations need only be
    /// tried in one order.
    prev_twin: Option<usize>,
}

/// Turns one key's participating entries into search operations, sorted by invoke time.
fn build_ops(entries: &[&Entry]) -> Vec<KOp> {
    // A value is observed if some operation can tell it apart from other values. For values read
    // (or swapped from) by an operation that surely happened, keep the earliest such completion.
    let mut observed: HashSet<&str> = HashSet::new();
    let mut first_seen_by: HashMap<&str, u64> = HashMap::new();
    let mut writers: HashMap<&str, usize> = HashMap::new();
    for e in entries {
        let definitely_saw = match (&e.op, &e.outcome) {
            (Op::Read { .. }, Outcome::Ok(OpResult::Read(Some(v)))) => Some(v.as_str()),
            (
                Op::Cas {
                    expect: Some(v), ..
                },
                Outcome::Ok(_),
            ) => Some(v.as_str()),
            (
                Op::Cas {
                    expect: Some(v), ..
                },
                _,
            ) => {
                observed.insert(v);
                None
            }
            _ => None,
        };
        if let (Some(v), Some(done)) = (definitely_saw, e.complete_ns) {
            observed.insert(v);
            let first = first_seen_by.entry(v).or_insert(done);
            *first = (*first).min(done);
        }
        if let Op::Write { value: v, .. } | Op::Cas { new: v, .. } = &e.op {
            *writers.entry(v).or_default() += 1;
        }
    }
    // Id 0 stands for every unobserved value: they behave identically for every operation.
    let mut ids: HashMap<String, u32> = HashMap::new();
    let mut intern = |v: Option<&str>| -> Val {
        let v = v?;
        if !observed.contains(v) {
            return Some(0);
        }
        let next = u32::try_from(ids.len() + 1).unwrap_or(u32::MAX);
        Some(*ids.entry(v.to_string()).or_insert(next))
    };

    let mut sorted: Vec<&Entry> = entries.to_vec();
    sorted.sort_by_key(|e| (e.invoke_ns, e.id));
    let mut ops = Vec::with_capacity(sorted.len());
    let mut last_twin: HashMap<Kind, usize> = HashMap::new();
    for e in sorted {
        let mut required = !matches!(e.outcome, Outcome::Unknown(_));
        let mut ret = if required {
            e.complete_ns.unwrap_or(u64::MAX)
        } else {
            u64::MAX
        };
        let kind = match (&e.op, &e.outcome) {
            (Op::Read { .. }, Outcome::Ok(OpResult::Read(v))) => Kind::Read(intern(v.as_deref())),
            (Op::Read { .. }, _) => continue, // excluded by `participates`
            (Op::Write { value, .. }, _) => Kind::Set(intern(Some(value))),
            (Op::Delete { .. }, _) => Kind::Set(None),
            (Op::Cas { expect, .. }, Outcome::Fail(_)) => Kind::NotEqual(intern(expect.as_deref())),
            (Op::Cas { expect, new, .. }, _) => Kind::Cas {
                expect: intern(expect.as_deref()),
                new: intern(Some(new)),
            },
        };
        // An unknown write whose value someone surely saw did happen, before the first such
        // observer completed (it is the value's only writer). Saying so keeps it from lingering
        // as an optional operation, which is what makes searches with many timeouts blow up.
        if let (false, Op::Write { value: v, .. } | Op::Cas { new: v, .. }) = (required, &e.op) {
            if let (Some(&seen), Some(1)) = (first_seen_by.get(v.as_str()), writers.get(v.as_str()))
            {
                required = true;
                ret = seen;
            }
        }
        if !required && kind.is_observer() {
            // Optional and without effect: placing it can never help.
            continue;
        }
        let idx = ops.len();
        let prev_twin = if required {
            None
        } else {
            match last_twin.entry(kind) {
                MapEntry::Occupied(mut o) => Some(std::mem::replace(o.get_mut(), idx)),
                MapEntry::Vacant(v) => {
                    v.insert(idx);
                    None
                }
            }
        };
        ops.push(KOp {
            inv: e.invoke_ns,
            ret,
            required,
            kind,
            prev_twin,
        });
    }
    ops
}

/// How one key's search ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Search {
    Linearizable,
    Violation,
    Inconclusive { states: u64 },
}

/// Searches for a linearization of one key's entries.
fn search(entries: &[&Entry], max_states: u64) -> Search {
    Searcher::new(build_ops(entries)).run(max_states)
}

/// A search node's pending choices, kept on an explicit stack so that long histories cannot
/// overflow the thread stack.
struct Frame {
    /// Observers placed on entering this node, undone on leaving it.
    forced: Vec<usize>,
    /// Operations to try next from this node.
    choices: Vec<usize>,
    next: usize,
    /// The choice that led here and the register before it, to undo on backtracking.
    entered_by: Option<(usize, Val)>,
}

enum Enter {
    /// Every required operation is placed: a linearization exists.
    Done,
    /// This configuration was explored before; undo the forced operations.
    Seen(Vec<usize>),
    New(Frame),
}

struct Searcher {
    ops: Vec<KOp>,
    /// Required operations sorted by completion time.
    by_ret: Vec<usize>,
    pos_in_ret: Vec<usize>,
    placed: Vec<u64>,
    /// Every `by_ret[..lo_ret]` is placed (a hint that makes the earliest deadline cheap).
    lo_ret: usize,
    /// Every `ops[..lo_inv]` is placed.
    lo_inv: usize,
    remaining_required: usize,
    state: Val,
    /// Bits of the required operations, to split `placed` for the memo.
    required_mask: Vec<u64>,
    /// Configurations explored, keyed by (required operations placed, register); each holds the
    /// sets of optional operations that were placed. Having placed fewer optional operations is
    /// never worse (they may stay unused), so a configuration whose optional set includes one
    /// already explored is skipped: this subsumption is what keeps unknown outcomes from
    /// multiplying the search.
    seen: HashMap<(Vec<u64>, Val), Vec<Vec<u64>>>,
    explored: u64,
}

impl Searcher {
    fn new(ops: Vec<KOp>) -> Self {
        let mut by_ret: Vec<usize> = (0..ops.len()).filter(|&i| ops[i].required).collect();
        by_ret.sort_by_key(|&i| (ops[i].ret, i));
        let mut pos_in_ret = vec![usize::MAX; ops.len()];
        for (pos, &i) in by_ret.iter().enumerate() {
            pos_in_ret[i] = pos;
        }
        Self {
            remaining_required: by_ret.len(),
            placed: vec![0; ops.len().div_ceil(64)],
            by_ret,
            pos_in_ret,
            lo_ret: 0,
            lo_inv: 0,
            state: None,
            required_mask: {
                let mut mask = vec![0u64; ops.len().div_ceil(64)];
                for (i, op) in ops.iter().enumerate() {
                    if op.required {
                        mask[i / 64] |= 1 << (i % 64);
                    }
                }
                mask
            },
            seen: HashMap::new(),
            explored: 0,
            ops,
        }
    }

    fn is_placed(&self, i: usize) -> bool {
        self.placed[i / 64] & (1 << (i % 64)) != 0
    }

    fn place(&mut self, i: usize) {
        self.placed[i / 64] |= 1 << (i % 64);
        if self.ops[i].required {
            self.remaining_required -= 1;
        }
    }

    fn unplace(&mut self, i: usize) {
        self.placed[i / 64] &= !(1 << (i % 64));
        if self.ops[i].required {
            self.remaining_required += 1;
            self.lo_ret = self.lo_ret.min(self.pos_in_ret[i]);
        }
        self.lo_inv = self.lo_inv.min(i);
    }

    /// The earliest completion among unplaced required operations: nothing invoked after it may
    /// take effect before that operation does.
    fn deadline(&mut self) -> u64 {
        while self.lo_ret < self.by_ret.len() && self.is_placed(self.by_ret[self.lo_ret]) {
            self.lo_ret += 1;
        }
        self.by_ret
            .get(self.lo_ret)
            .map_or(u64::MAX, |&i| self.ops[i].ret)
    }

    /// Operations that may take effect next: unplaced, invoked no later than the deadline (equal
    /// times count as concurrent), and first among their unknown-outcome twins.
    fn eligible(&mut self) -> Vec<usize> {
        let deadline = self.deadline();
        while self.lo_inv < self.ops.len() && self.is_placed(self.lo_inv) {
            self.lo_inv += 1;
        }
        (self.lo_inv..self.ops.len())
            .take_while(|&i| self.ops[i].inv <= deadline)
            .filter(|&i| !self.is_placed(i))
            .filter(|&i| self.ops[i].prev_twin.is_none_or(|t| self.is_placed(t)))
            .collect()
    }

    /// Places every eligible observer whose check passes, then decides what this node is.
    fn enter(&mut self) -> Enter {
        let mut forced = Vec::new();
        loop {
            let before = forced.len();
            for i in self.eligible() {
                let kind = self.ops[i].kind;
                if kind.is_observer() && kind.step(self.state).is_some() {
                    self.place(i);
                    forced.push(i);
                }
            }
            if forced.len() == before {
                break;
            }
        }
        if self.remaining_required == 0 {
            return Enter::Done;
        }
        if !self.remember() {
            return Enter::Seen(forced);
        }
        self.explored += 1;
        let mut choices: Vec<usize> = self
            .eligible()
            .into_iter()
            .filter(|&i| self.ops[i].kind.step(self.state).is_some())
            .collect();
        // Required operations with the earliest deadlines first: they are the ones that must go.
        choices.sort_by_key(|&i| (!self.ops[i].required, self.ops[i].ret, i));
        Enter::New(Frame {
            forced,
            choices,
            next: 0,
            entered_by: None,
        })
    }

    /// Records the current configuration; false if it (or one that subsumes it) was explored.
    fn remember(&mut self) -> bool {
        let required: Vec<u64> = self
            .placed
            .iter()
            .zip(&self.required_mask)
            .map(|(p, m)| p & m)
            .collect();
        let optional: Vec<u64> = self
            .placed
            .iter()
            .zip(&self.required_mask)
            .map(|(p, m)| p & !m)
            .collect();
        let subset = |a: &[u64], b: &[u64]| a.iter().zip(b).all(|(x, y)| x & !y == 0);
        let known = self.seen.entry((required, self.state)).or_default();
        if known.iter().any(|k| subset(k, &optional)) {
            return false;
        }
        known.retain(|k| !subset(&optional, k));
        known.push(optional);
        true
    }

    fn undo(&mut self, forced: &[usize]) {
        for &i in forced.iter().rev() {
            self.unplace(i);
        }
    }

    fn run(mut self, max_states: u64) -> Search {
        let mut stack = match self.enter() {
            Enter::Done => return Search::Linearizable,
            Enter::Seen(_) => return Search::Violation, // unreachable: nothing was seen yet
            Enter::New(frame) => vec![frame],
        };
        while let Some(top) = stack.last_mut() {
            if self.explored > max_states {
                return Search::Inconclusive {
                    states: self.explored,
                };
            }
            if let Some(&i) = top.choices.get(top.next) {
                top.next += 1;
                let before = self.state;
                let Some(after) = self.ops[i].kind.step(before) else {
                    continue;
                };
                self.state = after;
                self.place(i);
                match self.enter() {
                    Enter::Done => return Search::Linearizable,
                    Enter::Seen(forced) => {
                        self.undo(&forced);
                        self.unplace(i);
                        self.state = before;
                    }
                    Enter::New(mut frame) => {
                        frame.entered_by = Some((i, before));
                        stack.push(frame);
                    }
                }
            } else if let Some(frame) = stack.pop() {
                self.undo(&frame.forced);
                if let Some((i, before)) = frame.entered_by {
                    self.unplace(i);
                    self.state = before;
                }
            }
        }
        Search::Violation
    }
}

/// Shrinks a violating key history within the time budget, in two stages.
///
/// First it finds the earliest instant by which the violation is certain: the shortest prefix of
/// the history (in the sense of Herlihy & Wing: operations still running at the cut are pending)
/// that is already non-linearizable. Everything after it is noise. Then it drops ever smaller
/// chunks, down to single operations, while the rest stays non-linearizable and the removal is
/// sound.
fn shrink(key: &str, entries: Vec<&Entry>, config: &CheckConfig) -> Counterexample {
    let deadline = Instant::now() + config.shrink_budget;
    let original_ops = entries.len();
    let (violated_by_ns, base) = earliest_violation(&entries, config, deadline);
    let mut current: Vec<usize> = (0..base.len()).collect();
    let mut minimal = false;
    let mut chunk = (current.len() / 2).max(1);
    'outer: loop {
        let mut removed_any = false;
        let mut start = 0;
        while start < current.len() {
            if Instant::now() >= deadline {
                break 'outer;
            }
            let end = (start + chunk).min(current.len());
            let candidate: Vec<usize> = current[..start]
                .iter()
                .chain(&current[end..])
                .copied()
                .collect();
            let kept: Vec<&Entry> = candidate.iter().map(|&i| &base[i]).collect();
            let removed: Vec<&Entry> = current[start..end].iter().map(|&i| &base[i]).collect();
            if !kept.is_empty()
                && removal_is_sound(&kept, &removed)
                && search(&kept, config.max_states_per_key) == Search::Violation
            {
                current = candidate;
                removed_any = true;
            } else {
                start += chunk;
            }
        }
        if chunk > 1 {
            chunk /= 2;
        } else if !removed_any {
            minimal = true;
            break;
        }
    }
    let mut entries: Vec<Entry> = current.into_iter().map(|i| base[i].clone()).collect();
    entries.sort_by_key(|e| (e.invoke_ns, e.id));
    Counterexample {
        key: key.to_string(),
        entries,
        original_ops,
        violated_by_ns,
        minimal,
    }
}

/// The earliest completion time `t` such that the history cut at `t` is non-linearizable, and
/// that cut; `None` and the whole history if no cut could be confirmed in time.
///
/// Non-linearizability of cuts is monotone (every prefix of a linearizable history is
/// linearizable), so a binary search over completion times finds it in a few searches.
fn earliest_violation(
    entries: &[&Entry],
    config: &CheckConfig,
    deadline: Instant,
) -> (Option<u64>, Vec<Entry>) {
    let violates = |t: u64| {
        let cut = cut_at(entries, t);
        let refs: Vec<&Entry> = cut.iter().collect();
        (search(&refs, config.max_states_per_key) == Search::Violation).then_some(cut)
    };
    let mut times: Vec<u64> = entries
        .iter()
        .filter(|e| !matches!(e.outcome, Outcome::Unknown(_)))
        .filter_map(|e| e.complete_ns)
        .collect();
    times.sort_unstable();
    times.dedup();
    let whole = || entries.iter().map(|&e| e.clone()).collect();
    let Some(mut best) = times.last().and_then(|&t| violates(t).map(|cut| (t, cut))) else {
        return (None, whole());
    };
    let (mut lo, mut hi) = (0, times.len() - 1);
    while lo < hi && Instant::now() < deadline {
        let mid = (lo + hi) / 2;
        match violates(times[mid]) {
            Some(cut) => {
                best = (times[mid], cut);
                hi = mid;
            }
            None => lo = mid + 1,
        }
    }
    (Some(best.0), best.1)
}

/// The history as it stood at time `t`: operations invoked by then, where those still running
/// become unknown writes (they may yet take effect) and still-running reads and failed
/// compare-and-swaps are dropped (they have observed nothing yet).
fn cut_at(entries: &[&Entry], t: u64) -> Vec<Entry> {
    entries
        .iter()
        .filter(|e| e.invoke_ns <= t)
        .filter_map(|&e| {
            let running = !matches!(e.outcome, Outcome::Unknown(_))
                && e.complete_ns.is_none_or(|done| done > t);
            if !running {
                Some(e.clone())
            } else if role(e).writes.is_some() {
                Some(Entry {
                    outcome: Outcome::Unknown(RUNNING_AT_CUT.to_string()),
                    ..e.clone()
                })
            } else {
                None
            }
        })
        .collect()
}

/// The reason given to operations that a counterexample shows as unknown because they had not
/// completed yet when the violation became certain.
const RUNNING_AT_CUT: &str = "still running when the violation became certain";

/// What an entry means for shrinking: which value it writes (if any), which value it requires
/// the register to hold (if any), and whether it requires the register *not* to hold one.
struct Role<'a> {
    writes: Option<Option<&'a str>>,
    observes: Option<Option<&'a str>>,
    not_equal: bool,
}

fn role(e: &Entry) -> Role<'_> {
    match (&e.op, &e.outcome) {
        (Op::Read { .. }, Outcome::Ok(OpResult::Read(v))) => Role {
            writes: None,
            observes: Some(v.as_deref()),
            not_equal: false,
        },
        (Op::Cas { .. }, Outcome::Fail(_)) => Role {
            writes: None,
            observes: None,
            not_equal: true,
        },
        (Op::Cas { expect, new, .. }, _) => Role {
            writes: Some(Some(new)),
            observes: Some(expect.as_deref()),
            not_equal: false,
        },
        (Op::Write { value, .. }, _) => Role {
            writes: Some(Some(value)),
            observes: None,
            not_equal: false,
        },
        (Op::Delete { .. }, _) => Role {
            writes: Some(None),
            observes: None,
            not_equal: false,
        },
        (Op::Read { .. }, _) => Role {
            writes: None,
            observes: None,
            not_equal: false,
        },
    }
}

/// Whether dropping `removed` keeps every linearizable history linearizable, so that the
/// remainder still being non-linearizable proves the original is.
///
/// Dropping an observer (a read or a failed compare-and-swap) is always safe. Dropping a writer
/// of `v` changes the register from `v` back to the previous value until the next write; that can
/// only break an operation that observed `v`, or a failed compare-and-swap that might now see
/// its `expect`. So a writer may go only if nobody else observes its value and no failed
/// compare-and-swap remains. Without this rule, dropping the writer of a value would make a read
/// of it look like a read of a value nobody wrote: a "violation" the run never had.
fn removal_is_sound(candidate: &[&Entry], removed: &[&Entry]) -> bool {
    let writers: Vec<(usize, Option<&str>)> = removed
        .iter()
        .enumerate()
        .filter_map(|(i, e)| role(e).writes.map(|v| (i, v)))
        .collect();
    if writers.is_empty() {
        return true;
    }
    if candidate.iter().any(|e| role(e).not_equal) {
        return false;
    }
    writers.iter().all(|&(i, v)| {
        let observed_by = |e: &&Entry| role(e).observes == Some(v);
        !candidate.iter().any(observed_by)
            && !removed
                .iter()
                .enumerate()
                .any(|(j, e)| j != i && role(e).writes.is_some() && observed_by(e))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{FailReason, ProcessId};
    use proptest::prelude::*;

    /// Builds hand-made histories; times are in arbitrary units.
    #[derive(Default)]
    struct H(Vec<Entry>);

    impl H {
        fn push(&mut self, p: ProcessId, op: Op, inv: u64, ret: Option<u64>, out: Outcome) {
            let id = self.0.len();
            self.0.push(Entry {
                id,
                process: p,
                op,
                invoke_ns: inv,
                complete_ns: ret,
                outcome: out,
            });
        }
        fn write(&mut self, p: ProcessId, k: &str, v: &str, inv: u64, ret: u64) -> &mut Self {
            self.push(p, w(k, v), inv, Some(ret), ok());
            self
        }
        fn write_unknown(&mut self, p: ProcessId, k: &str, v: &str, inv: u64) -> &mut Self {
            self.push(p, w(k, v), inv, None, Outcome::Unknown("timeout".into()));
            self
        }
        fn read(
            &mut self,
            p: ProcessId,
            k: &str,
            v: Option<&str>,
            inv: u64,
            ret: u64,
        ) -> &mut Self {
            let out = Outcome::Ok(OpResult::Read(v.map(str::to_string)));
            self.push(p, Op::Read { key: k.into() }, inv, Some(ret), out);
            self
        }
        fn cas(
            &mut self,
            p: ProcessId,
            k: &str,
            expect: Option<&str>,
            (new, swapped): (&str, bool),
            inv: u64,
            ret: u64,
        ) -> &mut Self {
            let op = Op::Cas {
                key: k.into(),
                expect: expect.map(str::to_string),
                new: new.into(),
            };
            let out = if swapped {
                ok()
            } else {
                Outcome::Fail(FailReason::CasMismatch)
            };
            self.push(p, op, inv, Some(ret), out);
            self
        }
        fn delete(&mut self, p: ProcessId, k: &str, inv: u64, ret: u64) -> &mut Self {
            self.push(p, Op::Delete { key: k.into() }, inv, Some(ret), ok());
            self
        }
        fn history(&self) -> History {
            History::from_entries(self.0.clone())
        }
        fn verdict(&self) -> Verdict {
            check(&self.history()).unwrap()
        }
    }

    fn w(k: &str, v: &str) -> Op {
        Op::Write {
            key: k.into(),
            value: v.into(),
        }
    }

    fn ok() -> Outcome {
        Outcome::Ok(OpResult::Applied)
    }

    fn counterexample_ids(v: &Verdict) -> Vec<usize> {
        v.counterexample
            .as_ref()
            .expect("a counterexample")
            .entries
            .iter()
            .map(|e| e.id)
            .collect()
    }

    #[test]
    fn sequential_history_is_linearizable() {
        let v = H::default()
            .read(1, "x", None, 0, 1)
            .write(1, "x", "a", 2, 3)
            .read(2, "x", Some("a"), 4, 5)
            .cas(1, "x", Some("a"), ("b", true), 6, 7)
            .cas(2, "x", Some("a"), ("c", false), 8, 9)
            .read(1, "x", Some("b"), 10, 11)
            .delete(2, "x", 12, 13)
            .read(1, "x", None, 14, 15)
            .cas(1, "x", None, ("d", true), 16, 17)
            .verdict();
        assert!(v.linearizable, "{v}");
        assert_eq!(v.keys_checked, 1);
        assert_eq!(v.ops_checked, 9);
    }

    #[test]
    fn overlapping_writes_let_a_read_see_either() {
        for seen in ["a", "b"] {
            let v = H::default()
                .write(1, "x", "a", 0, 10)
                .write(2, "x", "b", 1, 9)
                .read(3, "x", Some(seen), 11, 12)
                .verdict();
            assert!(v.linearizable, "read of {seen}: {v}");
        }
        // A read concurrent with both writes may even see nothing yet.
        let v = H::default()
            .write(1, "x", "a", 0, 10)
            .write(2, "x", "b", 1, 9)
            .read(3, "x", None, 2, 8)
            .verdict();
        assert!(v.linearizable, "{v}");
    }

    #[test]
    fn stale_read_after_completed_write_is_caught() {
        let mut h = H::default();
        h.write(1, "x", "a", 0, 10)
            .write(1, "x", "b", 20, 30)
            .read(2, "y", None, 21, 22) // another key: irrelevant and shrunk away
            .read(2, "x", Some("a"), 40, 50)
            .read(3, "x", Some("b"), 41, 45);
        let v = h.verdict();
        assert!(!v.linearizable, "{v}");
        assert_eq!(v.violating_keys, vec!["x".to_string()]);
        let c = v.counterexample.as_ref().unwrap();
        assert!(c.minimal);
        // The completed write of b, the stale read of a, and a's writer to explain it.
        assert_eq!(counterexample_ids(&v), vec![0, 1, 3], "{v}");
        let text = v.to_string();
        assert!(text.contains("write x \"b\""), "{text}");
        assert!(text.contains("read x"), "{text}");
    }

    #[test]
    fn cas_against_a_value_never_written_is_caught() {
        let v = H::default()
            .write(1, "x", "a", 0, 10)
            .cas(2, "x", Some("ghost"), ("b", true), 20, 30)
            .verdict();
        assert!(v.is_violation(), "{v}");
        assert_eq!(counterexample_ids(&v), vec![1]);
    }

    #[test]
    fn failed_cas_must_have_seen_another_value() {
        // The register surely holds "a" during the CAS, so it cannot have failed.
        let v = H::default()
            .write(1, "x", "a", 0, 10)
            .cas(2, "x", Some("a"), ("b", false), 20, 30)
            .verdict();
        assert!(v.is_violation(), "{v}");
        // ... unless an unknown write may have changed it meanwhile.
        let v = H::default()
            .write(1, "x", "a", 0, 10)
            .write_unknown(3, "x", "z", 15)
            .cas(2, "x", Some("a"), ("b", false), 20, 30)
            .verdict();
        assert!(v.linearizable, "{v}");
    }

    #[test]
    fn unknown_write_may_take_effect_later() {
        let v = H::default()
            .write_unknown(1, "x", "a", 0)
            .read(2, "x", None, 10, 20)
            .read(2, "x", Some("a"), 100, 110)
            .read(3, "x", Some("a"), 200, 210)
            .verdict();
        assert!(v.linearizable, "{v}");
    }

    #[test]
    fn unknown_write_may_never_take_effect() {
        let v = H::default()
            .write(1, "x", "a", 0, 5)
            .write_unknown(1, "x", "b", 10)
            .read(2, "x", Some("a"), 20, 30)
            .read(2, "x", Some("a"), 1000, 1010)
            .verdict();
        assert!(v.linearizable, "{v}");
    }

    #[test]
    fn unknown_write_cannot_take_effect_before_its_invoke() {
        let v = H::default()
            .read(2, "x", Some("a"), 0, 5)
            .write_unknown(1, "x", "a", 10)
            .verdict();
        assert!(v.is_violation(), "{v}");
    }

    #[test]
    fn lost_acknowledged_write_is_caught() {
        let v = H::default()
            .write(1, "x", "a", 0, 10)
            .write(1, "x", "b", 20, 30)
            .read(2, "x", Some("b"), 40, 50)
            .read(2, "x", None, 60, 70)
            .verdict();
        assert!(v.is_violation(), "{v}");
        let ids = counterexample_ids(&v);
        assert!(ids.contains(&3) && ids.len() <= 3, "{v}");
    }

    #[test]
    fn failed_operations_are_ignored() {
        let mut h = H::default();
        h.write(1, "x", "a", 0, 10);
        h.push(
            2,
            w("x", "b"),
            11,
            Some(12),
            Outcome::Fail(FailReason::NotApplied("not leader".into())),
        );
        h.push(
            3,
            Op::Read { key: "x".into() },
            13,
            None,
            Outcome::Unknown("t".into()),
        );
        h.read(3, "x", Some("a"), 20, 30);
        let v = h.verdict();
        assert!(v.linearizable, "{v}");
        assert_eq!(v.ops_checked, 2);
    }

    #[test]
    fn malformed_entries_are_rejected() {
        let mut h = H::default();
        h.push(1, w("x", "a"), 10, Some(5), ok());
        assert!(matches!(
            check(&h.history()),
            Err(CheckError::Malformed { id: 0, .. })
        ));
        let mut h = H::default();
        h.push(
            1,
            w("x", "a"),
            0,
            Some(5),
            Outcome::Ok(OpResult::Read(None)),
        );
        assert!(check(&h.history()).is_err());
    }

    #[test]
    fn search_budget_yields_inconclusive() {
        // Many concurrent unknown writes of observed values and reads that see them in a
        // scrambled order: satisfiable, but only after a wide search.
        let mut h = H::default();
        for i in 0..20u64 {
            h.write(i, "x", &format!("v{i}"), 0, 1000);
        }
        for i in 0..20u64 {
            h.read(100 + i, "x", Some(&format!("v{}", (i * 7) % 20)), 0, 1000);
        }
        let config = CheckConfig {
            max_states_per_key: 10,
            ..CheckConfig::default()
        };
        let v = check_with(&h.history(), &config).unwrap();
        assert!(!v.linearizable);
        assert!(!v.is_violation());
        assert_eq!(v.inconclusive.len(), 1, "{v}");
        assert!(v.to_string().contains("inconclusive"));
    }

    // ---- property tests ----

    /// One generated operation before simulation.
    #[derive(Debug, Clone)]
    struct Gen {
        kind: u8,
        key: u8,
        gap: u64,
        len: u64,
        /// Where in its interval it takes effect, as a fraction of the interval.
        at: f64,
        /// 0 = known outcome, 1 = unknown but took effect, 2 = unknown and never took effect,
        /// 3 = definitely failed (no effect).
        fate: u8,
        expect_pick: u8,
    }

    fn gen_op() -> impl Strategy<Value = Gen> {
        (
            0u8..4,
            0u8..2,
            0u64..20,
            1u64..40,
            0.0f64..=1.0,
            prop_oneof![6 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8), 1 => Just(3u8)],
            any::<u8>(),
        )
            .prop_map(|(kind, key, gap, len, at, fate, expect_pick)| Gen {
                kind,
                key,
                gap,
                len,
                at,
                fate,
                expect_pick,
            })
    }

    /// Simulates a real atomic register: per-process sequential operations whose effects happen
    /// at a random instant inside their interval, recording what each observed.
    fn simulate(procs: Vec<Vec<Gen>>) -> History {
        struct Planned {
            entry: Entry,
            effect_at: Option<u64>,
            fate: u8,
        }
        let mut planned = Vec::new();
        let mut counter = 0;
        for (p, ops) in procs.into_iter().enumerate() {
            let mut t = 0;
            for g in ops {
                let inv = t + g.gap;
                let ret = inv + g.len;
                t = ret + 1;
                let key = format!("k{}", g.key);
                counter += 1;
                let op = match g.kind {
                    0 => Op::Read { key },
                    1 => Op::Write {
                        key,
                        value: format!("v{counter}"),
                    },
                    2 => Op::Cas {
                        key,
                        // Resolved at simulation time to a plausible value.
                        expect: Some(g.expect_pick.to_string()),
                        new: format!("v{counter}"),
                    },
                    _ => Op::Delete { key },
                };
                let effect_at = match g.fate {
                    0 | 1 => Some(inv + (g.at * g.len as f64) as u64),
                    _ => None,
                };
                planned.push(Planned {
                    entry: Entry {
                        id: 0,
                        process: p as u64,
                        op,
                        invoke_ns: inv,
                        complete_ns: Some(ret),
                        outcome: ok(),
                    },
                    effect_at,
                    fate: g.fate,
                });
            }
        }
        // Apply effects in effect order against the real register.
        let mut order: Vec<usize> = (0..planned.len())
            .filter(|&i| planned[i].effect_at.is_some())
            .collect();
        order.sort_by_key(|&i| (planned[i].effect_at, i));
        let mut reg: HashMap<String, String> = HashMap::new();
        let mut written: Vec<String> = Vec::new();
        for i in order {
            let e = &mut planned[i].entry;
            let result = match &mut e.op {
                Op::Read { key } => Outcome::Ok(OpResult::Read(reg.get(key.as_str()).cloned())),
                Op::Write { key, value } => {
                    reg.insert(key.clone(), value.clone());
                    written.push(value.clone());
                    ok()
                }
                Op::Delete { key } => {
                    reg.remove(key.as_str());
                    ok()
                }
                Op::Cas { key, expect, new } => {
                    let pick: usize = expect.as_deref().unwrap_or("0").parse().unwrap_or(0);
                    // Mostly expect the current value (so some swaps succeed), sometimes an old
                    // one or absence.
                    *expect = match pick % 4 {
                        0 | 1 => reg.get(key.as_str()).cloned(),
                        2 if !written.is_empty() => Some(written[pick % written.len()].clone()),
                        _ => None,
                    };
                    if reg.get(key.as_str()) == expect.as_ref() {
                        reg.insert(key.clone(), new.clone());
                        written.push(new.clone());
                        ok()
                    } else {
                        Outcome::Fail(FailReason::CasMismatch)
                    }
                }
            };
            e.outcome = result;
        }
        let mut entries: Vec<Entry> = planned
            .into_iter()
            .map(|mut pl| {
                match pl.fate {
                    1 | 2 => {
                        pl.entry.complete_ns = None;
                        pl.entry.outcome = Outcome::Unknown("timeout".into());
                    }
                    3 => {
                        if let Op::Cas { expect, .. } = &mut pl.entry.op {
                            *expect = None;
                        }
                        pl.entry.outcome = Outcome::Fail(FailReason::NotApplied("rejected".into()));
                    }
                    _ => {}
                }
                pl.entry
            })
            .collect();
        entries.sort_by_key(|e| (e.invoke_ns, e.process));
        for (id, e) in entries.iter_mut().enumerate() {
            e.id = id;
        }
        History::from_entries(entries)
    }

    /// A deliberately naive Wing & Gong search over the raw entries (no memo, no reductions, no
    /// interning), as an oracle for the real one on small histories.
    fn brute_force(entries: &[Entry]) -> bool {
        fn go(entries: &[&Entry], placed: &mut Vec<bool>, state: Option<String>) -> bool {
            let required = |e: &Entry| !matches!(e.outcome, Outcome::Unknown(_));
            let ret = |e: &Entry| {
                if required(e) {
                    e.complete_ns.unwrap()
                } else {
                    u64::MAX
                }
            };
            if (0..entries.len()).all(|i| placed[i] || !required(entries[i])) {
                return true;
            }
            let deadline = (0..entries.len())
                .filter(|&i| !placed[i])
                .map(|i| ret(entries[i]))
                .min()
                .unwrap_or(u64::MAX);
            for i in 0..entries.len() {
                let e = entries[i];
                if placed[i] || e.invoke_ns > deadline {
                    continue;
                }
                let next = match (&e.op, &e.outcome) {
                    (Op::Read { .. }, Outcome::Ok(OpResult::Read(v))) => {
                        (*v == state).then(|| state.clone())
                    }
                    (Op::Write { value, .. }, _) => Some(Some(value.clone())),
                    (Op::Delete { .. }, _) => Some(None),
                    (Op::Cas { expect, .. }, Outcome::Fail(_)) => {
                        (*expect != state).then(|| state.clone())
                    }
                    (Op::Cas { expect, new, .. }, _) => {
                        (*expect == state).then(|| Some(new.clone()))
                    }
                    _ => unreachable!(),
                };
                if let Some(next) = next {
                    placed[i] = true;
                    if go(entries, placed, next) {
                        return true;
                    }
                    placed[i] = false;
                }
            }
            false
        }
        let relevant: Vec<&Entry> = entries
            .iter()
            .filter(|e| participates(e).unwrap())
            .collect();
        go(&relevant, &mut vec![false; relevant.len()], None)
    }

    /// Arbitrary small single-key histories, mostly not linearizable. Values are a few shared
    /// ones (`a`, `b`) plus ones written once (`u<id>`), so that both the unique-value reductions
    /// and histories where they must not apply get exercised.
    fn arbitrary_history() -> impl Strategy<Value = History> {
        let value = prop_oneof![
            Just(None),
            Just(Some("a".to_string())),
            Just(Some("b".to_string())),
            (0usize..9).prop_map(|i| Some(format!("u{i}"))),
        ];
        let entry = (
            0u8..4,
            value.clone(),
            value,
            any::<bool>(),
            0u64..12,
            0u64..8,
            0u8..6,
        );
        prop::collection::vec(entry, 1..9).prop_map(|raw| {
            let entries = raw
                .into_iter()
                .enumerate()
                .map(|(id, (kind, v1, v2, unique, inv, len, out))| {
                    let key = "x".to_string();
                    let written = match (unique, v2.clone()) {
                        (true, _) | (false, None) => format!("u{id}"),
                        (false, Some(v)) => v,
                    };
                    let op = match kind {
                        0 => Op::Read { key },
                        1 => Op::Write {
                            key,
                            value: written,
                        },
                        2 => Op::Delete { key },
                        _ => Op::Cas {
                            key,
                            expect: v1,
                            new: written,
                        },
                    };
                    let outcome = match (kind, out) {
                        (_, 0 | 1) => Outcome::Unknown("t".into()),
                        (_, 2) => Outcome::Fail(FailReason::NotApplied("no".into())),
                        (0, _) => Outcome::Ok(OpResult::Read(v2)),
                        (3, 3) => Outcome::Fail(FailReason::CasMismatch),
                        _ => ok(),
                    };
                    Entry {
                        id,
                        process: id as u64,
                        op,
                        invoke_ns: inv,
                        complete_ns: Some(inv + len),
                        outcome,
                    }
                })
                .collect();
            History::from_entries(entries)
        })
    }

    proptest! {
        #[test]
        fn search_agrees_with_brute_force(history in arbitrary_history()) {
            let v = check(&history).unwrap();
            prop_assert_eq!(v.linearizable, brute_force(&history.entries), "{}\n{}", v, history);
            if let Some(c) = &v.counterexample {
                // The witness is itself non-linearizable by the oracle.
                prop_assert!(!brute_force(&c.entries), "{}", c);
            }
        }

        #[test]
        fn simulated_register_histories_are_linearizable(
            procs in prop::collection::vec(prop::collection::vec(gen_op(), 0..10), 1..5)
        ) {
            let history = simulate(procs);
            let v = check(&history).unwrap();
            prop_assert!(v.linearizable, "{}\n{}", v, history);
        }

        #[test]
        fn reading_a_value_never_written_is_caught(
            mut ops in prop::collection::vec(gen_op(), 1..25),
            victim in any::<prop::sample::Index>(),
        ) {
            // One process: every operation is sequential, so no reordering can excuse the read.
            let i = victim.index(ops.len());
            ops[i].kind = 0;
            ops[i].fate = 0;
            let mut history = simulate(vec![ops]);
            let is_read = matches!(history.entries[i].op, Op::Read { .. });
            prop_assert!(is_read);
            history.entries[i].outcome = Outcome::Ok(OpResult::Read(Some("never".into())));
            let v = check(&history).unwrap();
            prop_assert!(v.is_violation(), "{}\n{}", v, history);
            let c = v.counterexample.unwrap();
            prop_assert_eq!(c.entries.len(), 1);
            prop_assert_eq!(c.entries[0].id, i);
        }
    }
}
