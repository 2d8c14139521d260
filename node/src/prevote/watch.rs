//! How long this node's pre-vote gate has been watching, on the node's clock: shared by the
//! gate's loop and the `PreVote` handler, and held by the `Node`.

use yard_control::prevote::{PreVoteConfig, Watch};

/// A [`Watch`] on its clock, shared by the gate's loop and the `PreVote` handler.
#[derive(Debug)]
pub struct SharedWatch {
    epoch: tokio::time::Instant,
    watch: std::sync::Mutex<Watch>,
}

impl Default for SharedWatch {
    fn default() -> Self {
        Self {
            epoch: tokio::time::Instant::now(),
            watch: std::sync::Mutex::default(),
        }
    }
}

impl SharedWatch {
    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Watch> {
        self.watch.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn tick(&self, cfg: &PreVoteConfig) -> u64 {
        let now = self.now_ms();
        self.lock().tick(now, cfg);
        now
    }

    pub fn heard(&self, heard_ms_ago: Option<u64>) -> Option<u64> {
        let now = self.now_ms();
        self.lock().heard(heard_ms_ago, now)
    }
}
