//! Finding a loaded object's XDP program by name: one place for both objects.

use aya::programs::Xdp;
use aya::Ebpf;

use crate::EbpfError;

fn missing(name: &'static str) -> EbpfError {
    EbpfError::Missing {
        kind: "XDP program",
        name,
    }
}

pub(crate) fn xdp<'a>(ebpf: &'a Ebpf, name: &'static str) -> Result<&'a Xdp, EbpfError> {
    ebpf.program(name)
        .and_then(|p| <&Xdp>::try_from(p).ok())
        .ok_or(missing(name))
}

pub(crate) fn xdp_mut<'a>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<&'a mut Xdp, EbpfError> {
    ebpf.program_mut(name)
        .and_then(|p| <&mut Xdp>::try_from(p).ok())
        .ok_or(missing(name))
}
