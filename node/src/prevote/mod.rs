//! Pre-vote in front of openraft's elections (Raft dissertation §9.6; openraft 0.9 has none).
//!
//! Without it, a follower that alone stops hearing the leader — its control link lossy, or cut
//! from the leader but not from the others — stands for election with a higher term. The other
//! voters refuse it (openraft's leader lease), but the higher term deposes the leader the next
//! time the leader reaches it, and the lossy node may even win the election that follows. So
//! measured: a gateway owner at 40% control loss won an election, could not hear the healthy
//! nodes' lease renewals as leader and revoked them, moving all six VIPs at once.
//!
//! With it, a node may stand only after a majority of the voters (itself included) said they
//! would vote: none of them is the leader or has heard from one within openraft's leader
//! lease. The answer ignores logs and terms: openraft's real vote checks those, and a
//! pre-vote only has to stop candidacies while a leader is alive, so it adds no way for an
//! election to be blocked that the real vote does not have already (the same leader lease).
//!
//! In a rolling upgrade, a node that does not know the `PreVote` request answers it with an
//! error, which counts as a refusal: upgraded nodes stand only once a majority of the voters
//! is upgraded, while the others elect as before.
//!
//! The pure decision is `yard_control::prevote` (`Gate`), driven by [`gate::run`]: elections are enabled (openraft's
//! `runtime_config().elect`) for a window after a granted round and disabled otherwise.

pub mod gate;
pub mod watch;

pub use yard_control::prevote::{grant, LocalView, PreVoteConfig};

/// The gate's timings for a Raft node configured with `c`.
pub fn config_of(c: &openraft::Config) -> PreVoteConfig {
    PreVoteConfig {
        quiet_ms: c.election_timeout_max,
        window_ms: 4 * c.election_timeout_max,
        round_ms: c.heartbeat_interval.max(1),
    }
}
