//! A recorded history of concurrent operations on a string key-value store.
//!
//! Clients call [`Recorder::invoke`] just before they send a request and
//! [`OpHandle::complete`] just after the answer arrives, so every entry's interval
//! `[invoke_ns, complete_ns]` contains the instant the store really applied it. That containment
//! is all the linearizability checker relies on; the process id is only for people reading the
//! history.
//!
//! Outcomes are three-valued because a distributed client cannot always know what happened:
//! [`Outcome::Ok`] (it happened, with this result), [`Outcome::Fail`] (it definitely did not
//! change anything) and [`Outcome::Unknown`] (a timeout or lost connection: it may take effect at
//! any time after the invoke, or never). Treating an unknown write as failed would turn correct
//! clusters into false alarms; treating it as done would hide lost writes.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// Identifies a client process; one process issues one operation at a time.
pub type ProcessId = u64;

/// An operation on one key of the store.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "f", rename_all = "snake_case")]
pub enum Op {
    /// Reads the key's value; the result is the value or none when the key is absent.
    Read { key: String },
    /// Sets the key to `value` unconditionally.
    Write { key: String, value: String },
    /// Sets the key to `new` only if its current value is `expect` (`None`: the key is absent).
    Cas {
        key: String,
        expect: Option<String>,
        new: String,
    },
    /// Removes the key.
    Delete { key: String },
}

impl Op {
    /// The key this operation touches; operations on distinct keys are independent.
    pub fn key(&self) -> &str {
        match self {
            Op::Read { key } | Op::Write { key, .. } | Op::Cas { key, .. } | Op::Delete { key } => {
                key
            }
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Read { key } => write!(f, "read {key}"),
            Op::Write { key, value } => write!(f, "write {key} {value:?}"),
            Op::Cas { key, expect, new } => {
                write!(f, "cas {key} {} -> {new:?}", ShowValue(expect.as_deref()))
            }
            Op::Delete { key } => write!(f, "delete {key}"),
        }
    }
}

/// What a successful operation returned.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpResult {
    /// A read's answer: the value, or `None` when the key was absent.
    Read(Option<String>),
    /// A write, a delete or a compare-and-swap that swapped.
    Applied,
}

/// Why an operation definitely did not change the store.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailReason {
    /// A compare-and-swap found a value other than `expect`. It still observed the register, so
    /// the checker keeps it as a read that saw "not `expect`".
    CasMismatch,
    /// An error the store guarantees means "not applied" (e.g. rejected before proposing).
    NotApplied(String),
}

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It took effect exactly once, between invoke and completion, with this result.
    Ok(OpResult),
    /// It definitely did not change the store.
    Fail(FailReason),
    /// It may have taken effect at any time after its invoke, or never (timeout, lost
    /// connection, or the client stopped waiting); the string says why it is unknown.
    Unknown(String),
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Ok(OpResult::Read(value)) => write!(f, "{}", ShowValue(value.as_deref())),
            Outcome::Ok(OpResult::Applied) => f.write_str("ok"),
            Outcome::Fail(FailReason::CasMismatch) => f.write_str("cas failed"),
            Outcome::Fail(FailReason::NotApplied(why)) => write!(f, "failed ({why})"),
            Outcome::Unknown(why) => write!(f, "unknown ({why})"),
        }
    }
}

/// Formats an optional value the way histories print it: quoted, or `<absent>`.
struct ShowValue<'a>(Option<&'a str>);

impl fmt::Display for ShowValue<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(v) => write!(f, "{v:?}"),
            None => f.write_str("<absent>"),
        }
    }
}

