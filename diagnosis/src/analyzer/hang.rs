//! Hang rules: find group streams whose in-flight op stopped progressing, then name why, in
//! this precedence: mismatch, dead process, missing (or extra) participant, data-plane stall.
//!
//! Everything is decided from the members' positions (last enqueued / ended seq) and their
//! records of the stuck seq, never from the order events arrived in, and by majority: the
//! minority that disagrees is blamed, not "the other rank" of a pairwise comparison.

use super::state::{Pg, Sig, State, SEQ_WINDOW};
use super::{text, Config, Offline};
use crate::event::{Op, Rank};
use crate::verdict::{Class, Link, LinkKind, Subtype, Verdict};
use std::collections::{BTreeMap, BTreeSet};

/// Confidence below which a verdict is weak: it is ordered after every stronger one, since
/// it rests on a tie, a lost report or a missing record.
pub(crate) const WEAK: f64 = 0.45;

/// A group stream stuck at one sequence number.
#[derive(Debug)]
struct Stuck {
    pg: usize,
    seq: u64,
    /// Expected participants that enqueued `seq` (or later).
    entered: Vec<Rank>,
    /// Their member indices in the stream.
    entered_m: Vec<usize>,
    /// Expected participants that did not, with their last enqueued seq in the stream.
    behind: Vec<(Rank, Option<u64>)>,
    /// Entered ranks still inside the op: they wait here.
    waiting: Vec<Rank>,
    /// Expected participants whose position is unknown (offline: they left no record).
    unknown: Vec<Rank>,
    /// The op as the majority of entered ranks enqueued it.
    sig: Option<Sig>,
    idle_ns: u64,
}

/// What the hang rules concluded.
#[derive(Debug, Default)]
pub(crate) struct HangOutcome {
    /// Verdicts of stuck streams (victims left out), in stream order.
    pub verdicts: Vec<Verdict>,
    /// Per stream: stuck (no slow verdict is computed for it then).
    pub stuck: Vec<bool>,
    /// Sentences for the dead-process verdict: what each dead rank blocks.
    pub dead_notes: Vec<String>,
    /// Ranks without a record that are the only explanation of some stuck stream (offline),
    /// sorted, with a sentence per stream.
    pub unknown_blocking: Vec<Rank>,
    pub unknown_notes: Vec<String>,
}

/// Runs the hang rules at `now`. `dead` is sorted.
pub(crate) fn evaluate(
    state: &State,
    cfg: &Config,
    now: u64,
    offline: Option<&Offline>,
    dead: &[Rank],
) -> HangOutcome {
    let forced = offline.is_some_and(|o| o.stuck);
    let unknown: &[Rank] = offline.map_or(&[], |o| &o.missing);
    let mut out = HangOutcome {
        stuck: vec![false; state.pgs.len()],
        ..HangOutcome::default()
    };
    let mut stuck = Vec::new();
    for (i, pg) in state.pgs.iter().enumerate() {
        if pg.in_flight == 0 {
            continue;
        }
        let idle_ns = now.saturating_sub(pg.last_progress);
        if !forced && idle_ns <= cfg.hang_floor_ns {
            continue;
        }
        let Some(st) = stuck_at(state, i, idle_ns, unknown) else {
            continue;
        };
        if !forced && idle_ns <= threshold(pg, &st, cfg) {
            continue;
        }
        // An op's age is known only when the record shows when it was taken.
        let dated = offline.is_none_or(|o| o.dated);
        if forced && dated && healthy_in_flight(state, &st, now, cfg) {
            continue;
        }
        out.stuck[i] = true;
        stuck.push(st);
    }
    let mut completed = completed_mismatches(state, &stuck);
    if state.offline {
        completed.extend(overtaken_mismatches(state, &stuck, &completed));
    }
    if stuck.is_empty() {
        out.verdicts = completed;
        return out;
    }

    // Where each rank waits, to tell a missing participant from a victim blocked elsewhere.
    let mut waits_in: BTreeMap<Rank, Vec<usize>> = BTreeMap::new();
    for st in &stuck {
        for &r in &st.waiting {
            waits_in.entry(r).or_default().push(st.pg);
        }
    }

    let families = families(state);
    let mut rooted: BTreeSet<usize> = BTreeSet::new();
    let mut leads: Vec<Lead> = Vec::new();
    let mut suppressed: Vec<(usize, Vec<usize>, Vec<Rank>, Verdict)> = Vec::new();
    let mut by_pg: BTreeMap<usize, usize> = BTreeMap::new();
    let mut skippers: Vec<Rank> = Vec::new();
    for st in &stuck {
        let pg = &state.pgs[st.pg];
        let mismatches = mismatch(state, st);
        if !mismatches.is_empty() {
            by_pg.insert(st.pg, out.verdicts.len());
            out.verdicts.extend(mismatches);
            rooted.insert(st.pg);
            continue;
        }
        let expected_dead: Vec<Rank> = st
            .entered
            .iter()
            .copied()
            .chain(st.behind.iter().map(|b| b.0))
            .filter(|r| dead.binary_search(r).is_ok())
            .collect();
        if !expected_dead.is_empty() {
            out.dead_notes.push(format!(
                "{} is stuck in {} waiting for {} (idle {})",
                text::pg(pg),
                op_at(st),
                text::ranks(&sorted(expected_dead)),
                text::dur(st.idle_ns as f64)
            ));
            rooted.insert(st.pg);
            continue;
        }
        if !st.behind.is_empty() {
            let (v, victims, skipped) = participants(state, &families, st, &waits_in);
            skippers.extend(skipped);
            if v.culprits.is_empty() && !victims.is_empty() {
                let blockers: Vec<usize> = victims
                    .iter()
                    .flat_map(|r| waits_in.get(r).into_iter().flatten().copied())
                    .filter(|&p| p != st.pg)
                    .collect();
                suppressed.push((st.pg, blockers, victims, v));
            } else {
                by_pg.insert(st.pg, out.verdicts.len());
                out.verdicts.push(v);
                rooted.insert(st.pg);
            }
            continue;
        }
        if !st.unknown.is_empty() {
            // Every rank with a record entered the op: those without one are all that is left.
            out.unknown_notes.push(format!(
                "{} is stuck in {}: every rank with a record entered it, {} left none",
                text::pg(pg),
                op_at(st),
                text::ranks(&st.unknown)
            ));
            out.unknown_blocking.extend(&st.unknown);
            rooted.insert(st.pg);
            continue;
        }
        by_pg.insert(st.pg, out.verdicts.len());
        if let Some(v) = diverged(state, &families, st) {
            rooted.insert(st.pg);
            out.verdicts.push(v);
            continue;
        }
        let v = dataplane(state, st);
        if v.subtype == Subtype::Undecided {
            // Undecided: a root only if none of its members entered it while still inside an
            // earlier op of another stream (then it is that op's knock-on).
            let waits_earlier: Vec<Rank> = st
                .entered_m
                .iter()
                .filter(|&&m| blocked_earlier(state, st, m).is_some())
                .map(|&m| pg.members[m])
                .collect();
            let root = waits_earlier.is_empty();
            if root {
                rooted.insert(st.pg);
            }
            leads.push(Lead {
                verdict: out.verdicts.len(),
                pg: st.pg,
                root,
                waits_earlier,
                scores: candidates(state, st)
                    .into_iter()
                    .map(|c| (c.rank, c.score, c.why.join("; ")))
                    .collect(),
                members: st.entered.clone(),
            });
        } else {
            rooted.insert(st.pg);
        }
        out.verdicts.push(v);
    }
    out.unknown_blocking = sorted(std::mem::take(&mut out.unknown_blocking));

    // A victim's stream is explained when every stream its ranks wait in is a root cause or
    // itself explained; chains resolve over repeated passes. A cycle with no root (two groups
    // each waiting for the other) is reported as it is rather than hidden.
    let mut explained = rooted.clone();
    loop {
        let before = explained.len();
        for (pg, blockers, _, _) in &suppressed {
            if !blockers.is_empty() && blockers.iter().all(|b| explained.contains(b)) {
                explained.insert(*pg);
            }
        }
        if explained.len() == before {
            break;
        }
    }
    for (pg, blockers, victims, mut v) in suppressed {
        if explained.contains(&pg) && !rooted.contains(&pg) {
            let note = format!(
                "{} is also stuck because {} {} blocked here",
                text::pg(&state.pgs[pg]),
                text::ranks(&victims),
                if victims.len() == 1 { "is" } else { "are" }
            );
            let root = blockers.iter().find_map(|b| by_pg.get(b).copied());
            match root {
                Some(i) => out.verdicts[i].evidence.push(note),
                None => out.dead_notes.push(note),
            }
        } else {
            // No root found: keep the verdict, naming the waiting ranks after all. They are
            // the minority that did not enter this op while waiting in streams no root
            // explains: where a wait-for cycle (a deadlock) breaks, the rank whose program
            // diverged from its peers' is the one missing from its peers' op.
            let pgr = &state.pgs[pg];
            leads.push(Lead {
                verdict: out.verdicts.len(),
                pg,
                root: false,
                waits_earlier: Vec::new(),
                scores: victims
                    .iter()
                    .map(|&r| {
                        (
                            r,
                            VICTIM_SCORE,
                            "it never entered the op its peers wait in here, and waits in a stream no root explains".to_string(),
                        )
                    })
                    .collect(),
                members: pgr.members.clone(),
            });
            v.culprits = victims;
            v.confidence = (v.confidence * 0.5).min(0.4);
            out.verdicts.push(v);
        }
    }
    fold_leads(state, &mut out.verdicts, leads);
    fold_ahead(state, &mut out.verdicts, &skippers);
    out.verdicts.extend(completed);
    out
}

