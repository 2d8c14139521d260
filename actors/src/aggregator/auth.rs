//! The aggregation frames' tokens (`agg_hdr.token`, docs/aggregation-protocol.md,
//! "Authentication"): what a worker's DATA frames carry to prove they are its own, and what an
//! aggregator's RESULT frames carry to prove they are the aggregator's.
//!
//! Each is the first four bytes of HMAC-SHA256 under the job's secret ([`AggJob::secret`],
//! random, drawn by the node that proposed the job) of the job, the epoch, the aggregator's node
//! id and the role (a worker index there, or the result). So a token is good for one worker at
//! one aggregator in one epoch: every regrouping gives new ones, a worker's token says nothing
//! of another's or of the result token, and a host that never sees the secret or a member's
//! traffic guesses a token with probability 2^-32 per frame. Only the cluster's nodes see the
//! secret; a worker learns its own two tokens from its node's agent.

use ring::hmac;
use yard_raft_store::aggregation::AggJob;
use yard_raft_store::NodeId;

/// Domain separation: these MACs are tokens of this protocol and nothing else.
const CONTEXT: &[u8] = b"yard aggregation token v1";
/// The role byte of a worker's DATA token.
const ROLE_DATA: u8 = 1;
/// The role byte of an aggregator's RESULT token.
const ROLE_RESULT: u8 = 2;

fn token(job: &AggJob, aggregator: NodeId, role: u8, worker: u16) -> u32 {
    let key = hmac::Key::new(hmac::HMAC_SHA256, &job.secret);
    let mut ctx = hmac::Context::with_key(&key);
    ctx.update(CONTEXT);
    ctx.update(&job.id.to_le_bytes());
    ctx.update(&job.epoch.to_le_bytes());
    ctx.update(&aggregator.to_le_bytes());
    ctx.update(&[role]);
    ctx.update(&worker.to_le_bytes());
    let tag = ctx.sign();
    let b = tag.as_ref();
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// The token of worker index `worker`'s DATA frames at the aggregator on node `aggregator`, in
/// `job`'s current epoch (a cluster aggregator's partial sums, as a member of the root, too).
pub fn data_token(job: &AggJob, aggregator: NodeId, worker: u16) -> u32 {
    token(job, aggregator, ROLE_DATA, worker)
}

/// The token of the RESULT frames of the aggregator on node `aggregator` in `job`'s current
/// epoch.
pub fn result_token(job: &AggJob, aggregator: NodeId) -> u32 {
    token(job, aggregator, ROLE_RESULT, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};
    use yard_raft_store::aggregation::Grouping;

    fn job(secret: [u8; 16]) -> AggJob {
        AggJob {
            id: 3,
            name: "j".into(),
            workers: 4,
            values: 10,
            dtype: 0,
            elastic: false,
            chunk_values: 360,
            colocate: false,
            epoch: 5,
            members: BTreeMap::new(),
            gone: Vec::new(),
            placement: None,
            failed: None,
            grouping: Grouping::Flat,
            clusters: Vec::new(),
            secret,
        }
    }

    #[test]
    fn tokens_differ_per_worker_aggregator_epoch_role_and_secret() {
        let j = job([1; 16]);
        let mut seen = BTreeSet::new();
        for aggregator in [1, 2] {
            for w in 0..64 {
                assert!(
                    seen.insert(data_token(&j, aggregator, w)),
                    "a repeated token"
                );
            }
            assert!(seen.insert(result_token(&j, aggregator)));
        }
        let next = AggJob {
            epoch: 6,
            ..j.clone()
        };
        assert!(
            seen.insert(data_token(&next, 1, 0)),
            "a new epoch, new tokens"
        );
        assert!(
            seen.insert(data_token(&job([2; 16]), 1, 0)),
            "another secret"
        );
        let other = AggJob { id: 4, ..j.clone() };
        assert!(seen.insert(data_token(&other, 1, 0)), "another job");
        // The same inputs give the same token on every node.
        assert_eq!(data_token(&j, 2, 7), data_token(&job([1; 16]), 2, 7));
    }
}
