//! `yard ca rotate begin | switch | finish | status`: the CA rollover of
//! `yard::ca_rotation`, and what every host of the cluster trusts and presents meanwhile.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Subcommand;
use serde_json::json;

use yard::ca_rotation;
use yard::client::AdminClient;
use yard::pki::PkiReport;
use yard::rpc::{AdminReply, AdminRequest, Reply, Request};

use super::output::Out;

#[derive(Debug, Subcommand)]
pub enum RotateCmd {
    /// Step 1: make a new CA in DIR and trust it beside the old one, which still signs. Then
    /// copy DIR/ca.crt to every node's TLS directory (nodes take it within a minute, or at
    /// once on SIGHUP).
    Begin {
        #[arg(long)]
        dir: PathBuf,
    },
    /// Step 2: the new CA signs from now on, and admin.crt/admin.key are issued again by it.
    /// Then copy DIR/ca.crt to every node, and DIR/ca.key to the nodes that hold the CA key,
    /// those first: every node renews its certificate from them at once.
    Switch {
        #[arg(long)]
        dir: PathBuf,
        /// How long the new admin certificate is valid.
        #[arg(long, default_value = "365d", value_parser = humantime::parse_duration)]
        admin_validity: Duration,
    },
    /// Step 3: trust the new CA alone. Refused while a host of the cluster (asked through
    /// --endpoint) presents a certificate of another CA, signs with another, or does not
    /// answer, unless --force. Then copy DIR/ca.crt to every node.
    Finish {
        #[arg(long)]
        dir: PathBuf,
        /// Drop the old CA without asking the cluster.
        #[arg(long)]
        force: bool,
    },
    /// Every host's CAs: which signed the certificate it presents, which it trusts (the
    /// active one first) and which it signs with.
    Status,
}

impl RotateCmd {
    /// Whether the step needs no cluster.
    pub fn is_offline(&self) -> bool {
        matches!(
            self,
            RotateCmd::Begin { .. }
                | RotateCmd::Switch { .. }
                | RotateCmd::Finish { force: true, .. }
        )
    }
}