/// A rank that skipped an op (see [`passed_point`]) was not held by it, and neither were the
/// members of its own groups, which went on with it: in the groups they share with the
/// skipper's peers they are now ahead of the majority, waiting at the next op. Those
/// extra-participant verdicts are the skip's doing, not faults of their own: each becomes a
/// sentence of the skipper's verdict when every rank it names shares a collective group with
/// the skipper.
fn fold_ahead(state: &State, verdicts: &mut Vec<Verdict>, skippers: &[Rank]) {
    if skippers.is_empty() {
        return;
    }
    let mates = |a: Rank, b: Rank| {
        state.ranks.get(a).is_some_and(|ra| {
            ra.pgs.iter().any(|&(p, _)| {
                let pg = &state.pgs[p as usize];
                !pg.p2p && pg.member_of(b).is_some()
            })
        })
    };
    let mut moved: Vec<(usize, usize)> = Vec::new();
    for (i, v) in verdicts.iter().enumerate() {
        if v.subtype != Subtype::ExtraParticipant || v.culprits.is_empty() {
            continue;
        }
        let root = verdicts.iter().position(|r| {
            r.subtype == Subtype::MissingParticipant
                && r.culprits.iter().any(|&c| {
                    skippers.contains(&c) && v.culprits.iter().all(|&x| x == c || mates(x, c))
                })
        });
        if let Some(root) = root {
            moved.push((i, root));
        }
    }
    let mut per_root: BTreeMap<usize, (BTreeSet<Rank>, Vec<String>)> = BTreeMap::new();
    let mut carried: Vec<(usize, String)> = Vec::new();
    for &(i, root) in &moved {
        let v = &verdicts[i];
        let e = per_root.entry(root).or_default();
        e.0.extend(&v.culprits);
        if let Some(pg) = &v.pg {
            e.1.push(format!("pg {}", pg.name));
        }
        // What other rules attached to it (the streams waiting behind it) stays told.
        carried.extend(
            v.evidence
                .iter()
                .filter(|e| e.contains(" is also stuck because "))
                .map(|e| (root, e.clone())),
        );
    }
    for (root, e) in carried {
        verdicts[root].evidence.push(e);
    }
    for (root, (ranks, pgs)) in per_root {
        let ranks: Vec<Rank> = ranks.into_iter().collect();
        let shown: Vec<String> = pgs.iter().take(4).cloned().collect();
        verdicts[root].evidence.push(format!(
            "{} {} ahead of the majority in {} group{} ({}{}): {} on with the skipping rank, which held nobody back",
            text::ranks(&ranks),
            if ranks.len() == 1 { "is" } else { "are" },
            pgs.len(),
            if pgs.len() == 1 { "" } else { "s" },
            shown.join(", "),
            if pgs.len() > shown.len() { ", …" } else { "" },
            if ranks.len() == 1 { "it went" } else { "they went" }
        ));
    }
    let drop: BTreeSet<usize> = moved.iter().map(|m| m.0).collect();
    let mut i = 0;
    verdicts.retain(|_| {
        i += 1;
        !drop.contains(&(i - 1))
    });
}

/// Streams by kind (see [`Pg::family`]): a data-parallel job's sibling groups.
type Families<'a> = BTreeMap<(&'a str, usize, bool), Vec<usize>>;

fn families(state: &State) -> Families<'_> {
    let mut out: Families = BTreeMap::new();
    for (i, pg) in state.pgs.iter().enumerate() {
        out.entry(pg.family()).or_default().push(i);
    }
    out
}

/// Sibling groups consulted when comparing a stream with its kind (the first ones, in the
/// order the analyzer met them): enough for a majority, and bounded in a 16k-rank hang.
const MAX_SIBLINGS: usize = 16;
/// How many ops before a pending point-to-point op [`diverged`] looks back.
const DIVERGE_DEPTH: u64 = 8;
/// Ranks whose progress says where the program is, at most (see [`passed_point`]).
const MAX_REFERENCE: usize = 8;

/// Score of a rank that is behind in a stuck stream while waiting in another stream that no
/// root cause explains (see [`fold_leads`]).
const VICTIM_SCORE: u32 = 3;

/// A weak finding of one stuck stream, kept so that all of one fault's weak findings become
/// one verdict: an undecided stream with its ranked candidates, or a stream whose missing
/// members wait in streams nothing explains.
#[derive(Debug)]
struct Lead {
    /// Index of the stream's verdict in the outcome's verdicts.
    verdict: usize,
    pg: usize,
    /// No member waits in an earlier op elsewhere: the stream is where the hang begins.
    root: bool,
    /// Members that entered this op while still inside an earlier op of another stream.
    waits_earlier: Vec<Rank>,
    /// (rank, score, why), best first.
    scores: Vec<(Rank, u32, String)>,
    members: Vec<Rank>,
}

/// One hang seen in many groups is one finding. A hung rank stops every group it is in, and
/// every group its peers are in once they wait for it: a 64-rank 3-D job shows a dozen stuck
/// streams, each "undecided" on its own. This replaces every weak verdict of `leads` by one
/// verdict that says where the hang begins and ranks candidates over all of them:
/// - a stream whose members all entered its op with nothing earlier pending elsewhere is a
///   root; its candidates' evidence counts (their own records set them apart);
/// - a stream some of whose members wait in an earlier op elsewhere is a knock-on; its
///   candidates' evidence does not count (it is what waiting looks like);
/// - a rank missing from its peers' op while it waits in a stream nothing explains (a cycle:
///   its peers wait for it and it waits for them) counts [`VICTIM_SCORE`] per such stream.
///
/// The best-scored ranks are named when they are fewer than half of the ranks considered (or
/// one of a pair);
/// otherwise nobody is, and the verdict says why the records cannot tell them apart.
fn fold_leads(state: &State, verdicts: &mut Vec<Verdict>, leads: Vec<Lead>) {
    const SHOWN: usize = 8;
    if leads.is_empty() || (leads.len() == 1 && !verdicts[leads[0].verdict].culprits.is_empty()) {
        return;
    }
    // Roots and cycles' missing members count; knock-on streams only when there is neither.
    let first_in_line = |l: &Lead| l.root || l.waits_earlier.is_empty();
    let any_first = leads.iter().any(first_in_line);
    let counted = |l: &Lead| first_in_line(l) || !any_first;
    let mut score: BTreeMap<Rank, (u32, Vec<String>)> = BTreeMap::new();
    let mut considered: BTreeSet<Rank> = BTreeSet::new();
    for l in leads.iter().filter(|l| counted(l)) {
        considered.extend(&l.members);
        let where_ = text::pg(&state.pgs[l.pg]);
        for (r, s, why) in &l.scores {
            let e = score.entry(*r).or_default();
            e.0 += s;
            e.1.push(format!("in {where_}: {why}"));
        }
    }
    let mut ranked: Vec<(Rank, u32, Vec<String>)> =
        score.into_iter().map(|(r, (s, w))| (r, s, w)).collect();
    ranked.retain(|c| c.1 > 0);
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));

    let first = &verdicts[leads[0].verdict];
    let roots: Vec<&Lead> = leads.iter().filter(|l| l.root).collect();
    let mut v = first.clone();
    v.class = Class::Hang;
    v.subtype = Subtype::Undecided;
    v.culprits = Vec::new();
    v.links = Vec::new();
    v.evidence = Vec::new();
    if let [only] = roots.as_slice() {
        let r = &verdicts[only.verdict];
        v.pg = r.pg.clone();
        v.seq = r.seq;
        v.op = r.op;
    } else {
        v.pg = None;
        v.seq = None;
        v.op = None;
    }
    let place = |l: &Lead| {
        let lv = &verdicts[l.verdict];
        match (lv.op, lv.seq) {
            (Some(op), Some(seq)) => format!("{} at {op} #{seq}", text::pg(&state.pgs[l.pg])),
            _ => text::pg(&state.pgs[l.pg]),
        }
    };
    if roots.is_empty() {
        v.evidence.push(format!(
            "{} streams are stuck and each waits for another (a cycle): none is where the hang begins on its own",
            leads.len()
        ));
    } else {
        let names: Vec<String> = roots.iter().take(SHOWN).map(|l| place(l)).collect();
        v.evidence.push(format!(
            "{} streams are stuck; the hang begins in {} ({}): every member entered the op with nothing earlier pending elsewhere",
            leads.len(),
            if roots.len() == 1 { "one" } else { "several" },
            names.join(", ")
        ));
    }
    let knock_on = leads
        .iter()
        .filter(|l| !l.root && !l.waits_earlier.is_empty())
        .count();
    if knock_on > 0 {
        v.evidence.push(format!(
            "{knock_on} further stuck stream{} wait{} behind: some of their members entered an earlier op elsewhere and never finished it",
            if knock_on == 1 { "" } else { "s" },
            if knock_on == 1 { "s" } else { "" }
        ));
    }
    let total = ranked.len();
    for (i, (r, s, why)) in ranked.iter().take(SHOWN).enumerate() {
        v.evidence.push(format!(
            "candidate {} of {total}: rank {r} (weight {s}): {}",
            i + 1,
            why.join("; ")
        ));
    }
    if total > SHOWN {
        v.evidence
            .push(format!("{} more candidates are not listed", total - SHOWN));
    }
    let top = ranked.first().map_or(0, |c| c.1);
    let best: Vec<Rank> = ranked.iter().filter(|c| c.1 == top).map(|c| c.0).collect();
    // Fewer than half, or one of a pair (a two-member group's hung GPU against its peer).
    let few = best.len() * 2 < considered.len() || (best.len() == 1 && considered.len() == 2);
    if !best.is_empty() && few {
        v.culprits = sorted(best);
        v.confidence = if total == v.culprits.len() { 0.4 } else { 0.35 };
    } else {
        let members: Vec<Rank> = considered.iter().copied().collect();
        v.evidence.push(format!(
            "undecidable from these records: no member's records stand out from its peers' (no candidate to rank above the others): every one of {} may hold the hang ({} entered the op and none finished; without TORCH_NCCL_ENABLE_TIMING a record does not say whether a member's GPU ever reached it, which is what would tell a hung GPU from its waiting peers)",
            text::ranks(&members),
            members.len()
        ));
        let tied = tied_candidates(state, verdicts, &leads, &members);
        let n = tied.len();
        for (i, (r, facts)) in tied.iter().take(SHOWN).enumerate() {
            v.evidence.push(format!(
                "candidate {} of {n}, tied with the others: rank {r}: {facts}",
                i + 1
            ));
        }
        if n > SHOWN {
            v.evidence.push(format!(
                "{} more candidates, tied, are not listed",
                n - SHOWN
            ));
        }
        v.confidence = 0.2;
    }
    // Sentences other rules attached to the folded verdicts (what else waits behind them).
    let mut drop: Vec<usize> = leads.iter().map(|l| l.verdict).collect();
    for &i in &drop {
        for e in &verdicts[i].evidence {
            if e.contains(" is also stuck because ") {
                v.evidence.push(e.clone());
            }
        }
    }
    drop.sort_unstable();
    let at = drop[0];
    for i in drop.into_iter().rev() {
        verdicts.remove(i);
    }
    verdicts.insert(at.min(verdicts.len()), v);
}

