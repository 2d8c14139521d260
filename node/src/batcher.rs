//! Coalesces concurrent client writes into one Raft entry.
//!
//! openraft 0.9 appends, replicates and flushes once per proposal, so a leader that proposed
//! every client write on its own spent a log flush per write. The batcher keeps up to
//! `max_in_flight` proposals going; writes that arrive while all are busy wait in the queue and
//! go out together as one [`Command::Batch`]. With little load a write is proposed at once, so
//! batching adds no latency; under load it turns many flushes into one. Every write in a batch
//! takes effect at the batch's apply point, which lies within each write's own request, so
//! linearizability is unchanged.
//!
//! A batch is bounded by its encoded bytes as well as by its count of writes: an entry larger
//! than the transport's frame can never reach a follower (see `crate::limits`), so the batcher
//! closes a batch before it outgrows `max_entry_bytes`, and refuses at once a single write that
//! could not fit into any entry.

use std::sync::Arc;

use openraft::error::{ClientWriteError, ForwardToLeader, RaftError};
use tokio::sync::{mpsc, oneshot, Semaphore};
use yard_raft_store::{Command, NodeId, NodeInfo, Raft, Response};

/// Why a batched write did not produce a response.
#[derive(Debug, Clone)]
pub enum BatchError {
    /// This node does not lead; nothing was proposed.
    Forward(ForwardToLeader<NodeId, NodeInfo>),
    /// The proposal's fate is unknown (e.g. Raft stopped under it).
    Indefinite(String),
    /// The write is larger than one Raft entry may be; nothing was proposed.
    TooLarge(String),
}

struct Pending {
    cmd: Command,
    /// The write's encoded size, as it adds to a batch's entry.
    bytes: usize,
    reply: oneshot::Sender<Result<Response, BatchError>>,
}

/// The bytes an entry adds beyond its writes (its log id, the variants, a batch's length),
/// rounded up.
const BATCH_OVERHEAD: usize = 64;

/// Handle to the batching task. Cheap to clone.
#[derive(Clone)]
pub struct WriteBatcher {
    tx: mpsc::UnboundedSender<Pending>,
    max_entry_bytes: usize,
}

impl WriteBatcher {
    /// Starts the batching task on the current tokio runtime. A proposal carries at most
    /// `max_batch` writes and `max_entry_bytes` encoded bytes.
    pub fn start(
        raft: Raft,
        max_in_flight: usize,
        max_batch: usize,
        max_entry_bytes: usize,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let limits = BatchLimits {
            writes: max_batch.max(1),
            bytes: max_entry_bytes,
        };
        tokio::spawn(run(raft, rx, max_in_flight.max(1), limits));
        Self {
            tx,
            max_entry_bytes,
        }
    }

    /// Refuses a write that could never be proposed: one larger than a Raft entry may be.
    /// Callers check before forwarding a write, so a follower refuses it as the leader would.
    pub fn check(&self, cmd: &Command) -> Result<usize, BatchError> {
        let bytes = crate::limits::encoded_len(cmd);
        if bytes.saturating_add(BATCH_OVERHEAD) > self.max_entry_bytes {
            return Err(BatchError::TooLarge(format!(
                "a write of {bytes} bytes exceeds the limit of {} bytes per raft entry",
                self.max_entry_bytes - BATCH_OVERHEAD.min(self.max_entry_bytes)
            )));
        }
        Ok(bytes)
    }

    /// Proposes `cmd` (possibly together with others) and waits for its own response.
    pub async fn write(&self, cmd: Command) -> Result<Response, BatchError> {
        let bytes = self.check(&cmd)?;
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Pending { cmd, bytes, reply })
            .map_err(|_| BatchError::Indefinite("the write batcher has stopped".into()))?;
        rx.await.unwrap_or_else(|_| {
            Err(BatchError::Indefinite(
                "the write batcher dropped the write".into(),
            ))
        })
    }
}

/// How much one proposal may carry.
#[derive(Clone, Copy)]
struct BatchLimits {
    writes: usize,
    bytes: usize,
}

async fn run(
    raft: Raft,
    mut rx: mpsc::UnboundedReceiver<Pending>,
    max_in_flight: usize,
    limits: BatchLimits,
) {
    let slots = Arc::new(Semaphore::new(max_in_flight));
    // The write that did not fit into the previous batch: it opens the next one.
    let mut held: Option<Pending> = None;
    loop {
        let first = match held.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        // Waiting for a free slot is what lets a queue build up under load.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let batch = take_batch(first, &mut rx, &mut held, limits);
        if batch.is_empty() {
            continue;
        }
        let raft = raft.clone();
        tokio::spawn(async move {
            propose(&raft, batch).await;
            drop(slot);
        });
    }
}

/// The writes of one proposal: `first`, then queued writes while both limits hold. The write
/// that would overflow the byte budget is left in `held` for the next proposal.
///
/// A write whose requester stopped waiting (its deadline passed while it queued) is not
/// proposed: it was answered as failed or unknown, and applying it now, perhaps much later
/// under another leadership of this node, would surprise every reader.
fn take_batch(
    first: Pending,
    rx: &mut mpsc::UnboundedReceiver<Pending>,
    held: &mut Option<Pending>,
    limits: BatchLimits,
) -> Vec<Pending> {
    let mut bytes = BATCH_OVERHEAD + first.bytes;
    let mut batch = vec![first];
    while batch.len() < limits.writes {
        let Ok(next) = rx.try_recv() else { break };
        if next.reply.is_closed() {
            continue;
        }
        if bytes + next.bytes > limits.bytes {
            *held = Some(next);
            break;
        }
        bytes += next.bytes;
        batch.push(next);
    }
    batch.retain(|p| !p.reply.is_closed());
    batch
}

async fn propose(raft: &Raft, mut batch: Vec<Pending>) {
    let single = batch.len() == 1;
    let cmd = if single {
        batch[0].cmd.clone()
    } else {
        Command::Batch(batch.iter().map(|p| p.cmd.clone()).collect())
    };
    let result = raft.client_write(cmd).await;
    match result {
        Ok(resp) => match resp.data {
            Response::Batch(responses) if !single && responses.len() == batch.len() => {
                for (p, r) in batch.into_iter().zip(responses) {
                    let _ = p.reply.send(Ok(r));
                }
            }
            other if single => {
                let _ = batch.remove(0).reply.send(Ok(other));
            }
            other => {
                let msg = format!("batch answered with {other:?}");
                for p in batch {
                    let _ = p.reply.send(Err(BatchError::Indefinite(msg.clone())));
                }
            }
        },
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
            for p in batch {
                let _ = p.reply.send(Err(BatchError::Forward(f.clone())));
            }
        }
        Err(e) => {
            let msg = format!("write outcome unknown: {e}");
            for p in batch {
                let _ = p.reply.send(Err(BatchError::Indefinite(msg.clone())));
            }
        }
    }
}