/// One operation of a history, from invoke to completion.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Position in invoke order; stable, so a counterexample can point back at the full history.
    pub id: usize,
    pub process: ProcessId,
    pub op: Op,
    /// Nanoseconds since the run started, taken before the request was sent.
    pub invoke_ns: u64,
    /// Nanoseconds since the run started, taken after the answer arrived; `None` if the client
    /// never got one. The checker ignores it for unknown outcomes: those have no upper bound.
    pub complete_ns: Option<u64>,
    pub outcome: Outcome,
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let end = match self.complete_ns {
            Some(ns) if !matches!(self.outcome, Outcome::Unknown(_)) => format!("{:>12}", Ms(ns)),
            _ => format!("{:>12}", "∞"),
        };
        write!(
            f,
            "#{:<5} p{:<4} [{:>12} .. {end}]  {:<40} -> {}",
            self.id,
            self.process,
            Ms(self.invoke_ns),
            self.op.to_string(),
            self.outcome
        )
    }
}

/// Nanoseconds shown as milliseconds with microsecond precision.
struct Ms(u64);

impl fmt::Display for Ms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = format!("{}.{:03}ms", self.0 / 1_000_000, (self.0 / 1_000) % 1_000);
        f.pad(&s)
    }
}

/// A complete history: every operation that was invoked, with its outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    pub entries: Vec<Entry>,
}

impl History {
    /// A history from hand-made entries (tests, or one read back from JSON).
    pub fn from_entries(entries: Vec<Entry>) -> Self {
        Self { entries }
    }

    /// One JSON object per line, in invoke order, for logs and for replaying into the checker.
    pub fn to_json_lines(&self) -> String {
        let mut out = String::new();
        for entry in &self.entries {
            // Entries are plain strings and integers, so serialization cannot fail.
            out.push_str(&serde_json::to_string(entry).unwrap_or_default());
            out.push('\n');
        }
        out
    }

    /// The invoke and completion events in time order, Jepsen-style, for printing a timeline.
    pub fn events(&self) -> Vec<Event> {
        let mut events = Vec::with_capacity(self.entries.len() * 2);
        for e in &self.entries {
            events.push(Event {
                time_ns: e.invoke_ns,
                id: e.id,
                process: e.process,
                kind: EventKind::Invoke { op: e.op.clone() },
            });
            if let Some(t) = e.complete_ns {
                events.push(Event {
                    time_ns: t,
                    id: e.id,
                    process: e.process,
                    kind: EventKind::Complete {
                        outcome: e.outcome.clone(),
                    },
                });
            }
        }
        events.sort_by_key(|ev| {
            (
                ev.time_ns,
                ev.id,
                matches!(ev.kind, EventKind::Complete { .. }),
            )
        });
        events
    }
}

impl fmt::Display for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in &self.entries {
            writeln!(f, "{e}")?;
        }
        Ok(())
    }
}

/// One point on a history's timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub time_ns: u64,
    /// The [`Entry::id`] this event belongs to.
    pub id: usize,
    pub process: ProcessId,
    #[serde(flatten)]
    pub kind: EventKind,
}

/// Whether an [`Event`] starts or ends an operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    Invoke { op: Op },
    Complete { outcome: Outcome },
}

/// An entry while it is being recorded; `outcome` is `None` until the client completes it.
#[derive(Debug)]
struct Slot {
    process: ProcessId,
    op: Op,
    invoke_ns: u64,
    complete_ns: Option<u64>,
    outcome: Option<Outcome>,
}

#[derive(Debug)]
struct Inner {
    start: Instant,
    slots: Mutex<Vec<Slot>>,
}