/// What each of `members` records in the stream where the hang begins, when nothing sets any
/// of them apart: every one is a candidate, tied, and the user sees for each why it cannot be
/// ruled out (its op there was enqueued and never finished, like its peers'), where it last
/// made progress, and what else it has pending. Members of no root stream come last, with
/// nothing recorded.
fn tied_candidates(
    state: &State,
    verdicts: &[Verdict],
    leads: &[Lead],
    members: &[Rank],
) -> Vec<(Rank, String)> {
    let roots: Vec<&Lead> = leads.iter().filter(|l| l.root).collect();
    members
        .iter()
        .map(|&r| {
            let facts = roots.iter().find_map(|l| {
                let pg = &state.pgs[l.pg];
                let m = pg.member_of(r)?;
                let lv = &verdicts[l.verdict];
                let seq = lv.seq?;
                let rec = pg.rec(m, seq)?;
                let op = lv.op.map_or_else(|| rec.sig.op.to_string(), |o| o.to_string());
                let word = |rec: &super::state::Rec| {
                    if rec.has_end() {
                        "completed"
                    } else if rec.has_start() {
                        "started and never completed"
                    } else {
                        "enqueued, with no start or completion recorded"
                    }
                };
                let state_word = word(rec);
                let alike = (0..pg.members.len())
                    .filter_map(|o| pg.rec(o, seq))
                    .all(|o| word(o) == state_word);
                let last = pg.state[m]
                    .last_end
                    .map_or("none".to_string(), |e| format!("#{e}"));
                let pending = state.ranks.get(r).map_or(0, |rs| {
                    rs.pgs
                        .iter()
                        .filter(|&&(p, pm)| {
                            p as usize != l.pg && state.pgs[p as usize].state[pm as usize].in_flight
                        })
                        .count()
                });
                Some(format!(
                    "its {op} #{seq} in {} is {state_word}{}; the last op it finished there is {last}; {pending} of its other streams have an op pending",
                    text::pg(pg),
                    if alike { ", as its peers' are" } else { "" }
                ))
            });
            (
                r,
                facts.unwrap_or_else(|| "its records of the stuck streams say nothing more".into()),
            )
        })
        .collect()
}

/// The stream and seq where member `m` of the stuck stream `st` is still inside an op of
/// another stream that it enqueued before this one (it waits there, not here).
fn blocked_earlier(state: &State, st: &Stuck, m: usize) -> Option<(usize, u64)> {
    let pg = &state.pgs[st.pg];
    let rank = pg.members[m];
    // Each end of a point-to-point stream numbers its own ops: its pending one is its own.
    let seq = if pg.p2p {
        frontier(state, pg, m)?
    } else {
        st.seq
    };
    let r = pg.rec(m, seq).filter(|r| r.has_enq())?;
    let rs = state.ranks.get(rank)?;
    for &(p, pm) in &rs.pgs {
        let other = &state.pgs[p as usize];
        if p as usize == st.pg || !other.state[pm as usize].in_flight {
            continue;
        }
        let Some(f) = frontier(state, other, pm as usize) else {
            continue;
        };
        if other
            .rec(pm as usize, f)
            .is_some_and(|o| o.has_enq() && o.enq < r.enq)
        {
            return Some((p as usize, f));
        }
    }
    None
}

/// Mismatches at seqs every member completed, in streams the stuck rules do not already
/// report a mismatch for: NCCL finishing an op whose ranks disagree proves nothing is right
/// (a smaller buffer on one rank reduces garbage into the others'), so it is evidence as much
/// as a hang is.
fn completed_mismatches(state: &State, stuck: &[Stuck]) -> Vec<Verdict> {
    let mut out = Vec::new();
    for (i, pg) in state.pgs.iter().enumerate() {
        let Some(cm) = &pg.completed_mismatch else {
            continue;
        };
        let stuck_mismatch = stuck.iter().any(|st| {
            st.pg == i && majority(pg, &st.entered_m, st.seq).is_some_and(|m| m.1.len() > 1)
        });
        if stuck_mismatch {
            continue;
        }
        for mut v in mismatch_verdicts(state, i, cm.seq, cm.sigs.iter().copied()) {
            v.evidence.push(format!(
                "every member of {} completed #{}: finishing does not make the ranks agree",
                text::pg(pg),
                cm.seq
            ));
            out.push(v);
        }
    }
    out
}

/// Mismatches at seqs that no member completed while later ops of the stream did, in streams
/// with no mismatch reported yet (offline: each record holds its op's own final state). An
/// asynchronous collective (FSDP's reduce_scatter on its own stream) whose members disagree on
/// its tensors never completes, while the ranks go on and complete later ops: its members'
/// records of it are evidence the stuck rules, which look at the first unfinished seq in
/// order, can miss once later ends have been recorded.
fn overtaken_mismatches(state: &State, stuck: &[Stuck], already: &[Verdict]) -> Vec<Verdict> {
    let mut out = Vec::new();
    for (i, pg) in state.pgs.iter().enumerate() {
        if pg.p2p || pg.completed_mismatch.is_some() {
            continue;
        }
        let reported = |v: &Verdict| {
            v.class == Class::Mismatch && v.pg.as_ref().is_some_and(|p| p.name == *pg.name)
        };
        if already.iter().any(reported) {
            continue;
        }
        let Some(last) = pg.state.iter().filter_map(|m| m.last_end).max() else {
            continue;
        };
        let lo = last.saturating_sub(pg.window as u64 - 1);
        for seq in lo..last {
            let recs: Vec<(usize, Sig, bool)> = (0..pg.members.len())
                .filter_map(|m| pg.rec(m, seq).map(|r| (m, r.sig, r.has_end())))
                .collect();
            if recs.len() < pg.members.len() || recs.iter().any(|r| r.2) {
                continue;
            }
            if stuck.iter().any(|st| {
                st.pg == i && majority(pg, &st.entered_m, st.seq).is_some_and(|m| m.1.len() > 1)
            }) {
                continue;
            }
            let vs = mismatch_verdicts(state, i, seq, recs.iter().map(|r| (r.0, r.1)));
            if vs.is_empty() {
                continue;
            }
            for mut v in vs {
                v.evidence.push(format!(
                    "no member of {} completed #{seq} while later ops of the stream completed (#{last}): the op never finished",
                    text::pg(pg)
                ));
                out.push(v);
            }
            break;
        }
    }
    out
}

