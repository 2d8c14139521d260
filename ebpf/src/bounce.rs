//! `yard_bounce`: the per-packet cost floor.

use aya::programs::Xdp;
use aya::{Ebpf, EbpfLoader};

use crate::test_run::{run_bench, run_once};
use crate::{EbpfError, TestOutcome};

const OBJECT: &str = "bounce.bpf.o";
const PROGRAM: &str = "yard_bounce";

static BYTES: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/bounce.bpf.o"));

/// The bounce program: swaps the Ethernet addresses and returns XDP_TX. Nothing forwards for
/// less, so benchmarks report every other program as a ratio against it, measured in the same
/// run on the same (noisy, shared) machine.
pub struct Bounce {
    ebpf: Ebpf,
}

impl std::fmt::Debug for Bounce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bounce").finish_non_exhaustive()
    }
}

impl Bounce {
    /// Loads the program into the kernel (no attachment).
    pub fn load() -> Result<Self, EbpfError> {
        let mut ebpf = crate::program::load_object(&mut EbpfLoader::new(), BYTES, OBJECT)?;
        xdp_mut(&mut ebpf)?
            .load()
            .map_err(|source| EbpfError::Program {
                action: "load",
                program: PROGRAM,
                source,
            })?;
        Ok(Self { ebpf })
    }

    /// One BPF_PROG_TEST_RUN on `frame`: the action and the output frame.
    pub fn test_run(&self, frame: &[u8]) -> Result<TestOutcome, EbpfError> {
        run_once(self.xdp()?, PROGRAM, frame)
    }

    /// `repeat` runs in the kernel; the kernel-measured mean ns per run. The bounce is its own
    /// inverse every second run, so any `repeat` measures the same path.
    pub fn bench_run(&self, frame: &[u8], repeat: u32) -> Result<u64, EbpfError> {
        run_bench(self.xdp()?, PROGRAM, frame, repeat)
    }

    fn xdp(&self) -> Result<&Xdp, EbpfError> {
        crate::program::xdp(&self.ebpf, PROGRAM)
    }
}

fn xdp_mut(ebpf: &mut Ebpf) -> Result<&mut Xdp, EbpfError> {
    crate::program::xdp_mut(ebpf, PROGRAM)
}
