//! The TC-BPF random-loss program, with its drop threshold patched in per use.

use object::{Object, ObjectSection, ObjectSymbol};

use crate::error::{Error, Result};

/// `bpf/loss.bpf.c` compiled by build.rs.
static LOSS_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/loss.bpf.o"));

/// The section (tc `sec`) holding the program.
pub(crate) const LOSS_SECTION: &str = "tc";

/// The .rodata variable the program compares each random draw with.
const THRESHOLD_SYMBOL: &str = "drop_below";

/// Maps a loss percentage to the program's threshold: a packet is dropped when a uniform u32
/// draw is below it, so 2^32 drops everything and 0 nothing.
pub(crate) fn threshold(percent: f64) -> Result<u64> {
    if !(0.0..=100.0).contains(&percent) {
        return Err(Error::BadPercent { percent });
    }
    // In range by the check above, so the cast neither saturates nor truncates.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok((percent / 100.0 * 4_294_967_296.0).round() as u64)
}

/// A copy of the loss object whose threshold drops `percent` percent of packets.
///
/// libbpf (which `tc` uses to load it) creates the program's .rodata map from the section's
/// bytes in the file, so patching the file is the whole configuration: no map update, no
/// bpftool, no pinning.
pub(crate) fn object_with_loss(percent: f64) -> Result<Vec<u8>> {
    let value = threshold(percent)?;
    let offset = threshold_offset(LOSS_OBJECT)?;
    let mut bytes = LOSS_OBJECT.to_vec();
    bytes[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
    Ok(bytes)
}

/// Finds the file offset of `drop_below`'s 8 bytes.
fn threshold_offset(data: &[u8]) -> Result<usize> {
    let file = object::File::parse(data).map_err(|e| Error::LossObject(e.to_string()))?;
    if !file.is_little_endian() {
        return Err(Error::LossObject("it is not little-endian".into()));
    }
    let symbol = file
        .symbols()
        .find(|s| s.name() == Ok(THRESHOLD_SYMBOL))
        .ok_or_else(|| Error::LossObject(format!("it has no symbol `{THRESHOLD_SYMBOL}`")))?;
    if symbol.size() != 8 {
        return Err(Error::LossObject(format!(
            "`{THRESHOLD_SYMBOL}` is {} bytes, not 8",
            symbol.size()
        )));
    }
    let index = symbol
        .section_index()
        .ok_or_else(|| Error::LossObject(format!("`{THRESHOLD_SYMBOL}` has no section")))?;
    let section = file
        .section_by_index(index)
        .map_err(|e| Error::LossObject(e.to_string()))?;
    if section.name() != Ok(".rodata") {
        return Err(Error::LossObject(format!(
            "`{THRESHOLD_SYMBOL}` is not in .rodata"
        )));
    }
    let (start, size) = section
        .file_range()
        .ok_or_else(|| Error::LossObject(".rodata has no file contents".into()))?;
    // In a relocatable object a symbol's address is its offset in its section.
    let at = symbol.address();
    if at + 8 > size {
        return Err(Error::LossObject(format!(
            "`{THRESHOLD_SYMBOL}` lies outside .rodata"
        )));
    }
    usize::try_from(start + at)
        .map_err(|_| Error::LossObject("offset does not fit in memory".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_cover_the_u32_range() {
        assert_eq!(threshold(0.0).unwrap(), 0);
        assert_eq!(threshold(100.0).unwrap(), 1 << 32);
        assert_eq!(threshold(50.0).unwrap(), 1 << 31);
        assert!(threshold(-1.0).is_err());
        assert!(threshold(100.5).is_err());
        assert!(threshold(f64::NAN).is_err());
    }

    #[test]
    fn patches_only_the_threshold() {
        let patched = object_with_loss(25.0).unwrap();
        let offset = threshold_offset(LOSS_OBJECT).unwrap();
        assert_eq!(LOSS_OBJECT[offset..offset + 8], [0; 8]);
        assert_eq!(
            u64::from_le_bytes(patched[offset..offset + 8].try_into().unwrap()),
            1 << 30
        );
        let changed = patched
            .iter()
            .zip(LOSS_OBJECT)
            .filter(|(a, b)| a != b)
            .count();
        assert_eq!(changed, 1, "25% is 0x4000_0000: one byte differs");
    }
}