/// A stream caught in flight by a dump taken on demand rather than at a timeout: every
/// expected participant entered the op, they agree on it, and the last of them entered it
/// no longer ago than the op's usual duration allows ([`threshold`]). A dump at a watchdog
/// timeout never looks like this, since the op has then been in flight for the timeout
/// (FR's dump also marks a started op as discovered at the dump, so the dump's time shows).
fn healthy_in_flight(state: &State, st: &Stuck, now: u64, cfg: &Config) -> bool {
    let pg = &state.pgs[st.pg];
    if !st.behind.is_empty() || !st.unknown.is_empty() || st.entered.is_empty() {
        return false;
    }
    if pg.p2p {
        // Each end numbers its own ops: every waiting member's pending op must have its peer
        // in the stream with an op pending too (a peer without a record may be dead).
        let mut last_arrival = None;
        for m in 0..pg.members.len() {
            let Some(seq) = frontier(state, pg, m) else {
                continue;
            };
            let Some(rec) = pg.rec(m, seq).filter(|r| r.has_enq()) else {
                return false;
            };
            let peer_waits = rec
                .peer
                .and_then(|p| pg.member_of(p))
                .is_some_and(|p| frontier(state, pg, p).is_some());
            if !peer_waits {
                return false;
            }
            last_arrival = last_arrival.max(Some(rec.enq));
        }
        return last_arrival.is_some_and(|t| now.saturating_sub(t) <= threshold(pg, st, cfg));
    }
    if majority(pg, &st.entered_m, st.seq).is_none_or(|m| m.1.len() > 1) {
        return false;
    }
    let last_arrival = st
        .entered_m
        .iter()
        .filter_map(|&m| pg.rec(m, st.seq))
        .filter(|r| r.has_enq())
        .map(|r| r.enq)
        .max();
    last_arrival.is_some_and(|t| now.saturating_sub(t) <= threshold(pg, st, cfg))
}

/// The hang threshold of a stream: the floor, or `hang_factor` times its op's usual transfer
/// time if that is longer.
fn threshold(pg: &Pg, st: &Stuck, cfg: &Config) -> u64 {
    let typical = st
        .sig
        .and_then(|s| pg.key_of(s))
        .and_then(|k| pg.keys[k].recent.median())
        .unwrap_or(0.0);
    cfg.hang_floor_ns
        .max((f64::from(typical) * cfg.hang_factor) as u64)
}

/// Whether member `m` has finished `seq` as far as the evidence goes: its `End` arrived, it
/// ended a later op of the stream (a stream's ops finish in order), or it finished an op it
/// enqueued after this one in any group (a rank waits for its ops in program order). The last
/// two make a lost `End` report harmless.
fn done(state: &State, pg: &Pg, m: usize, seq: u64) -> bool {
    if pg.state[m].last_end >= Some(seq) {
        return true;
    }
    let Some(rec) = pg.rec(m, seq) else {
        return false;
    };
    if rec.has_end() {
        return true;
    }
    // A record holds each op's own final state (a Flight Recorder entry says `completed` or
    // not): nothing is inferred from other work. An asynchronous collective's rank goes on
    // working in other groups, and on other streams, while the collective is still running,
    // so later work done elsewhere says nothing about this op.
    if state.offline {
        return false;
    }
    let began = if rec.has_enq() {
        rec.enq
    } else if rec.has_start() {
        rec.start
    } else {
        return false;
    };
    if state
        .ranks
        .get(pg.members[m])
        .is_some_and(|r| r.done_enq > Some(began))
    {
        return true;
    }
    // It went on to a later op of the stream and the collective finished elsewhere: its data
    // moved, so only the report of its end can be missing.
    let n = pg.members.len();
    let ended = |o: usize| o != m && pg.rec(o, seq).is_some_and(|r| r.has_end());
    !pg.p2p
        && ((pg.state[m].last_enq > Some(seq) && (0..n).any(ended))
            // Every other member finished the collective: none can without this member's
            // data, so its part moved too and only the report of its end was lost (a probe
            // loses some on a busy host; with seconds-long steps behind a straggler the next
            // op that would show it done is seconds away). A kernel that really hangs after
            // its data moved keeps the rank from its next op, where its peers name it.
            || (n >= 2 && (0..n).all(|o| o == m || ended(o))))
}

/// The first seq member `m` entered and has not finished, if any.
fn frontier(state: &State, pg: &Pg, m: usize) -> Option<u64> {
    let ms = &pg.state[m];
    if !ms.in_flight {
        return None;
    }
    let first = ms.last_end.map_or(pg.first_seq.unwrap_or(0), |e| e + 1);
    let last = ms.last_enq?;
    // Past the window nothing is known about a seq: count it as unfinished.
    (first..=last)
        .take(pg.window)
        .find(|&s| !done(state, pg, m, s))
        .or((last.saturating_sub(first) >= pg.window as u64).then_some(first))
}

/// Whether member `m` shows itself at `seq` or later: any collective phase (all imply the
/// enqueue), or a per-peer record when the stream's name carries no point-to-point stream whose
/// records could be mistaken for it.
fn entered(state: &State, pg: &Pg, m: usize, seq: u64) -> bool {
    let ms = &pg.state[m];
    ms.last_enq >= Some(seq) || (!state.has_p2p_twin(pg) && ms.peer_seq >= Some(seq))
}

/// Where a stream with an op in flight is stuck: the lowest seq some member entered and has not
/// finished, and who entered it.
fn stuck_at(state: &State, pgi: usize, idle_ns: u64, unknown: &[Rank]) -> Option<Stuck> {
    let pg = &state.pgs[pgi];
    let seq = (0..pg.members.len())
        .filter_map(|m| frontier(state, pg, m))
        .min()?;
    let mut entered_ranks = Vec::new();
    let mut entered_m = Vec::new();
    let mut waiting = Vec::new();
    let mut behind = Vec::new();
    let mut unknown_here = Vec::new();
    for (m, ms) in pg.state.iter().enumerate() {
        let rank = pg.members[m];
        if pg.p2p && frontier(state, pg, m).is_some() {
            // Each rank numbers its own point-to-point ops, so members of one stream wait at
            // different seqs: anyone with an unfinished op waits here.
            waiting.push(rank);
        }
        if unknown.binary_search(&rank).is_ok() {
            unknown_here.push(rank);
        } else if entered(state, pg, m, seq) {
            entered_ranks.push(rank);
            entered_m.push(m);
            if !pg.p2p && !done(state, pg, m, seq) {
                waiting.push(rank);
            }
        } else if !pg.p2p {
            behind.push((rank, ms.last_enq));
        }
    }
    let sig = majority(pg, &entered_m, seq).map(|(sig, _, _)| sig);
    // Point-to-point ops involve only their two ends; collectives involve every member. Each
    // end numbers its own ops, so seqs do not line up across ranks (a middle pipeline stage
    // posts four a step, the last stage two): what a waiting member waits for is the peer of
    // its own pending op. A peer with nothing pending in the stream has not posted the other
    // end: it is busy elsewhere or dead. A peer with an op pending is judged with the pair.
    if pg.p2p {
        let peers: BTreeSet<Rank> = (0..pg.members.len())
            .filter_map(|m| {
                let own = frontier(state, pg, m)?;
                let peer = pg.rec(m, own)?.peer?;
                let posted = pg
                    .member_of(peer)
                    .is_some_and(|p| frontier(state, pg, p).is_some());
                (!posted).then_some(peer)
            })
            .collect();
        unknown_here.retain(|r| peers.contains(r));
        let peers: BTreeSet<Rank> = peers
            .into_iter()
            .filter(|r| unknown.binary_search(r).is_err())
            .collect();
        behind = peers
            .into_iter()
            .map(|r| (r, pg.member_of(r).and_then(|m| pg.state[m].last_enq)))
            .collect();
    }
    Some(Stuck {
        pg: pgi,
        seq,
        entered: sorted(entered_ranks),
        entered_m,
        behind,
        waiting: sorted(waiting),
        unknown: unknown_here,
        sig,
        idle_ns,
    })
}

/// The fields collectives must agree on, for comparison: send and recv pair up, and ops whose
/// per-rank sizes legitimately differ are compared without size.
pub(crate) fn normalized(sig: Sig) -> Sig {
    let mut s = sig;
    if s.op.is_p2p() {
        s.op = Op::Send;
    }
    // A coalesced collective (`reduce_scatter_tensor_coalesced`, `allreduce_coalesced`, ...)
    // takes the same list of tensors on every member, so its sizes must agree like its
    // single-tensor form's; the records of a point-to-point batch are keyed by their first
    // send or recv, never as `coalesced`.
    if matches!(s.op, Op::AllToAll | Op::Scatter | Op::Other) {
        s.bytes = 0;
    }
    // Outputs must agree where every member receives the same shape: all_gather's whole
    // tensor, reduce_scatter's shard, an all_reduce or broadcast in place (Flight Recorder's
    // analyzer checks output sizes too). Elsewhere they differ by design (gather and reduce
    // fill the root only, scatter and all_to_all hand out shares, p2p ends are not alike).
    if !matches!(
        s.op,
        Op::AllReduce | Op::AllGather | Op::ReduceScatter | Op::Broadcast
    ) {
        s.out = 0;
    }
    s
}

/// Camps of the `members` (indices) by normalized signature at `seq`, and the majority camp:
/// the largest, ties broken towards the camp with the lowest rank so the answer never depends
/// on arrival order. Returns (majority's original signature, camps, tie).
#[allow(clippy::type_complexity)]
fn majority(pg: &Pg, members: &[usize], seq: u64) -> Option<(Sig, BTreeMap<Sig, Vec<Rank>>, bool)> {
    camps(
        pg,
        members
            .iter()
            .filter_map(|&m| pg.rec(m, seq).map(|rec| (m, rec.sig))),
    )
}

