//! `yard offload`: what of an XDP program a SmartNIC could run, and where to split the
//! gateway between NIC and host (the planner's OXDP part). Everything here is offline: it
//! needs neither a node nor a NIC.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Subcommand, ValueEnum};
use yard_offload::Profile;

use super::output::Out;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ProfileArg {
    /// Netronome Agilio hardware XDP offload, rules from the nfp driver.
    Nfp,
    /// The hXDP FPGA NIC, modelled from its paper.
    Hxdp,
    /// No NIC: everything on the host.
    None,
}

impl ProfileArg {
    fn profile(self) -> Profile {
        match self {
            ProfileArg::Nfp => yard_offload::profile::nfp(),
            ProfileArg::Hxdp => yard_offload::profile::hxdp(),
            ProfileArg::None => yard_offload::profile::none(),
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum OffloadCmd {
    /// Which functions and instruction ranges of a compiled BPF object the NIC could run, and
    /// why not (helper, map type or size, opcode, return code). A static check: the kernel
    /// and the NIC driver decide at load time.
    Check {
        /// The object, as `clang -O2 -target bpf -c` writes it.
        file: PathBuf,
        #[arg(long, value_enum, default_value = "nfp")]
        profile: ProfileArg,
    },
    /// Split the gateway's forwarding function between the NIC and the host at the cut that
    /// maximises modelled throughput within the profile's limits. Every figure is a model.
    Plan {
        #[arg(long, value_enum, default_value = "nfp")]
        profile: ProfileArg,
        /// Also write the chosen cut's NIC and host programs (C, with yard.h) into DIR.
        #[arg(long, value_name = "DIR")]
        emit: Option<PathBuf>,
    },
}

pub fn run(cmd: &OffloadCmd, out: Out) -> anyhow::Result<ExitCode> {
    match cmd {
        OffloadCmd::Check { file, profile } => {
            let report = yard_offload::check_file(file, &profile.profile())
                .with_context(|| file.display().to_string())?;
            out.line(serde_json::to_value(&report)?, || {
                report.human().trim_end().to_owned()
            });
            Ok(ExitCode::SUCCESS)
        }
        OffloadCmd::Plan { profile, emit } => {
            let pipeline = yard_offload::gateway::pipeline();
            let host = yard_offload::plan::HostModel::default();
            let plan = yard_offload::plan::plan(&pipeline, &profile.profile(), &host)
                .map_err(|e| anyhow::anyhow!("the gateway pipeline is malformed: {e}"))?;
            let mut value = serde_json::to_value(&plan)?;
            let mut written = Vec::new();
            if let Some(dir) = emit {
                written = emit_programs(&pipeline, plan.mask, dir)?;
                value["emitted"] = serde_json::json!(written);
            }
            out.line(value, || {
                let mut t = plan.human().trim_end().to_owned();
                for w in &written {
                    t.push_str(&format!("\nwrote {w}"));
                }
                t
            });
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Writes the NIC part (both handoffs), the host part and yard.h for the cut into `dir`.
fn emit_programs(
    pipeline: &yard_offload::plan::Pipeline,
    mask: u64,
    dir: &std::path::Path,
) -> anyhow::Result<Vec<String>> {
    use yard_offload::gen::{generate_with, FILES, YARD_H};
    std::fs::create_dir_all(dir).with_context(|| format!("could not create {}", dir.display()))?;
    let mut written = Vec::new();
    let mut files = Vec::new();
    for (name, role, handoff) in FILES {
        files.push((name, generate_with(pipeline, mask, role, handoff)?));
    }
    files.push(("yard.h", YARD_H.to_owned()));
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::write(&path, text)
            .with_context(|| format!("could not write {}", path.display()))?;
        written.push(path.display().to_string());
    }
    Ok(written)
}
