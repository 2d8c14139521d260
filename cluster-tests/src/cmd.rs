//! Running the short setup commands (ip, tc, nft, ethtool) the harness is built from.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{io_err, Error, Result};

/// Setup commands get this long: they normally take milliseconds, and a hung one must not hang
/// the test.
pub(crate) const SETUP_TIMEOUT: Duration = Duration::from_secs(20);

/// Renders a command line for error messages.
pub(crate) fn describe(program: &OsStr, args: &[&OsStr]) -> String {
    let mut s = program.to_string_lossy().into_owned();
    for a in args {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `program args` with optional stdin, returns its output whatever its exit status, and
/// kills it after `timeout`.
///
/// Reading stdout and stderr on their own threads keeps a chatty command from filling a pipe and
/// blocking while we wait for it.
pub(crate) fn output(
    program: &OsStr,
    args: &[&OsStr],
    envs: &[(&str, &str)],
    stdin: Option<&str>,
    timeout: Duration,
) -> Result<Output> {
    let command = describe(program, args);
    let mut child = Command::new(program)
        .args(args)
        .envs(envs.iter().copied())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io_err(format!("start `{command}`")))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .map_err(io_err(format!("write the input of `{command}`")))?;
    }
    let out = child.stdout.take().map(drain);
    let err = child.stderr.take().map(drain);
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Timeout { command, timeout });
            }
            Ok(None) => thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(io_err(format!("wait for `{command}`"))(e)),
        }
    };
    let collect = |h: Option<thread::JoinHandle<Vec<u8>>>| {
        h.map(|h| h.join().unwrap_or_default()).unwrap_or_default()
    };
    Ok(Output {
        status,
        stdout: collect(out),
        stderr: collect(err),
    })
}

/// Reads a pipe to its end on a thread of its own.
fn drain(mut pipe: impl Read + Send + 'static) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        buf
    })
}

/// Runs a setup command and turns a non-zero exit into [`Error::Command`].
pub(crate) fn run<S: AsRef<OsStr>>(program: &str, args: &[S]) -> Result<Output> {
    run_with_stdin(program, args, None)
}

/// Like [`run`], feeding `stdin` to the command (for `nft -f -`).
pub(crate) fn run_with_stdin<S: AsRef<OsStr>>(
    program: &str,
    args: &[S],
    stdin: Option<&str>,
) -> Result<Output> {
    let args: Vec<&OsStr> = args.iter().map(AsRef::as_ref).collect();
    let out = output(OsStr::new(program), &args, &[], stdin, SETUP_TIMEOUT)?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(Error::Command {
            command: describe(OsStr::new(program), &args),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}
