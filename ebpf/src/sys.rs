//! What aya 0.14 does not wrap: two bpf(2) commands, opening a pinned object as a plain fd and
//! BPF_LINK_DETACH, used by [`crate::Gateway::remove_pinned`] so that a decommission detaches
//! the program at once even while another holder (a still-running daemon) keeps the link open;
//! and an interface's index by name.

// There is no safe wrapper for these commands in aya 0.14 or rustix; every unsafe block below
// says why it is sound.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

const BPF_OBJ_GET: libc::c_long = 7;
const BPF_LINK_DETACH: libc::c_long = 34;

/// `union bpf_attr` as BPF_OBJ_GET reads it.
#[repr(C)]
#[derive(Default)]
struct ObjGetAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
    path_fd: i32,
    _pad: u32,
}

/// `union bpf_attr` as BPF_LINK_DETACH reads it.
#[repr(C)]
#[derive(Default)]
struct LinkDetachAttr {
    link_fd: u32,
    _pad: u32,
}

fn bpf<T>(cmd: libc::c_long, attr: &T) -> io::Result<libc::c_long> {
    let size = std::mem::size_of::<T>() as libc::c_long;
    // SAFETY: `attr` is a live, initialised #[repr(C)] prefix of `union bpf_attr` of `size`
    // bytes; the kernel only reads it (for these commands) and reads no more than `size`.
    let ret = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *const T, size) };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Opens the object pinned at `path` (any type).
pub(crate) fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let attr = ObjGetAttr {
        pathname: c_path.as_ptr() as u64,
        ..ObjGetAttr::default()
    };
    let fd = bpf(BPF_OBJ_GET, &attr)?;
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("fd out of range"))?;
    // SAFETY: BPF_OBJ_GET returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Detaches the link behind `fd` now, whoever else holds it; the link object lives on (defunct)
/// until its last fd or pin goes.
pub(crate) fn link_detach(fd: &OwnedFd) -> io::Result<()> {
    let attr = LinkDetachAttr {
        link_fd: u32::try_from(fd.as_raw_fd()).map_err(|_| io::Error::other("negative fd"))?,
        ..LinkDetachAttr::default()
    };
    bpf(BPF_LINK_DETACH, &attr).map(|_| ())
}

/// The index of interface `iface` in the calling thread's network namespace, if it exists.
pub(crate) fn ifindex(iface: &str) -> Option<u32> {
    let name = std::ffi::CString::new(iface).ok()?;
    // SAFETY: a valid NUL-terminated string that the call only reads.
    match unsafe { libc::if_nametoindex(name.as_ptr()) } {
        0 => None,
        i => Some(i),
    }
}
