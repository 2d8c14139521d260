//! Map helpers shared by every loader: taking a typed map out of a loaded object, naming a map
//! error, recognising "no such entry", and summing a per-CPU packet/byte counter.

use aya::maps::{MapData, MapError, PerCpuArray};
use aya::Ebpf;

use crate::layout::GwCounter;
use crate::{CounterValue, EbpfError};

/// Wraps a map error with what was being done to which map.
pub(crate) fn map_err(
    action: &'static str,
    map: &'static str,
) -> impl FnOnce(MapError) -> EbpfError {
    move |source| EbpfError::Map {
        action,
        map,
        source,
    }
}

/// Whether `e` is the kernel saying "no such entry" (a delete of an absent key).
pub(crate) fn is_enoent(e: &MapError) -> bool {
    matches!(e, MapError::KeyNotFound | MapError::ElementNotFound)
        || matches!(e, MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(libc::ENOENT))
}

/// Takes the map `name` out of `ebpf` as a `T`.
pub(crate) fn take<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, EbpfError>
where
    T: TryFrom<aya::maps::Map, Error = MapError>,
{
    let map = ebpf
        .take_map(name)
        .ok_or(EbpfError::Missing { kind: "map", name })?;
    T::try_from(map).map_err(map_err("open", name))
}

/// Entry `index` of a per-CPU counter array, summed over CPUs (wrapping, as the kernel's u64s
/// do).
pub(crate) fn read_counter(
    map: &PerCpuArray<MapData, GwCounter>,
    name: &'static str,
    index: u32,
) -> Result<CounterValue, EbpfError> {
    let per_cpu = map.get(&index, 0).map_err(map_err("read", name))?;
    let mut sum = CounterValue::default();
    for v in per_cpu.iter() {
        sum.packets = sum.packets.wrapping_add(v.packets);
        sum.bytes = sum.bytes.wrapping_add(v.bytes);
    }
    Ok(sum)
}