/// [`majority`] over (member index, signature) pairs, wherever they were kept.
#[allow(clippy::type_complexity)]
fn camps(
    pg: &Pg,
    sigs: impl Iterator<Item = (usize, Sig)>,
) -> Option<(Sig, BTreeMap<Sig, Vec<Rank>>, bool)> {
    camps_with_originals(pg, sigs).map(|(sig, camps, tie, _)| (sig, camps, tie))
}

/// [`camps`], also returning each camp's original (not normalized) signature.
#[allow(clippy::type_complexity)]
fn camps_with_originals(
    pg: &Pg,
    sigs: impl Iterator<Item = (usize, Sig)>,
) -> Option<(Sig, BTreeMap<Sig, Vec<Rank>>, bool, BTreeMap<Sig, Sig>)> {
    let mut camps: BTreeMap<Sig, Vec<Rank>> = BTreeMap::new();
    let mut original: BTreeMap<Sig, Sig> = BTreeMap::new();
    for (m, sig) in sigs {
        let r = pg.members[m];
        let n = normalized(sig);
        camps.entry(n).or_default().push(r);
        original.entry(n).or_insert(sig);
    }
    for v in camps.values_mut() {
        v.sort_unstable();
    }
    let best = camps
        .iter()
        .max_by(|a, b| {
            a.1.len()
                .cmp(&b.1.len())
                .then_with(|| b.1.first().cmp(&a.1.first()))
        })
        .map(|(s, v)| (*s, v.len()))?;
    let tie = camps
        .iter()
        .filter(|(s, v)| **s != best.0 && v.len() == best.1)
        .count()
        > 0;
    let sig = original.get(&best.0).copied().unwrap_or(best.0);
    Some((sig, camps, tie, original))
}

fn op_at(st: &Stuck) -> String {
    match st.sig {
        Some(s) => format!("{} #{}", s.op, st.seq),
        None => format!("#{}", st.seq),
    }
}

fn base_verdict(state: &State, st: &Stuck, class: Class, subtype: Subtype) -> Verdict {
    state.pgs[st.pg].verdict(class, subtype, st.seq, st.sig.map(|s| s.op))
}

/// Rule a: entered ranks disagree about the op at the stuck seq.
fn mismatch(state: &State, st: &Stuck) -> Vec<Verdict> {
    let pg = &state.pgs[st.pg];
    let sigs = st
        .entered_m
        .iter()
        .filter_map(|&m| pg.rec(m, st.seq).map(|rec| (m, rec.sig)));
    mismatch_verdicts(state, st.pg, st.seq, sigs)
}

/// Mismatch verdicts of stream `pgi` at `seq` from its members' signatures there: the
/// minority camps are blamed, one verdict per kind of disagreement.
fn mismatch_verdicts(
    state: &State,
    pgi: usize,
    seq: u64,
    sigs: impl Iterator<Item = (usize, Sig)>,
) -> Vec<Verdict> {
    let pg = &state.pgs[pgi];
    let Some((mut maj, camps, mut tie, originals)) = camps_with_originals(pg, sigs) else {
        return Vec::new();
    };
    if camps.len() < 2 {
        return Vec::new();
    }
    // A tie (one rank against one, two against two) is no vote: the stream's own history says
    // which camp did what the job always does at this point, and the other changed.
    let mut settled_by = None;
    if tie {
        let size = camps.values().map(Vec::len).max().unwrap_or(0);
        let tied: Vec<Sig> = camps
            .iter()
            .filter(|(_, r)| r.len() == size)
            .map(|(s, _)| *s)
            .collect();
        if let Some((normal, why)) =
            usual_camp(pg, seq, &tied).or_else(|| sibling_camp(state, pgi, seq, &tied))
        {
            maj = originals.get(&normal).copied().unwrap_or(normal);
            tie = false;
            settled_by = Some(why);
        }
    }
    let maj_n = normalized(maj);
    let maj_ranks = camps.get(&maj_n).cloned().unwrap_or_default();
    let total: usize = camps.values().map(Vec::len).sum();
    let mut by_subtype: BTreeMap<Subtype, (Vec<Rank>, Vec<String>)> = BTreeMap::new();
    for (sig, ranks) in &camps {
        if *sig == maj_n {
            continue;
        }
        let (subtype, what) = if sig.op != maj_n.op {
            (
                Subtype::TypeMismatch,
                format!("{} instead of {}", sig.op, maj.op),
            )
        } else if sig.dtype != maj_n.dtype {
            (
                Subtype::DtypeMismatch,
                format!("{} {} instead of {}", maj.op, sig.dtype, maj.dtype),
            )
        } else if sig.bytes == maj_n.bytes {
            (
                Subtype::SizeMismatch,
                format!(
                    "{} with an output of {} elements instead of {}",
                    maj.op, sig.out, maj.out
                ),
            )
        } else {
            (
                Subtype::SizeMismatch,
                if text::bytes(sig.bytes) == text::bytes(maj.bytes) {
                    // Close sizes round alike: say them in elements.
                    let size = sig.dtype.size().max(1);
                    format!(
                        "{} of {} elements instead of {}",
                        maj.op,
                        sig.bytes / size,
                        maj.bytes / size
                    )
                } else {
                    format!(
                        "{} of {} instead of {}",
                        maj.op,
                        text::bytes(sig.bytes),
                        text::bytes(maj.bytes)
                    )
                },
            )
        };
        let e = by_subtype.entry(subtype).or_default();
        e.0.extend(ranks);
        e.1.push(format!(
            "{} enqueued {what} at #{} while {} of {total} ranks enqueued {} {} {}",
            text::ranks(ranks),
            seq,
            maj_ranks.len(),
            maj.op,
            maj.dtype,
            text::bytes(maj.bytes)
        ));
    }
    by_subtype
        .into_iter()
        .map(|(subtype, (culprits, mut evidence))| {
            let mut v = pg.verdict(Class::Mismatch, subtype, seq, Some(maj.op));
            let minority = culprits.len();
            v.culprits = sorted(culprits);
            if let Some(why) = &settled_by {
                evidence.push(format!(
                    "no majority: {} and {} each form a camp of {}; {why}",
                    text::ranks(&maj_ranks),
                    text::ranks(&v.culprits),
                    maj_ranks.len()
                ));
                v.confidence = 0.6;
            } else if tie {
                evidence.push(format!(
                    "no majority: {} and {} each form a camp of {}, and this stream's earlier ops favour neither: both are candidates, the camp with the lowest rank is taken as the majority",
                    text::ranks(&maj_ranks),
                    text::ranks(&v.culprits),
                    maj_ranks.len()
                ));
                v.confidence = 0.3;
            } else {
                v.confidence = confidence(maj_ranks.len(), minority);
            }
            v.evidence = evidence;
            v
        })
        .collect()
}

/// Of camps tied in size at `seq` (normalized signatures), the one whose op is what this
/// stream usually runs at this point, with a sentence saying why; `None` when history favours
/// none. A program repeats its step, so the op after the previous one (the op members agreed
/// on at `seq - 1`) has followed that op before: a rank that skipped an op shows the op after
/// it, one with a stale size or a diverging branch shows an op never seen. Scores, in order:
/// how often the camp's op followed the previous op, then whether it was seen at all.
fn usual_camp(pg: &Pg, seq: u64, tied: &[Sig]) -> Option<(Sig, String)> {
    let lo = seq.saturating_sub(SEQ_WINDOW.min(pg.window) as u64 - 1);
    let prev_of = |s: u64| -> Option<Sig> {
        let members: Vec<usize> = (0..pg.members.len()).collect();
        let (sig, camps, tie) = majority(pg, &members, s)?;
        (!tie && camps.len() == 1).then(|| normalized(sig))
    };
    let prev = seq.checked_sub(1).and_then(prev_of);
    let mut scores: Vec<(Sig, u32, u32)> = Vec::new();
    for &camp in tied {
        let mut followed = 0;
        let mut seen = 0;
        for s in lo..seq {
            let here: Option<Sig> = (0..pg.members.len())
                .filter_map(|m| pg.rec(m, s))
                .map(|r| normalized(r.sig))
                .find(|n| *n == camp);
            if here.is_none() {
                continue;
            }
            seen += 1;
            if prev.is_some() && s.checked_sub(1).and_then(prev_of) == prev {
                followed += 1;
            }
        }
        scores.push((camp, followed, seen));
    }
    scores.sort_by_key(|&(_, f, s)| std::cmp::Reverse((f, u32::from(s > 0))));
    let (best, f, s) = *scores.first()?;
    let runner = scores
        .get(1)
        .map_or((0, 0), |&(_, f, s)| (f, u32::from(s > 0)));
    if (f, u32::from(s > 0)) == runner {
        return None;
    }
    let why = if f > runner.0 {
        format!(
            "in this stream's earlier ops {} followed the previous op {f} times and the other camp's op {} times, so the other camp changed",
            best.op, runner.0
        )
    } else {
        format!(
            "{} ran {s} times in this stream's earlier ops and the other camp's op never did, so the other camp changed",
            best.op
        )
    };
    Some((best, why))
}

