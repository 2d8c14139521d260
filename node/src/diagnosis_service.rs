//! Serving `yard diagnose` and the probes' summaries: verdicts come from the replicated table
//! (any node answers, through the leader's read barrier); the timeline records come from the
//! leader's analyzer, which alone holds recent events.

use openraft::ServerState;

use crate::rpc::{AdminReply, AdminRequest, DiagnosisView, JobView, Reply};
use crate::service::Node;

impl Node {
    pub(crate) async fn handle_diagnose(
        &self,
        forwarded: bool,
        req: &AdminRequest,
        job: Option<&str>,
        timeline: bool,
    ) -> Reply {
        let wanted = job.map(str::to_owned);
        let reply = self
            .read(forwarded, req, move |d| {
                let jobs = d
                    .diagnosis
                    .jobs
                    .iter()
                    .filter(|(name, _)| wanted.as_ref().is_none_or(|w| w == *name))
                    .map(|(name, j)| JobView {
                        job: name.clone(),
                        verdicts: j.verdicts.clone(),
                        history: j.history.clone(),
                        updated_unix_ms: j.updated_unix_ms,
                    })
                    .collect();
                AdminReply::Diagnosis(DiagnosisView {
                    jobs,
                    timeline: None,
                })
            })
            .await;
        let Reply::Admin(AdminReply::Diagnosis(mut view)) = reply else {
            return reply;
        };
        // The read ran here only if this node leads (a follower forwarded the whole request,
        // and the leader filled the timeline in).
        let leads = self.raft().metrics().borrow().state == ServerState::Leader;
        if let (true, Some(job), true) = (timeline, job, leads) {
            let top = view
                .jobs
                .iter()
                .find(|j| j.job == job)
                .and_then(|j| j.verdicts.first())
                .cloned();
            // The window waits for a running analysis pass: off the runtime.
            let control = self.diagnosis().clone();
            let job = job.to_owned();
            view.timeline = tokio::task::spawn_blocking(move || control.window(&job, top.as_ref()))
                .await
                .ok()
                .flatten();
        }
        Reply::Admin(AdminReply::Diagnosis(view))
    }

    /// A probe summary: only the leader's analyzer takes it; others say so, and the sender
    /// looks the leader up again.
    pub(crate) fn handle_probe_report(
        &self,
        batches: Vec<yard_actors::probe::core::JobBatch>,
    ) -> Reply {
        let (state, term) = {
            let m = self.raft().metrics();
            let m = m.borrow();
            (m.state, m.current_term)
        };
        if state != ServerState::Leader {
            return Reply::Error(
                "this node is not the leader; send probe reports to the leader".into(),
            );
        }
        self.diagnosis().ingest(term, batches);
        Reply::ProbeAccepted
    }
}
