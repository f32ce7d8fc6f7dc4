//! The memfd behind the offer table the daemon shares with its processes
//! (`ringsock_proto::offers`): made once at start, mapped writable here,
//! then sealed so that every descriptor handed out can only be mapped
//! read-only (F_SEAL_FUTURE_WRITE keeps this mapping writable).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::AtomicU64;

use ringsock_proto::offers::{self, Table};

pub struct OfferTableFd {
    fd: OwnedFd,
}

impl OfferTableFd {
    /// Creates the memfd and the table in it; the mapping lives as long as
    /// the daemon.
    pub fn create() -> io::Result<(OfferTableFd, Table<'static>)> {
        // SAFETY: a NUL-terminated literal name; the result is checked.
        let raw = unsafe {
            libc::memfd_create(
                c"ringsock-offers".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: memfd_create just returned this descriptor to us alone.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on our own descriptor, integer arguments.
        if unsafe { libc::ftruncate(raw, offers::BYTES as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a shared read-write mapping of the whole file we own, no
        // address hint; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                offers::BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                raw,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let seals =
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL;
        // SAFETY: fcntl with integer arguments on our descriptor.
        if unsafe { libc::fcntl(raw, libc::F_ADD_SEALS, seals) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the mapping is BYTES long, page-aligned, zero-filled (a
        // valid array of AtomicU64), and never unmapped: the daemon holds
        // the table until it exits.
        let words: &'static [AtomicU64] =
            unsafe { std::slice::from_raw_parts(p.cast::<AtomicU64>(), offers::WORDS) };
        let table = Table::new(words).expect("WORDS words");
        table.init();
        Ok((OfferTableFd { fd }, table))
    }

    /// A descriptor of the table for a process (read-only mappings only).
    pub fn share(&self) -> Option<OwnedFd> {
        // SAFETY: dup of our own descriptor; the result is checked.
        let raw = unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        // SAFETY: a fresh descriptor owned by nobody else.
        (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw) })
    }
}