/// Of camps tied in size at `seq`, the one the stream's siblings agree with: the other
/// collective streams of the same size whose members recorded, at the same seq, exactly one of
/// the tied ops. Data-parallel replicas of a 3-D job (every DP group of a TP x PP x DP layout,
/// the outer groups of DiLoCo) run the same program, so at their first gradient all_reduce,
/// where a two-member stream has no history of its own yet, the rank whose dtype or size
/// differs from what every sibling group runs is the one that changed. `None` unless one camp
/// is matched by strictly more sibling streams than any other.
fn sibling_camp(state: &State, pgi: usize, seq: u64, tied: &[Sig]) -> Option<(Sig, String)> {
    let me = &state.pgs[pgi];
    let mut votes: Vec<(Sig, u32)> = tied.iter().map(|&s| (s, 0)).collect();
    let mut siblings = 0u32;
    for (i, pg) in state.pgs.iter().enumerate() {
        if i == pgi || pg.p2p || pg.members.len() != me.members.len() {
            continue;
        }
        let mut seen: Vec<Sig> = (0..pg.members.len())
            .filter_map(|m| pg.rec(m, seq))
            .map(|r| normalized(r.sig))
            .collect();
        seen.sort();
        seen.dedup();
        // a sibling that disagrees within itself says nothing
        let [one] = seen.as_slice() else { continue };
        for (sig, n) in &mut votes {
            if sig == one {
                *n += 1;
                siblings += 1;
            }
        }
    }
    votes.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
    let (best, n) = *votes.first()?;
    let runner = votes.get(1).map_or(0, |&(_, n)| n);
    if n <= runner {
        return None;
    }
    Some((
        best,
        format!(
            "{n} of the {siblings} other groups of this size that ran one of the tied ops at #{seq} ran {} {}, so the other camp changed",
            best.op, best.dtype
        ),
    ))
}

/// Confidence of a majority vote of `maj` against `min`.
fn confidence(maj: usize, min: usize) -> f64 {
    let n = (maj + min).max(1) as f64;
    (0.55 + 0.4 * (maj as f64 - min as f64) / n).clamp(0.3, 0.95)
}

/// Rule c: some expected participants did not enter the stuck op. Returns the verdict (victims
/// removed from its culprits), the victims (ranks that are behind only because they wait in
/// another stuck stream) and the culprits that skipped the op (see [`passed_point`]).
fn participants(
    state: &State,
    families: &Families,
    st: &Stuck,
    waits_in: &BTreeMap<Rank, Vec<usize>>,
) -> (Verdict, Vec<Rank>, Vec<Rank>) {
    let pg = &state.pgs[st.pg];
    let n = st.entered.len() + st.behind.len();
    let op = op_at(st);
    if st.entered.len() >= st.behind.len() {
        let mut v = base_verdict(state, st, Class::Hang, Subtype::MissingParticipant);
        let mut victims = Vec::new();
        let mut skipped_ranks = Vec::new();
        for &(r, last) in &st.behind {
            let elsewhere: Vec<usize> = waits_in
                .get(&r)
                .map(|p| p.iter().copied().filter(|&p| p != st.pg).collect())
                .unwrap_or_default();
            let passed = passed_point(state, families, st, r);
            if let (Some(&other), None) = (elsewhere.first(), &passed) {
                victims.push(r);
                v.evidence.push(format!(
                    "rank {r} is behind only because it waits in {}",
                    text::pg(&state.pgs[other])
                ));
                continue;
            }
            v.culprits.push(r);
            if let Some(why) = passed {
                v.evidence.push(why);
                skipped_ranks.push(r);
                continue;
            }
            v.evidence.push(match last {
                Some(l) => format!(
                    "rank {r} is behind: last enqueued #{l} while {} of {n} ranks are in {op}",
                    st.entered.len()
                ),
                None => format!(
                    "rank {r} is behind: never enqueued in {} while {} of {n} ranks are in {op}",
                    text::pg(pg),
                    st.entered.len()
                ),
            });
        }
        v.culprits.sort_unstable();
        if st.entered.len() == st.behind.len() && skipped_ranks.len() == st.behind.len() {
            // One against one, settled by the sibling groups: lower than a majority vote.
            v.evidence.push(format!(
                "no majority in {}: {} entered {op}, {} did not; the sibling groups' ranks say which one left the program",
                text::pg(pg),
                text::ranks(&st.entered),
                text::ranks(&sorted(st.behind.iter().map(|b| b.0).collect()))
            ));
            v.confidence = 0.6;
        } else if st.entered.len() == st.behind.len() {
            v.evidence.push(format!(
                "no majority: {} entered {op}, {} did not",
                text::ranks(&st.entered),
                text::ranks(&sorted(st.behind.iter().map(|b| b.0).collect()))
            ));
            v.confidence = 0.35;
        } else {
            v.confidence = confidence(st.entered.len(), st.behind.len());
        }
        if !victims.is_empty() && !v.culprits.is_empty() {
            // The stream is blocked anyway by ranks waiting elsewhere; a rank behind without
            // such a reason may be one whose enqueue report was lost.
            v.evidence.push(format!(
                "{} would block {} anyway; {} may only have lost {} report",
                text::ranks(&victims),
                text::pg(pg),
                text::ranks(&v.culprits),
                if v.culprits.len() == 1 {
                    "its"
                } else {
                    "their"
                }
            ));
            v.confidence = v.confidence.min(0.4);
        }
        v.evidence.push(format!(
            "no progress in {} for {}",
            text::pg(pg),
            text::dur(st.idle_ns as f64)
        ));
        (v, victims, skipped_ranks)
    } else {
        let mut v = base_verdict(state, st, Class::Hang, Subtype::ExtraParticipant);
        // The majority's position: the most common last enqueued seq among those behind.
        let mut counts: BTreeMap<Option<u64>, usize> = BTreeMap::new();
        for &(_, l) in &st.behind {
            *counts.entry(l).or_default() += 1;
        }
        let (pos, count) = counts
            .iter()
            .max_by_key(|(l, c)| (**c, std::cmp::Reverse(**l)))
            .map(|(l, c)| (*l, *c))
            .unwrap_or((None, 0));
        let pos = pos.map_or_else(|| "nothing".to_string(), |p| format!("#{p}"));
        v.culprits = st.entered.clone();
        for &r in &st.entered {
            v.evidence.push(format!(
                "rank {r} is ahead: enqueued {op} while {count} of {n} ranks last enqueued {pos}"
            ));
        }
        v.confidence = confidence(st.behind.len(), st.entered.len());
        (v, Vec::new(), Vec::new())
    }
}

/// Whether member `r`, behind in the stuck stream `st`, went past its op rather than never
/// reaching it. Groups of one kind run one program (see [`Pg::family`]): the members that
/// entered the op, here and at the same seq of the stream's sibling groups, had each enqueued
/// at most seq P of their groups of some other kind by then (a tensor-parallel group, a DiLoCo
/// replica group), and `r` has enqueued beyond P in its own group of that kind. So it skipped
/// the op (a branch its peers did not take, an async outer all-reduce it never launched) and
/// went on; it is not a victim waiting elsewhere, even when it now waits in another group for
/// a peer that waits here (a cycle). The reference must be two or more ranks and outnumber the
/// stream's members that are behind: one rank against one may be the one that diverged, and
/// the sibling groups are what breaks such a tie. Returns the sentence saying so.
fn passed_point(state: &State, families: &Families, st: &Stuck, r: Rank) -> Option<String> {
    let pg = &state.pgs[st.pg];
    if pg.p2p {
        return None;
    }
    // (stream, member) of every rank that entered the op here or at a sibling.
    // Where the program is: a few ranks say it as well as thousands, so only the first are
    // kept, and they are counted until they outnumber the ranks behind.
    let mut counted = st.entered_m.len();
    let mut reference: Vec<(usize, usize)> = st
        .entered_m
        .iter()
        .take(MAX_REFERENCE)
        .map(|&m| (st.pg, m))
        .collect();
    let siblings = families.get(&pg.family()).into_iter().flatten();
    'siblings: for &i in siblings.filter(|&&i| i != st.pg).take(MAX_SIBLINGS) {
        let other = &state.pgs[i];
        for m in 0..other.members.len() {
            // Enough to outnumber those behind and to read the position from: stop looking.
            if counted > st.behind.len() && reference.len() >= MAX_REFERENCE {
                break 'siblings;
            }
            if other.rec(m, st.seq).is_some_and(|x| x.has_enq()) {
                counted += 1;
                if reference.len() < MAX_REFERENCE {
                    reference.push((i, m));
                }
            }
        }
    }
    if counted < 2 || counted <= st.behind.len() {
        return None;
    }
    let rs = state.ranks.get(r)?;
    for &(p, pm) in &rs.pgs {
        let mine_pg = &state.pgs[p as usize];
        if p as usize == st.pg || mine_pg.p2p {
            continue;
        }
        let Some(mine) = mine_pg.state[pm as usize].last_enq else {
            continue;
        };
        let kind = mine_pg.family();
        let mut most: Option<u64> = None;
        let known = reference.iter().all(|&(sp, m)| {
            let spg = &state.pgs[sp];
            let Some(t) = spg.rec(m, st.seq).filter(|x| x.has_enq()).map(|x| x.enq) else {
                return false;
            };
            let Some(ers) = state.ranks.get(spg.members[m]) else {
                return false;
            };
            let sibling = ers
                .pgs
                .iter()
                .find(|&&(q, _)| q as usize != sp && state.pgs[q as usize].family() == kind);
            let Some(&(q, qm)) = sibling else {
                return false;
            };
            let qpg = &state.pgs[q as usize];
            let Some(last) = qpg.state[qm as usize].last_enq else {
                return false;
            };
            let lo = last.saturating_sub(qpg.window as u64 - 1);
            let pos = (lo..=last).rev().find(|&s| {
                qpg.rec(qm as usize, s)
                    .is_some_and(|x| x.has_enq() && x.enq <= t)
            });
            match pos {
                Some(pos) => {
                    most = most.max(Some(pos));
                    true
                }
                None => false,
            }
        });
        let Some(most) = most.filter(|_| known) else {
            continue;
        };
        if mine > most {
            return Some(format!(
                "rank {r} skipped {}: {} ranks that entered it (here and in the other {} groups) had enqueued at most #{most} of their {} groups by then, and rank {r} has enqueued #{mine} of its own ({}) without entering it",
                op_at(st),
                reference.len(),
                pg.family().0,
                kind.0,
                text::pg(mine_pg)
            ));
        }
    }
    None
}

