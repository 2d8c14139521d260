//! BPF_PROG_TEST_RUN of a packet program (XDP or TC): unit tests and per-packet cost.
//!
//! aya 0.14's `TestRun` trait does the syscall. Two kernel facts shape the API: the input frame
//! is copied into one buffer that all `repeat` runs share (a program that rewrites the frame sees
//! its own output on the next run), and map writes persist. So [`Gateway::bench_run`]
//! measures whatever path the frame takes after each rewrite: callers must choose frames whose
//! rewritten form takes the same path again, or keep `repeat` small (see the xdp-paths bench).
//!
//! [`Gateway::bench_run`]: crate::Gateway::bench_run

use aya::programs::{TestRun, TestRunOptions, Xdp};
use aya::TestRunResult;

use crate::EbpfError;

/// The program's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpAction {
    Aborted,
    Drop,
    Pass,
    Tx,
    Redirect,
    /// A value outside `enum xdp_action`.
    Other(u32),
}

impl XdpAction {
    /// Decodes the program's return value.
    pub fn from_raw(raw: u32) -> Self {
        match raw {
            0 => XdpAction::Aborted,
            1 => XdpAction::Drop,
            2 => XdpAction::Pass,
            3 => XdpAction::Tx,
            4 => XdpAction::Redirect,
            other => XdpAction::Other(other),
        }
    }
}

/// The result of one test run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestOutcome {
    pub action: XdpAction,
    /// The frame as the program left it (what XDP_TX would send).
    pub frame: Vec<u8>,
}

/// The kernel's minimum test input (XDP and skb programs alike).
const ETH_HLEN: usize = 14;

/// Room for programs that grow the frame (none of ours does today).
const OUT_SLACK: usize = 256;

/// A program BPF_PROG_TEST_RUN can run on a frame (XDP, TC).
pub(crate) trait PacketProgram:
    for<'a> TestRun<Opts<'a> = TestRunOptions<'a>, Result = TestRunResult>
{
}

impl<P> PacketProgram for P where
    P: for<'a> TestRun<Opts<'a> = TestRunOptions<'a>, Result = TestRunResult>
{
}

/// One run of `prog` on `frame`: the program's raw return value and the frame as it left it.
pub(crate) fn run_raw<P: PacketProgram>(
    prog: &P,
    program: &'static str,
    frame: &[u8],
) -> Result<(u32, Vec<u8>), EbpfError> {
    run_raw_ctx(prog, program, frame, None)
}

/// [`run_raw`], with an XDP context giving the ingress interface (index in the calling
/// thread's network namespace): what `ctx->ingress_ifindex` reads and what helpers such as
/// `bpf_fib_lookup` see as the receiving device (by default the namespace's loopback).
fn run_raw_ctx<P: PacketProgram>(
    prog: &P,
    program: &'static str,
    frame: &[u8],
    ctx_in: Option<&[u8]>,
) -> Result<(u32, Vec<u8>), EbpfError> {
    if frame.len() < ETH_HLEN {
        return Err(EbpfError::FrameTooShort(frame.len()));
    }
    let mut out = vec![0u8; frame.len() + OUT_SLACK];
    let result = prog
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ctx_in,
            repeat: 1,
            ..TestRunOptions::default()
        })
        .map_err(|source| EbpfError::Program {
            action: "test-run",
            program,
            source,
        })?;
    out.truncate(usize::try_from(result.data_size_out).unwrap_or(usize::MAX));
    Ok((result.return_value, out))
}

pub(crate) fn run_once(
    prog: &Xdp,
    program: &'static str,
    frame: &[u8],
) -> Result<TestOutcome, EbpfError> {
    let (action, frame) = run_raw(prog, program, frame)?;
    Ok(TestOutcome {
        action: XdpAction::from_raw(action),
        frame,
    })
}

/// One run of an XDP program on `frame` received on interface `ingress_ifindex`.
pub(crate) fn run_once_on(
    prog: &Xdp,
    program: &'static str,
    frame: &[u8],
    ingress_ifindex: u32,
) -> Result<TestOutcome, EbpfError> {
    // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index,
    // egress_ifindex; the kernel wants data 0 and data_end the frame's length.
    let len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
    let ctx: Vec<u8> = [0, len, 0, ingress_ifindex, 0, 0]
        .iter()
        .flat_map(|v| v.to_ne_bytes())
        .collect();
    let (action, frame) = run_raw_ctx(prog, program, frame, Some(&ctx))?;
    Ok(TestOutcome {
        action: XdpAction::from_raw(action),
        frame,
    })
}

/// `repeat` runs of `prog` on `frame` in the kernel: the kernel-measured mean ns per run.
pub(crate) fn run_bench<P: PacketProgram>(
    prog: &P,
    program: &'static str,
    frame: &[u8],
    repeat: u32,
) -> Result<u64, EbpfError> {
    if frame.len() < ETH_HLEN {
        return Err(EbpfError::FrameTooShort(frame.len()));
    }
    let result = prog
        .test_run(TestRunOptions {
            data_in: Some(frame),
            repeat: repeat.max(1),
            ..TestRunOptions::default()
        })
        .map_err(|source| EbpfError::Program {
            action: "benchmark",
            program,
            source,
        })?;
    Ok(u64::try_from(result.duration.as_nanos()).unwrap_or(u64::MAX))
}

/// One BPF_PROG_TEST_RUN of a loaded XDP program this crate does not wrap (the offload
/// planner's generated NIC and host parts): its verdict and the frame as it left it.
pub fn run_xdp(prog: &Xdp, program: &'static str, frame: &[u8]) -> Result<TestOutcome, EbpfError> {
    run_once(prog, program, frame)
}

/// `repeat` kernel runs of such a program on `frame`: the kernel-measured mean ns per run.
pub fn bench_xdp(
    prog: &Xdp,
    program: &'static str,
    frame: &[u8],
    repeat: u32,
) -> Result<u64, EbpfError> {
    run_bench(prog, program, frame, repeat)
}