/// Records a history from many client tasks at once.
///
/// Cloning shares the same history (an `Arc`), so each task gets its own handle. Times are taken
/// from one monotonic clock started by [`Recorder::new`], which is what makes intervals from
/// different tasks comparable.
#[derive(Debug, Clone)]
pub struct Recorder {
    inner: Arc<Inner>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    /// Starts an empty history whose clock starts now.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                start: Instant::now(),
                slots: Mutex::new(Vec::new()),
            }),
        }
    }

    /// When this recorder's clock started: what `invoke_ns` counts from.
    pub fn origin(&self) -> Instant {
        self.inner.start
    }

    /// Nanoseconds since this recorder was created.
    pub fn elapsed_ns(&self) -> u64 {
        u64::try_from(self.inner.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Records that `process` is about to send `op`. Call it before the request leaves, so the
    /// recorded interval cannot start after the store applied the op.
    pub fn invoke(&self, process: ProcessId, op: Op) -> OpHandle {
        let mut slots = self.lock();
        // Read the clock under the lock so ids (invoke order) and invoke times agree.
        let invoke_ns = self.elapsed_ns();
        slots.push(Slot {
            process,
            op,
            invoke_ns,
            complete_ns: None,
            outcome: None,
        });
        OpHandle {
            recorder: self.clone(),
            id: slots.len() - 1,
        }
    }

    /// A snapshot of everything recorded so far. Operations that have not completed yet (or
    /// whose handle was dropped) appear as [`Outcome::Unknown`], since they may still land.
    pub fn history(&self) -> History {
        let slots = self.lock();
        let entries = slots
            .iter()
            .enumerate()
            .map(|(id, s)| Entry {
                id,
                process: s.process,
                op: s.op.clone(),
                invoke_ns: s.invoke_ns,
                complete_ns: s.complete_ns,
                outcome: s
                    .outcome
                    .clone()
                    .unwrap_or_else(|| Outcome::Unknown("never completed".into())),
            })
            .collect();
        History { entries }
    }

    /// Number of operations invoked so far.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing has been invoked yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Slot>> {
        // A panicking client task must not hide the rest of the history: ignore poisoning.
        self.inner.slots.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// An invoked operation waiting for its outcome. Dropping it without calling
/// [`OpHandle::complete`] leaves the operation unknown, which is the honest answer for a task
/// that was cancelled mid-request.
#[must_use = "an operation that is never completed is recorded as unknown"]
#[derive(Debug)]
pub struct OpHandle {
    recorder: Recorder,
    id: usize,
}

impl OpHandle {
    /// The [`Entry::id`] this operation will have in the history.
    pub fn id(&self) -> usize {
        self.id
    }

    /// Records how the operation ended. Call it after the answer arrived (or the client gave up).
    pub fn complete(self, outcome: Outcome) {
        let mut slots = self.recorder.lock();
        let now = self.recorder.elapsed_ns();
        if let Some(slot) = slots.get_mut(self.id) {
            slot.complete_ns = Some(now);
            slot.outcome = Some(outcome);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorder_orders_and_completes() {
        let rec = Recorder::new();
        let a = rec.invoke(
            1,
            Op::Write {
                key: "k".into(),
                value: "v".into(),
            },
        );
        let b = rec.clone().invoke(2, Op::Read { key: "k".into() });
        a.complete(Outcome::Ok(OpResult::Applied));
        drop(b);
        let h = rec.history();
        assert_eq!(h.entries.len(), 2);
        assert_eq!(h.entries[0].outcome, Outcome::Ok(OpResult::Applied));
        assert!(h.entries[0].complete_ns.unwrap() >= h.entries[0].invoke_ns);
        assert!(h.entries[1].invoke_ns >= h.entries[0].invoke_ns);
        assert!(matches!(h.entries[1].outcome, Outcome::Unknown(_)));
        assert_eq!(h.entries[1].complete_ns, None);
        assert_eq!(h.events().len(), 3);
    }

    #[test]
    fn entries_round_trip_through_json() {
        let e = Entry {
            id: 3,
            process: 7,
            op: Op::Cas {
                key: "k".into(),
                expect: None,
                new: "x".into(),
            },
            invoke_ns: 10,
            complete_ns: Some(20),
            outcome: Outcome::Fail(FailReason::CasMismatch),
        };
        let h = History::from_entries(vec![e.clone()]);
        let line = h.to_json_lines();
        let back: Entry = serde_json::from_str(line.trim()).unwrap();
        assert_eq!(back, e);
        assert!(line.contains(r#""f":"cas""#), "{line}");
        assert!(e.to_string().contains("cas k <absent> -> \"x\""), "{e}");
    }
}
