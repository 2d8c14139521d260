//! Coalesces concurrent client writes into one Raft entry.
//!
//! openraft 0.9 appends, replicates and flushes once per proposal, so a leader that proposed
//! every client write on its own spent a log flush per write. The batcher keeps up to
//! `max_in_flight` proposals going; writes that arrive while all are busy wait in the queue and
//! go out together as one [`Command::Batch`]. With little load a write is proposed at once, so
//! batching adds no latency; under load it turns many flushes into one. Every write in a batch
//! takes effect at the batch's apply point, which lies within each write's own request, so
//! linearizability is unchanged.

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
}

struct Pending {
    cmd: Command,
    reply: oneshot::Sender<Result<Response, BatchError>>,
}

/// Handle to the batching task. Cheap to clone.
#[derive(Clone)]
pub struct WriteBatcher {
    tx: mpsc::UnboundedSender<Pending>,
}

impl WriteBatcher {
    /// Starts the batching task on the current tokio runtime.
    pub fn start(raft: Raft, max_in_flight: usize, max_batch: usize) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(raft, rx, max_in_flight.max(1), max_batch.max(1)));
        Self { tx }
    }

    /// Proposes `cmd` (possibly together with others) and waits for its own response.
    pub async fn write(&self, cmd: Command) -> Result<Response, BatchError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Pending { cmd, reply })
            .map_err(|_| BatchError::Indefinite("the write batcher has stopped".into()))?;
        rx.await.unwrap_or_else(|_| {
            Err(BatchError::Indefinite(
                "the write batcher dropped the write".into(),
            ))
        })
    }
}

async fn run(
    raft: Raft,
    mut rx: mpsc::UnboundedReceiver<Pending>,
    max_in_flight: usize,
    max_batch: usize,
) {
    let slots = Arc::new(Semaphore::new(max_in_flight));
    while let Some(first) = rx.recv().await {
        // Waiting for a free slot is what lets a queue build up under load.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        // A write whose requester stopped waiting (its deadline passed while it queued) is not
        // proposed: it was answered as failed or unknown, and applying it now, perhaps much
        // later under another leadership of this node, would surprise every reader.
        let batch: Vec<Pending> = std::iter::once(first)
            .chain(std::iter::from_fn(|| rx.try_recv().ok()).take(max_batch - 1))
            .filter(|p| !p.reply.is_closed())
            .collect();
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