/// A member's role in a stream: its place in the group's sorted rank set (a pipeline stage),
/// which is the same place in every sibling group of a data-parallel job.
fn role(pg: &Pg, rank: Rank) -> Option<usize> {
    match &pg.scope {
        Some(set) => set.binary_search(&rank).ok(),
        None => {
            let mut members = pg.members.clone();
            members.sort_unstable();
            members.binary_search(&rank).ok()
        }
    }
}

/// The rank at `role` in `pg`.
fn at_role(pg: &Pg, role: usize) -> Option<Rank> {
    match &pg.scope {
        Some(set) => set.get(role).copied(),
        None => {
            let mut members = pg.members.clone();
            members.sort_unstable();
            members.get(role).copied()
        }
    }
}

/// A point-to-point stream stuck with both ends of a boundary waiting (so nobody is "behind"),
/// where one member's ops, over the last [`DIVERGE_DEPTH`] up to its pending one, stop being
/// what the same stage posts at those seqs in (up to eight of) the sibling pipelines (the other groups of its kind, see [`Pg::family`]): a
/// send where they all posted a receive, or towards another stage. Each end numbers its own
/// ops and the pipelines of one job run one schedule, so that member left it (dropped a
/// receive from a batch, posted an extra op) and its peer now waits for an op that never
/// comes. A batch is known by its first op. Named when two or more sibling pipelines agree at
/// that seq and none did what it did, for at most half of the stream; `None` otherwise.
fn diverged(state: &State, families: &Families, st: &Stuck) -> Option<Verdict> {
    let pg = &state.pgs[st.pg];
    if !pg.p2p {
        return None;
    }
    let kind = pg.family();
    let sibs: Vec<&Pg> = families
        .get(&kind)
        .into_iter()
        .flatten()
        .filter(|&&i| i != st.pg)
        .take(MAX_SIBLINGS / 2)
        .map(|&i| &state.pgs[i])
        .collect();
    if sibs.len() < 2 {
        return None;
    }
    // (send?, peer's role) of a record.
    let shape = |p: &Pg, rec: &super::state::Rec| -> Option<(bool, usize)> {
        Some((rec.sig.op == Op::Send, role(p, rec.peer?)?))
    };
    let name = |(send, r): (bool, usize)| {
        let peer = at_role(pg, r).map_or_else(|| format!("stage {r}"), |p| format!("rank {p}"));
        if send {
            format!("a send to {peer}")
        } else {
            format!("a receive from {peer}")
        }
    };
    let mut found: Vec<(Rank, String)> = Vec::new();
    for m in 0..pg.members.len() {
        let rank = pg.members[m];
        let (Some(f), Some(my_role)) = (frontier(state, pg, m), role(pg, rank)) else {
            continue;
        };
        // The first op, among the last few up to the pending one, that the same stage
        // elsewhere did otherwise (a dropped receive shows within a step or two).
        let lo = f.saturating_sub(DIVERGE_DEPTH.min(pg.window as u64 - 1));
        for seq in lo..=f {
            let Some(rec) = pg.rec(m, seq).filter(|r| r.has_enq()) else {
                continue;
            };
            let Some(mine) = shape(pg, rec) else {
                continue;
            };
            let mut votes: BTreeMap<(bool, usize), usize> = BTreeMap::new();
            for sp in &sibs {
                let Some(other) = at_role(sp, my_role).and_then(|r| sp.member_of(r)) else {
                    continue;
                };
                if let Some(x) = sp.rec(other, seq).filter(|r| r.has_enq()) {
                    if let Some(sh) = shape(sp, x) {
                        *votes.entry(sh).or_default() += 1;
                    }
                }
            }
            let Some((&usual, &n)) = votes.iter().max_by_key(|(_, n)| **n) else {
                continue;
            };
            if usual == mine || n < 2 || votes.contains_key(&mine) {
                continue;
            }
            found.push((
                rank,
                format!(
                    "rank {rank}'s point-to-point op #{seq} ({}) is {} where the same stage of {n} other pipelines posted {}: it left the schedule (dropped or added an op), and its peer waits for an op that never comes",
                    if seq == f { "pending" } else { "the first that differs before its pending one" },
                    name(mine),
                    name(usual)
                ),
            ));
            break;
        }
    }
    // No more than half of the stream's members (one end of a pair), else the schedule
    // itself differs.
    if found.is_empty() || found.len() * 2 > pg.members.len() {
        return None;
    }
    let mut v = base_verdict(state, st, Class::Hang, Subtype::MissingParticipant);
    v.culprits = sorted(found.iter().map(|f| f.0).collect());
    v.evidence = found.into_iter().map(|f| f.1).collect();
    v.evidence.push(format!(
        "{} is stuck: every member has an op pending and none completes",
        text::pg(pg)
    ));
    v.confidence = 0.6;
    Some(v)
}

/// A pair of ranks as a link, named with their hosts.
pub(crate) fn pair_link(state: &State, from: Rank, to: Rank) -> Link {
    Link {
        kind: LinkKind::Pair,
        name: format!(
            "{} -> {}",
            text::rank_at(state, from),
            text::rank_at(state, to)
        ),
        from: Some(from),
        to: Some(to),
    }
}

/// Rule d: every expected member entered; look at who finished and at per-peer bytes.
fn dataplane(state: &State, st: &Stuck) -> Verdict {
    let pg = &state.pgs[st.pg];
    let op = op_at(st);
    let n = st.entered.len();
    let mut v = base_verdict(state, st, Class::Hang, Subtype::DataplaneStall);

    // Some members finished the op and a minority did not: their kernel is stuck.
    let finished = n.saturating_sub(st.waiting.len());
    if finished > 0 && st.waiting.len() < finished {
        v.culprits = st.waiting.clone();
        v.evidence.push(format!(
            "{} did not finish {op} while {finished} of {n} ranks did",
            text::ranks(&st.waiting)
        ));
        v.confidence = confidence(finished, st.waiting.len());
        return v;
    }

    if let Some(hung) = gpu_waiters(state, st, &mut v) {
        v.culprits = hung;
        return v;
    }

    // Per-peer bytes of the stuck op, per (from, to) pair.
    let mut pairs: Vec<((Rank, Rank), Option<u64>)> = pg
        .pairs
        .iter()
        .map(|(&k, p)| (k, p.bytes_at(st.seq)))
        .collect();
    pairs.sort_unstable_by_key(|p| p.0);
    let moved = |b: Option<u64>| b.is_none_or(|b| b > 0);
    let any_moved = pairs.iter().any(|p| moved(p.1));
    let mut out: BTreeMap<Rank, (usize, usize)> = BTreeMap::new(); // rank -> (pairs, moved)
    for &((from, _), b) in &pairs {
        let e = out.entry(from).or_default();
        e.0 += 1;
        e.1 += usize::from(moved(b));
    }
    let silent: Vec<Rank> = out
        .iter()
        .filter(|(_, (_, m))| *m == 0)
        .map(|(&r, _)| r)
        .collect();
    if any_moved && !silent.is_empty() && silent.len() * 2 < out.len() {
        let sent: u64 = pairs.iter().filter_map(|p| p.1).sum();
        v.culprits = silent.clone();
        v.evidence.push(format!(
            "{} sent 0 bytes to all peers in {op} while {} other ranks sent {} in total",
            text::ranks(&silent),
            out.len() - silent.len(),
            text::bytes(sent)
        ));
        v.evidence.push(format!(
            "all {n} ranks entered {op}; no progress for {}",
            text::dur(st.idle_ns as f64)
        ));
        v.confidence = confidence(out.len() - silent.len(), silent.len());
        return v;
    }
    let zero: Vec<(Rank, Rank)> = pairs.iter().filter(|p| !moved(p.1)).map(|p| p.0).collect();
    if any_moved && !zero.is_empty() && zero.len() * 2 < pairs.len() {
        for &(from, to) in &zero {
            let link = pair_link(state, from, to);
            v.evidence.push(format!(
                "{} moved 0 bytes in {op} while {} other pairs moved data",
                link.name,
                pairs.len() - zero.len()
            ));
            v.links.push(link);
        }
        v.confidence = if zero.len() == 1 { 0.8 } else { 0.6 };
        return v;
    }
    v.subtype = Subtype::Undecided;
    v.evidence.push(format!(
        "all {n} ranks entered {op} and none finished; no progress for {}",
        text::dur(st.idle_ns as f64)
    ));
    v.evidence.push(if pairs.is_empty() {
        "no per-peer progress was reported to name a rank or link by".to_string()
    } else {
        format!(
            "per-peer progress does not single out a rank or link ({} of {} pairs moved data)",
            pairs.iter().filter(|p| moved(p.1)).count(),
            pairs.len()
        )
    });
    v.confidence = 0.3;
    rank_candidates(&mut v, candidates(state, st), n);
    v
}

