//! `yard snapshot save | status | restore`: back up the cluster's replicated state to a file,
//! check a file, and start a new cluster from one (as `etcdctl snapshot save` and `etcdutl
//! snapshot restore` do). The file format is `yard_raft_store::backup`'s.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Subcommand;
use serde_json::json;
use yard_raft_store::backup::{self, Backup};

use yard::rpc::{AdminReply, AdminRequest};

use super::output::Out;

#[derive(Debug, Subcommand)]
pub enum SnapshotCmd {
    /// Save the cluster's tables at one revision to FILE (read linearizably through the
    /// endpoint; FILE is written 0600, whole or not at all).
    Save { file: PathBuf },
    /// Check FILE (format, checksum, length) and say what it holds.
    Status { file: PathBuf },
    /// Make a new cluster's data directory from FILE: the node of `--config` becomes its only
    /// voter; start it with `yard node start --config C --bootstrap`, then join the others.
    Restore {
        file: PathBuf,
        /// The new node's config (its id, name, address and data directory).
        #[arg(long)]
        config: PathBuf,
    },
}

impl SnapshotCmd {
    /// Whether the command runs without a cluster.
    pub fn is_offline(&self) -> bool {
        !matches!(self, SnapshotCmd::Save { .. })
    }
}

/// `yard snapshot save` through the admin RPC.
pub async fn save(
    client: &yard::client::AdminClient,
    file: &Path,
    out: Out,
) -> anyhow::Result<ExitCode> {
    let AdminReply::Snapshot(bytes) = client.admin(AdminRequest::SnapshotSave).await? else {
        bail!("unexpected reply to a snapshot request");
    };
    // Checked before it is written: a file that would not restore is not a backup.
    let b =
        backup::decode_backup(&bytes).context("the node sent a snapshot that does not check")?;
    write_secret(file, &bytes)?;
    out.line(summary(&b, file, bytes.len()), || {
        format!(
            "saved revision {} (log index {}) of cluster {} to {}: {} bytes, sha256 {}",
            b.revision,
            b.index,
            b.cluster,
            file.display(),
            bytes.len(),
            b.sha256
        )
    });
    Ok(ExitCode::SUCCESS)
}

/// `yard snapshot status` and `restore`, offline.
pub fn run(cmd: &SnapshotCmd, out: Out) -> anyhow::Result<ExitCode> {
    match cmd {
        SnapshotCmd::Save { .. } => unreachable!("save runs against a cluster"),
        SnapshotCmd::Status { file } => {
            let (b, len) = read(file)?;
            out.line(summary(&b, file, len), || {
                format!(
                    "{}: format {}, cluster {}, revision {} (log index {}), {} keys, {} vips, {} endpoints, {} aggregation jobs, {} bytes, sha256 {}",
                    file.display(),
                    b.format,
                    b.cluster,
                    b.revision,
                    b.index,
                    b.data.kv.len(),
                    b.data.gateway.vips.len(),
                    b.data.gateway.endpoints.len(),
                    b.data.aggregation.jobs.len(),
                    len,
                    b.sha256
                )
            });
            Ok(ExitCode::SUCCESS)
        }
        SnapshotCmd::Restore { file, config } => {
            let (b, _) = read(file)?;
            let cfg = yard::config::Config::load(Some(config))?;
            if b.cluster != cfg.node.cluster {
                bail!(
                    "the snapshot is of cluster {} but the config's node.cluster is {}",
                    b.cluster,
                    cfg.node.cluster
                );
            }
            let info = yard_raft_store::NodeInfo {
                addr: cfg.advertise(),
                name: cfg.node.name.clone(),
            };
            let data = backup::for_new_cluster(b.data, cfg.node.id, info);
            let dir = cfg.node.data_dir.join("raft");
            yard::data_dir::prepare(&cfg.node.data_dir).with_context(|| {
                format!(
                    "cannot create node.data_dir {}",
                    cfg.node.data_dir.display()
                )
            })?;
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(backup::restore(&dir, data))?;
            out.line(
                json!({"data_dir": cfg.node.data_dir, "revision": b.revision, "node": cfg.node.id}),
                || {
                    format!(
                        "restored revision {} into {} with node {} as the only voter; start it with --bootstrap",
                        b.revision,
                        cfg.node.data_dir.display(),
                        cfg.node.id
                    )
                },
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn read(file: &Path) -> anyhow::Result<(Backup, usize)> {
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let b =
        backup::decode_backup(&bytes).with_context(|| format!("{} is refused", file.display()))?;
    Ok((b, bytes.len()))
}

fn summary(b: &Backup, file: &Path, len: usize) -> serde_json::Value {
    json!({
        "file": file,
        "format": b.format,
        "cluster": b.cluster,
        "revision": b.revision,
        "index": b.index,
        "keys": b.data.kv.len(),
        "vips": b.data.gateway.vips.len(),
        "endpoints": b.data.gateway.endpoints.len(),
        "agg_jobs": b.data.aggregation.jobs.len(),
        "bytes": len,
        "sha256": b.sha256,
    })
}

/// Writes `bytes` to `path` 0600, whole or not at all: the tables hold token hashes and every
/// tenant's endpoints, and a crash must not leave half a backup under the name of a whole one.
fn write_secret(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    Ok(yard::tls::write_file(path, bytes, true)?)
}