/// The steps that change files only.
pub fn offline(cmd: &RotateCmd, cluster: &str, out: Out) -> anyhow::Result<ExitCode> {
    let (step, dir, done, next) = match cmd {
        RotateCmd::Begin { dir } => (
            "begin",
            dir,
            ca_rotation::begin(dir, cluster)?,
            "copy ca.crt to every node, then run `yard ca rotate switch`",
        ),
        RotateCmd::Switch {
            dir,
            admin_validity,
        } => (
            "switch",
            dir,
            ca_rotation::switch(dir, cluster, *admin_validity)?,
            "copy ca.key to the nodes that hold the CA key and ca.crt to every node; when `yard ca rotate status` shows every host on the new CA, run `yard ca rotate finish`",
        ),
        RotateCmd::Finish { dir, .. } => (
            "finish",
            dir,
            ca_rotation::finish(dir)?,
            "copy ca.crt to every node",
        ),
        RotateCmd::Status => bail!("`yard ca rotate status` asks the cluster"),
    };
    out.line(
        json!({"step": step, "dir": dir, "trusted": done.trusted}),
        || {
            format!(
                "{step}: {}/ca.crt trusts {}; next: {next}",
                dir.display(),
                done.trusted
                    .iter()
                    .enumerate()
                    .map(|(i, h)| format!("{}{}", short(h), if i == 0 { " (active)" } else { "" }))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
    );
    Ok(ExitCode::SUCCESS)
}

/// One host's answer.
struct HostPki {
    id: u64,
    name: String,
    addr: String,
    report: Result<PkiReport, String>,
}

/// `status`, and `finish` after checking every host.
pub async fn online(
    cmd: &RotateCmd,
    client: &AdminClient,
    connect: impl Fn(&str) -> anyhow::Result<AdminClient>,
    cluster: &str,
    out: Out,
) -> anyhow::Result<ExitCode> {
    let hosts = ask_hosts(client, connect).await?;
    match cmd {
        RotateCmd::Status => {
            print_status(&hosts, out);
            Ok(ExitCode::SUCCESS)
        }
        RotateCmd::Finish { dir, force: false } => {
            let (active, _) = ca_rotation::hashes(dir)?;
            let behind: Vec<String> = hosts.iter().filter_map(|h| lagging(h, &active)).collect();
            if !behind.is_empty() {
                bail!(
                    "the old CA is still needed, so ca.crt is unchanged: {}; run `yard ca rotate finish` again when every host is on the new CA, or pass --force",
                    behind.join("; ")
                );
            }
            offline(cmd, cluster, out)
        }
        _ => offline(cmd, cluster, out),
    }
}

/// Why host `h` still needs a CA other than `active`, if it does.
fn lagging(h: &HostPki, active: &str) -> Option<String> {
    let who = format!("node {} ({})", h.id, h.name);
    match &h.report {
        Err(e) => Some(format!("{who} did not answer: {e}")),
        Ok(r) if r.issuer.as_deref() != Some(active) => Some(format!(
            "{who} presents a certificate of CA {}",
            r.issuer.as_deref().map_or("unknown", short)
        )),
        Ok(r) if r.signs_with.as_deref().is_some_and(|s| s != active) => Some(format!(
            "{who} signs with CA {}",
            r.signs_with.as_deref().map_or("", short)
        )),
        Ok(_) => None,
    }
}

/// Every host the cluster lists, asked directly (agents included).
async fn ask_hosts(
    client: &AdminClient,
    connect: impl Fn(&str) -> anyhow::Result<AdminClient>,
) -> anyhow::Result<Vec<HostPki>> {
    let AdminReply::Members(view) = client.admin(AdminRequest::Members).await? else {
        bail!("unexpected reply to a members request");
    };
    let mut hosts = Vec::with_capacity(view.hosts.len());
    for h in view.hosts {
        let report = match connect(&h.addr) {
            Ok(c) => {
                let reply = c.call(Request::Pki).await;
                c.close().await;
                match reply {
                    Ok(Reply::Pki(r)) => Ok(r),
                    Ok(Reply::Error(e)) => Err(e),
                    Ok(other) => Err(format!("unexpected reply {other:?}")),
                    Err(e) => Err(e.to_string()),
                }
            }
            Err(e) => Err(format!("{e:#}")),
        };
        hosts.push(HostPki {
            id: h.id,
            name: h.name,
            addr: h.addr,
            report,
        });
    }
    Ok(hosts)
}

fn print_status(hosts: &[HostPki], out: Out) {
    if out.json {
        let rows: Vec<_> = hosts
            .iter()
            .map(|h| match &h.report {
                Ok(r) => json!({"id": h.id, "name": h.name, "addr": h.addr, "presents": r.issuer, "trusts": r.trusted, "signs_with": r.signs_with, "cert_not_after_unix": r.not_after_unix}),
                Err(e) => json!({"id": h.id, "name": h.name, "addr": h.addr, "error": e}),
            })
            .collect();
        println!("{}", json!(rows));
        return;
    }
    for h in hosts {
        match &h.report {
            Ok(r) => println!(
                "node {} {} {}: presents CA {}, trusts {}, signs with {}",
                h.id,
                h.name,
                h.addr,
                r.issuer.as_deref().map_or("unknown", short),
                r.trusted
                    .iter()
                    .map(|t| short(t))
                    .collect::<Vec<_>>()
                    .join(", "),
                r.signs_with.as_deref().map_or("nothing (no CA key)", short)
            ),
            Err(e) => println!("node {} {} {}: no answer: {e}", h.id, h.name, h.addr),
        }
    }
}

/// A CA hash as an operator compares them: its first 12 hex digits.
fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

/// What the caller passes as `connect`: a client for one endpoint with the CLI's credentials.
pub fn connector(
    tls_dir: PathBuf,
    cluster: String,
    timeout: Duration,
) -> impl Fn(&str) -> anyhow::Result<AdminClient> {
    move |addr: &str| {
        AdminClient::new(&[addr.to_owned()], &tls_dir, &cluster, timeout)
            .with_context(|| format!("cannot use the admin credentials in {}", tls_dir.display()))
    }
}
