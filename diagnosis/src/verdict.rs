//! What the analyzer concludes. The types live in `yard-verdict` (the replicated state machine
//! stores them and should not depend on the analyzer); they are re-exported here so users of
//! `yard_diagnosis::verdict` need not know.

pub use yard_verdict::{Class, Link, LinkKind, PgRef, Report, Subtype, Verdict};
