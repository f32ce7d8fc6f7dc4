//! The memory of a connection end: the sealed memfd it maps, where the two
//! ring copies, the header page and the staging words lie in it, and what
//! is read from the header page.

use super::super::device::Device;
use super::super::stats::{
    VerbsHeader, VERBS_FLAG_HUGE, VERBS_HEADER_PAGE, VERBS_MAGIC, VERBS_VERSION,
};
use super::super::{fdplace, stats};
use crate::config::RingConfig;
use crate::error::RingError;
use crate::layout::CONTROL_BYTES;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::{Layout, Region, Shared, HUGE, PAGE};

impl Region {
    pub(super) fn new(len: usize) -> Result<Region, RingError> {
        if let Ok(r) = Region::memfd(len.div_ceil(HUGE) * HUGE, true) {
            return Ok(r);
        }
        Region::memfd(len.div_ceil(PAGE) * PAGE, false)
    }

    /// memfd of `len` bytes, sealed against shrinking and growing, mapped
    /// shared. Every failure path closes what it opened (the fd by
    /// `OwnedFd`, the mapping is the last step).
    fn memfd(len: usize, huge: bool) -> Result<Region, RingError> {
        let mut flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
        if huge {
            flags |= libc::MFD_HUGETLB;
        }
        // SAFETY: the name is a NUL-terminated literal the kernel only
        // reads; a failure is a negative return, handled below.
        let raw = unsafe { libc::memfd_create(c"ringsock-verbs".as_ptr(), flags) };
        if raw < 0 {
            return Err(RingError::last_os());
        }
        // SAFETY: `raw` is the descriptor memfd_create just returned
        // (non-negative), owned by nothing else yet.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let fd = fdplace::place_owned(fd);
        let raw = fd.as_raw_fd();
        // SAFETY: ftruncate of the descriptor `fd` owns, integer arguments.
        if unsafe { libc::ftruncate(raw, len as libc::off_t) } != 0 {
            return Err(RingError::last_os());
        }
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
        // SAFETY: F_ADD_SEALS on the same descriptor, integer arguments.
        if unsafe { libc::fcntl(raw, libc::F_ADD_SEALS, seals) } != 0 {
            return Err(RingError::last_os());
        }
        // SAFETY: shared mapping of the whole (sealed) file, no address
        // hint. On hugetlbfs the mapping reserves the huge pages, so it is
        // what fails when there are no free ones.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                raw,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(RingError::last_os());
        }
        Ok(Region {
            base: p.cast(),
            len,
            huge,
            fd,
        })
    }

    pub(super) fn addr(&self, off: usize) -> u64 {
        self.base as u64 + off as u64
    }

    /// The header page (written once in `VerbsConn::new`, before anything
    /// else can see the region).
    pub(super) fn header(&self) -> &VerbsHeader {
        // SAFETY: the region starts with a page-aligned header page, at
        // least size_of::<VerbsHeader>() long; zero bytes are a valid
        // VerbsHeader (plain integers and atomics); only atomics in it
        // change after `init_header`.
        unsafe { &*self.base.cast::<VerbsHeader>() }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: mapped in `memfd` with this length; the memory region
        // that registered it is deregistered before (Shared holds an Arc).
        // The fd closes after (OwnedFd).
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

impl Layout {
    pub(super) fn new(out: &RingConfig, inn: &RingConfig) -> Layout {
        let out_bytes = out.ring_bytes() as usize;
        let in_bytes = inn.ring_bytes() as usize;
        let out_ctrl = VERBS_HEADER_PAGE;
        let out_slots = out_ctrl + CONTROL_BYTES;
        let in_ctrl = out_slots + out_bytes.div_ceil(PAGE) * PAGE;
        let in_slots = in_ctrl + CONTROL_BYTES;
        let staging = in_slots + in_bytes.div_ceil(PAGE) * PAGE;
        Layout {
            out_ctrl,
            out_slots,
            out_bytes,
            in_ctrl,
            in_slots,
            in_bytes,
            staging,
            total: staging + PAGE,
        }
    }
}

/// Writes the header page of a fresh region: nothing else has seen the
/// region yet (the memfd is shared and registered only afterwards).
pub(super) fn init_header(
    region: &Region,
    l: &Layout,
    out: &RingConfig,
    inn: &RingConfig,
    dev: &Device,
) {
    let mut device = [0u8; 16];
    let name = dev.name().as_bytes();
    let n = name.len().min(device.len());
    device[..n].copy_from_slice(&name[..n]);
    let h = VerbsHeader {
        magic: VERBS_MAGIC,
        version: VERBS_VERSION,
        header_len: std::mem::size_of::<VerbsHeader>() as u32,
        region_len: region.len as u64,
        out_ctrl: l.out_ctrl as u64,
        out_slots: l.out_slots as u64,
        in_ctrl: l.in_ctrl as u64,
        in_slots: l.in_slots as u64,
        out_slot_count: out.slots,
        out_slot_size: out.slot_size,
        in_slot_count: inn.slots,
        in_slot_size: inn.slot_size,
        device,
        port: u32::from(dev.port),
        gid_index: u32::from(dev.gid_index),
        flags: if region.huge { VERBS_FLAG_HUGE } else { 0 },
        sq: Default::default(),
        rq: Default::default(),
        user: Default::default(),
    };
    // SAFETY: the header page is mapped, writable, page-aligned and not
    // referenced by anyone yet.
    unsafe { std::ptr::write(region.base.cast::<VerbsHeader>(), h) };
}

impl Shared {
    pub(super) fn share_fd(&self) -> Result<OwnedFd, RingError> {
        self.region
            .fd
            .try_clone()
            .map_err(|e| RingError::Os(e.raw_os_error().unwrap_or(libc::EIO)))
    }

    pub(super) fn counters(&self) -> &stats::SqCounters {
        &self.region.header().sq
    }

    pub(super) fn rq_counters(&self) -> &stats::RqCounters {
        &self.region.header().rq
    }
}