/// One suspect of an undecided hang: how strongly the records point at it, and why.
#[derive(Debug)]
struct Candidate {
    rank: Rank,
    score: u32,
    why: Vec<String>,
}

/// Suspects of a stream stuck with every member inside the op and nothing to tell them apart
/// by the rules above, ranked from what each member's own records say:
/// - its op at the stuck seq was enqueued but never started while others' started (FR's
///   `scheduled` against `started`): its GPU stream never reached the collective, so
///   something earlier on that stream, its own compute or another group's kernel, holds it;
/// - it is stuck in another stream at an op it enqueued earlier (its own clock): it cannot
///   serve this one either, and that stream is where to look;
/// - the stream's op at the stuck seq differs from what its own earlier ops of the same kind
///   were (a changed size shows against the rank's history even when nobody else's record
///   of the seq differs);
/// - its point-to-point peer has nothing pending towards it.
///
/// Returned best first; ranks with no evidence are left out.
fn candidates(state: &State, st: &Stuck) -> Vec<Candidate> {
    let pg = &state.pgs[st.pg];
    let op = op_at(st);
    let mut out: Vec<Candidate> = Vec::new();
    let started: Vec<usize> = st
        .entered_m
        .iter()
        .copied()
        .filter(|&m| {
            pg.rec(m, st.seq)
                .is_some_and(|r| r.has_start() || r.has_end())
        })
        .collect();
    for &m in &st.entered_m {
        let rank = pg.members[m];
        let mut c = Candidate {
            rank,
            score: 0,
            why: Vec::new(),
        };
        let rec = pg.rec(m, st.seq);
        if let Some(r) = rec {
            if !r.has_start() && !r.has_end() && !started.is_empty() && !started.contains(&m) {
                c.score += 4;
                c.why.push(format!(
                    "its {op} was enqueued but never started on its GPU while {} of {} ranks started it: something earlier on its stream holds it",
                    started.len(),
                    st.entered.len()
                ));
            }
        }
        // Stuck elsewhere at an op it enqueued before this one.
        if let (Some(r), Some(rs)) = (rec, state.ranks.get(rank)) {
            if r.has_enq() {
                for &(p, pm) in &rs.pgs {
                    let other = &state.pgs[p as usize];
                    if p as usize == st.pg || !other.state[pm as usize].in_flight {
                        continue;
                    }
                    let Some(f) = frontier(state, other, pm as usize) else {
                        continue;
                    };
                    let earlier = other
                        .rec(pm as usize, f)
                        .is_some_and(|o| o.has_enq() && o.enq < r.enq);
                    if earlier {
                        c.score += 2;
                        c.why.push(format!(
                            "before entering it, it entered #{f} of {} and never finished that",
                            text::pg(other)
                        ));
                        break;
                    }
                }
            }
        }
        // Its own history: the same op kind with another size or dtype before.
        if let Some(r) = rec {
            let now = normalized(r.sig);
            let lo = st.seq.saturating_sub(SEQ_WINDOW.min(pg.window) as u64 - 1);
            let mut same_op = 0;
            let mut same_sig = 0;
            for s in lo..st.seq {
                if let Some(old) = pg.rec(m, s).map(|o| normalized(o.sig)) {
                    if old.op == now.op {
                        same_op += 1;
                        same_sig += u32::from(old == now);
                    }
                }
            }
            let others_usual = st.entered_m.iter().filter(|&&o| o != m).any(|&o| {
                pg.rec(o, st.seq).is_some_and(|x| {
                    let x = normalized(x.sig);
                    (lo..st.seq).any(|s| pg.rec(o, s).is_some_and(|y| normalized(y.sig) == x))
                })
            });
            if same_op >= 2 && same_sig == 0 && others_usual {
                c.score += 3;
                c.why.push(format!(
                    "its {} at #{} differs from its own {same_op} earlier {} ops in this stream, while the others' matches their history",
                    now.op, st.seq, now.op
                ));
            }
        }
        // Point-to-point: its pending op's peer has nothing pending towards it.
        if pg.p2p {
            if let Some(r) = frontier(state, pg, m).and_then(|f| pg.rec(m, f)) {
                if let Some(peer) = r.peer {
                    let towards = pg.member_of(peer).and_then(|pm| {
                        let f = frontier(state, pg, pm)?;
                        pg.rec(pm, f)
                    });
                    let matched = towards.is_some_and(|t| {
                        t.peer == Some(rank) && (t.sig.op == Op::Send) != (r.sig.op == Op::Send)
                    });
                    if !matched {
                        c.score += 1;
                        c.why.push(format!(
                            "its pending {} with rank {peer} has no matching {} pending on rank {peer}",
                            r.sig.op,
                            if r.sig.op == Op::Send { "recv" } else { "send" }
                        ));
                    }
                }
            }
        }
        if c.score > 0 {
            out.push(c);
        }
    }
    out.sort_by(|a, b| b.score.cmp(&a.score).then(a.rank.cmp(&b.rank)));
    out
}

/// Writes ranked candidates into an undecided verdict: every candidate with its evidence in
/// `evidence` (best first, "candidate 1 of 3: rank 5: ..."), and the best-scored ranks as its
/// culprits when they are fewer than half of the `n` ranks considered, so that an operator and
/// a script both get a first place to look. Confidence stays below [`WEAK`]: a candidate is a
/// lead, not a finding.
fn rank_candidates(v: &mut Verdict, ranked: Vec<Candidate>, n: usize) {
    const SHOWN: usize = 8;
    if ranked.is_empty() {
        v.evidence
            .push("no rank's records stand out from the others': no candidate to rank".into());
        return;
    }
    let total = ranked.len();
    let top = ranked[0].score;
    let best: Vec<Rank> = ranked
        .iter()
        .filter(|c| c.score == top)
        .map(|c| c.rank)
        .collect();
    for (i, c) in ranked.iter().take(SHOWN).enumerate() {
        v.evidence.push(format!(
            "candidate {} of {total}: rank {}: {}",
            i + 1,
            c.rank,
            c.why.join("; ")
        ));
    }
    if total > SHOWN {
        v.evidence
            .push(format!("{} more candidates are not listed", total - SHOWN));
    }
    if best.len() * 2 < n.max(2) {
        v.culprits = sorted(best);
        v.confidence = if total == v.culprits.len() { 0.4 } else { 0.35 };
    }
}

/// Ranks whose kernel hung, told apart by what each side of a pair reports: a hung rank sent
/// nothing and was never blocked on a peer (it waits on its own GPU), while a peer waited on
/// it and received nothing from it. Its victims are all blocked on a peer. This works in a
/// group of two, where "the minority that sent nothing" is not a minority. Adds the evidence
/// and confidence to `v` when it names someone.
fn gpu_waiters(state: &State, st: &Stuck, v: &mut Verdict) -> Option<Vec<Rank>> {
    #[derive(Default)]
    struct Own {
        reported: bool,
        sent: u64,
        blocked: u64,
        /// Longest time a peer reported waiting for data from this rank, with nothing received.
        awaited: u64,
    }
    let pg = &state.pgs[st.pg];
    let mut own: BTreeMap<Rank, Own> = BTreeMap::new();
    for (&(from, to), p) in &pg.pairs {
        if p.cur_seq != st.seq {
            continue;
        }
        let sender = own.entry(from).or_default();
        sender.sent = sender.sent.max(p.send.bytes).max(p.recv.bytes);
        if p.send.seen {
            sender.reported = true;
            sender.blocked = sender.blocked.max(p.send.busy);
        }
        if p.recv.seen && p.recv.bytes == 0 {
            sender.awaited = sender.awaited.max(p.recv.busy);
        }
        if p.recv.seen {
            let receiver = own.entry(to).or_default();
            receiver.reported = true;
            receiver.blocked = receiver.blocked.max(p.recv.busy);
        }
    }
    let hung: Vec<Rank> = own
        .iter()
        .filter(|(_, o)| o.reported && o.sent == 0 && o.blocked == 0 && o.awaited > 0)
        .map(|(&r, _)| r)
        .collect();
    let victims = own
        .iter()
        .filter(|(r, o)| !hung.contains(r) && o.reported && o.blocked > 0)
        .count();
    if hung.is_empty() || victims == 0 || hung.len() > victims {
        return None;
    }
    let op = op_at(st);
    for &r in &hung {
        let waited = own.get(&r).map_or(0, |o| o.awaited);
        v.evidence.push(format!(
            "rank {r} sent 0 bytes in {op} and was never blocked on a peer: it waits on its own GPU, while a peer waited {} for data from it",
            text::dur(waited as f64)
        ));
    }
    v.evidence.push(format!(
        "{victims} other ranks are blocked on a peer; all {} ranks entered {op}; no progress for {}",
        st.entered.len(),
        text::dur(st.idle_ns as f64)
    ));
    v.confidence = confidence(victims, hung.len()).max(0.7);
    Some(hung)
}

fn sorted(mut v: Vec<Rank>) -> Vec<Rank> {
    v.sort_unstable();
    v.dedup();
    v
}
