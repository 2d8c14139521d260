//! What a member answers a Raft RPC from a node that is no longer a member.
//!
//! Admission refuses such RPCs (issue 25: only members take part in Raft). A bare refusal is
//! not enough for a removed *leader*, though: a voter cut off while the others replaced it
//! still believes it leads its old term, and openraft 0.9 has no check-quorum, so it sends
//! heartbeats to the members for as long as it runs (thousands of refused RPCs a minute in the
//! chaos suite) and never hears that it was replaced. Raft's own answer to a sender with an
//! older term is the receiver's term: a leader or candidate that sees a higher vote steps down.
//! So when this node's vote is newer than the sender's, the refusal carries it. Nothing of the
//! request is applied, and the vote is what any member already reveals to every other member.

use openraft::raft::{AppendEntriesResponse, InstallSnapshotResponse, VoteResponse};
use openraft::{LogId, Vote};
use yard_raft_store::NodeId;

use crate::rpc::{RaftReply, RaftRequest};

/// The answer to `req` from a non-member when this node's vote (`ours`) is newer than the
/// vote the request carries; `None` when it is not (then the refusal stands alone: an answer
/// with an older vote would change nothing at the sender). `our_last_applied` stands for this
/// node's log in a refused vote, a lower bound of it: a candidate reads it only to put off its
/// next election when the log it names is newer than its own.
pub fn higher_vote_answer(
    req: &RaftRequest,
    ours: &Vote<NodeId>,
    our_last_applied: Option<LogId<NodeId>>,
) -> Option<RaftReply> {
    let theirs = match req {
        RaftRequest::AppendEntries(r) => &r.vote,
        RaftRequest::Vote(r) => &r.vote,
        RaftRequest::InstallSnapshot(r) => &r.vote,
    };
    if ours <= theirs {
        return None;
    }
    Some(match req {
        RaftRequest::AppendEntries(_) => {
            RaftReply::AppendEntries(AppendEntriesResponse::HigherVote(*ours))
        }
        RaftRequest::Vote(_) => RaftReply::Vote(VoteResponse {
            vote: *ours,
            vote_granted: false,
            last_log_id: our_last_applied,
        }),
        RaftRequest::InstallSnapshot(_) => {
            RaftReply::InstallSnapshot(InstallSnapshotResponse { vote: *ours })
        }
    })
}

#[cfg(test)]
mod tests {
    use openraft::raft::{AppendEntriesRequest, VoteRequest};
    use openraft::CommittedLeaderId;

    use super::*;

    fn heartbeat(term: u64, leader: NodeId) -> RaftRequest {
        RaftRequest::AppendEntries(AppendEntriesRequest {
            vote: Vote::new_committed(term, leader),
            prev_log_id: None,
            entries: Vec::new(),
            leader_commit: None,
        })
    }

    #[test]
    fn a_stale_leader_is_told_the_newer_vote() {
        let ours = Vote::new_committed(12, 6);
        match higher_vote_answer(&heartbeat(11, 3), &ours, None) {
            Some(RaftReply::AppendEntries(AppendEntriesResponse::HigherVote(v))) => {
                assert_eq!(v, ours)
            }
            other => panic!("expected the higher vote, got {other:?}"),
        }
    }

    #[test]
    fn a_sender_whose_vote_is_not_older_gets_no_vote() {
        let ours = Vote::new_committed(12, 6);
        assert!(higher_vote_answer(&heartbeat(12, 6), &ours, None).is_none());
        assert!(higher_vote_answer(&heartbeat(13, 3), &ours, None).is_none());
    }

    #[test]
    fn a_removed_candidate_is_refused_the_vote_and_told_ours() {
        let ours = Vote::new_committed(12, 6);
        let last = Some(LogId::new(CommittedLeaderId::new(12, 6), 900));
        let req = RaftRequest::Vote(VoteRequest::new(Vote::new(11, 3), None));
        match higher_vote_answer(&req, &ours, last) {
            Some(RaftReply::Vote(v)) => {
                assert!(!v.vote_granted);
                assert_eq!(v.vote, ours);
                assert_eq!(v.last_log_id, last);
            }
            other => panic!("expected a refused vote, got {other:?}"),
        }
    }
}
