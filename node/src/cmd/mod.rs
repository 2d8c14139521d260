//! The binary's commands: argument parsing, the daemon's process wiring, the CLI's output and
//! the benchmark. Errors here are `anyhow`; each ends the process with one sentence on stderr.

mod agg;
mod bench;
mod ca_rotate;
mod cli;
mod daemon;
mod diagnose;
mod gateway;
mod offload;
mod output;
mod plan;
mod sim;
mod snapshot;

use std::process::ExitCode;

use clap::Parser;

pub fn main() -> ExitCode {
    let args = cli::Args::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", one_sentence(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error chain as one sentence: `outer: inner: root`.
fn one_sentence(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
    }
    parts.join(": ")
}
