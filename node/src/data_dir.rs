//! The node's data directory: the Raft database, its certificates and keys, the gateway's
//! state. It holds secrets, so it is the daemon's alone (0700) whatever the umask, and the
//! files under it (sled's among them, which sled creates with the umask's mode) are out of
//! other users' reach through it.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

/// What preparing the data directory did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prepared {
    Created,
    /// It existed and was already private.
    Private,
    /// It existed with these permission bits open to others and was narrowed to 0700.
    Narrowed {
        was: u32,
    },
}

/// Creates `dir` (and missing parents) with mode 0700, or narrows an existing one that
/// others may enter or read to 0700; the caller warns about a narrowed one.
pub fn prepare(dir: &Path) -> std::io::Result<Prepared> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        // The mode is given at creation, masked by the umask; set it again in case the
        // umask took owner bits away.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        return Ok(Prepared::Created);
    }
    let mode = std::fs::metadata(dir)?.permissions().mode() & 0o7777;
    if mode & 0o077 == 0 {
        return Ok(Prepared::Private);
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    Ok(Prepared::Narrowed { was: mode })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    /// Issue 25: the data directory was 0755 (and the Raft database under it 0644).
    #[test]
    fn the_data_dir_is_0700_when_created_and_narrowed_when_open() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/yard");
        assert_eq!(prepare(&dir).unwrap(), Prepared::Created);
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(prepare(&dir).unwrap(), Prepared::Private);

        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(prepare(&dir).unwrap(), Prepared::Narrowed { was: 0o755 });
        assert_eq!(mode(&dir), 0o700);
    }
}
