//! The workload's view of a real `yard` cluster: the admin client behind [`KvClient`], with
//! every failure classified as definitely-not-applied or unknown the way the node reports it.

use std::time::Duration;

use yard::client::{AdminClient, ClientError as YardError};
use yard::rpc::{AdminReply, AdminRequest};

use crate::workload::{ClientError, KvClient};

/// One workload client: its own QUIC connection, endpoints tried in its own order.
#[derive(Clone)]
pub struct YardKv {
    client: AdminClient,
    /// Pause before each operation, to bound the history's size over a long schedule.
    pace: Duration,
}

impl YardKv {
    pub fn new(client: AdminClient, pace: Duration) -> Self {
        Self { client, pace }
    }

    async fn call(&self, req: AdminRequest) -> Result<AdminReply, ClientError> {
        tokio::time::sleep(self.pace).await;
        self.client.admin(req).await.map_err(classify)
    }
}

fn classify(e: YardError) -> ClientError {
    if e.is_indefinite() {
        ClientError::Indefinite(e.to_string())
    } else {
        ClientError::Definite(e.to_string())
    }
}

fn unexpected(reply: AdminReply) -> ClientError {
    // A well-formed reply of the wrong kind: the request was answered, so it is not "unknown",
    // but the workload cannot use it either.
    ClientError::Definite(format!("unexpected reply {reply:?}"))
}

impl KvClient for YardKv {
    async fn get(&self, key: &str) -> Result<Option<String>, ClientError> {
        match self
            .call(AdminRequest::KvGet {
                key: key.to_owned(),
            })
            .await?
        {
            AdminReply::Value(v) => Ok(v.map(|e| e.value)),
            other => Err(unexpected(other)),
        }
    }

    async fn put(&self, key: &str, value: &str) -> Result<(), ClientError> {
        match self
            .call(AdminRequest::KvPut {
                key: key.to_owned(),
                value: value.to_owned(),
            })
            .await?
        {
            AdminReply::Written { .. } => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    async fn cas(&self, key: &str, expect: Option<&str>, value: &str) -> Result<bool, ClientError> {
        match self
            .call(AdminRequest::KvCas {
                key: key.to_owned(),
                expect: expect.map(str::to_owned),
                value: value.to_owned(),
            })
            .await?
        {
            AdminReply::Cas { succeeded, .. } => Ok(succeeded),
            other => Err(unexpected(other)),
        }
    }

    async fn delete(&self, key: &str) -> Result<(), ClientError> {
        match self
            .call(AdminRequest::KvDelete {
                key: key.to_owned(),
            })
            .await?
        {
            AdminReply::Deleted { .. } => Ok(()),
            other => Err(unexpected(other)),
        }
    }
}
