//! Finding a loaded object's program by name and type: one place for every object.

use aya::programs::{Program, SchedClassifier, Xdp};
use aya::{Ebpf, EbpfLoader};

use crate::EbpfError;

/// A program type this crate loads, with the name its errors use.
pub(crate) trait Kind {
    const KIND: &'static str;
}

impl Kind for Xdp {
    const KIND: &'static str = "XDP program";
}

impl Kind for SchedClassifier {
    const KIND: &'static str = "TC program";
}

/// Loads the embedded object `object` (its bytes) with `loader`, naming it in the error.
pub(crate) fn load_object(
    loader: &mut EbpfLoader,
    bytes: &[u8],
    object: &'static str,
) -> Result<Ebpf, EbpfError> {
    loader
        .load(bytes)
        .map_err(|source| EbpfError::Load { object, source })
}

fn missing<T: Kind>(name: &'static str) -> EbpfError {
    EbpfError::Missing {
        kind: T::KIND,
        name,
    }
}

/// The program `name` of `ebpf` as a `T`.
pub(crate) fn get<'a, T>(ebpf: &'a Ebpf, name: &'static str) -> Result<&'a T, EbpfError>
where
    T: Kind + 'a,
    &'a T: TryFrom<&'a Program>,
{
    ebpf.program(name)
        .and_then(|p| <&T>::try_from(p).ok())
        .ok_or_else(|| missing::<T>(name))
}

/// The program `name` of `ebpf` as a mutable `T`.
pub(crate) fn get_mut<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, EbpfError>
where
    T: Kind + 'a,
    &'a mut T: TryFrom<&'a mut Program>,
{
    ebpf.program_mut(name)
        .and_then(|p| <&mut T>::try_from(p).ok())
        .ok_or_else(|| missing::<T>(name))
}

pub(crate) fn xdp<'a>(ebpf: &'a Ebpf, name: &'static str) -> Result<&'a Xdp, EbpfError> {
    get(ebpf, name)
}

pub(crate) fn xdp_mut<'a>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<&'a mut Xdp, EbpfError> {
    get_mut(ebpf, name)
}

/// Kernel run statistics of the XDP program `name` of `ebpf`: total run time and run count,
/// which the kernel counts only while `kernel.bpf_stats_enabled` is 1.
pub(crate) fn run_stats(
    ebpf: &Ebpf,
    name: &'static str,
) -> Result<(std::time::Duration, u64), EbpfError> {
    let info = xdp(ebpf, name)?
        .info()
        .map_err(|source| EbpfError::Program {
            action: "inspect",
            program: name,
            source,
        })?;
    Ok((info.run_time(), info.run_count()))
}
