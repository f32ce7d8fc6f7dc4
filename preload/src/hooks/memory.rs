//! Memory hooks for zero-copy sends (feature `verbs`): every call that can
//! change which pages an address range maps to drops the cached
//! registrations over that range (`ringsock_ring::transport::verbs::regcache`),
//! before the change. A registration pins the pages mapped when it was
//! made; after munmap + mmap (or free + malloc of a large chunk, or
//! MADV_DONTNEED) the same addresses get new pages, and a send from the
//! stale registration would carry the old bytes.
//!
//! Hooked: munmap, mremap (old range, and the new one with MREMAP_FIXED),
//! madvise (every advice but the few that never drop or replace pages),
//! mmap/mmap64 with MAP_FIXED, brk/sbrk when the break goes down, shmdt
//! (all entries: the segment's size is not known here), and free, realloc,
//! reallocarray: glibc unmaps large chunks (and shrinks heaps) internally,
//! where no hook can see it, so a chunk's whole usable range is dropped
//! before the allocator gets it back. What stays unseen (raw syscalls,
//! another allocator's internal calls) is why zero-copy is opt-in
//! (docs/limits.md, "Zero-copy sends").
//!
//! Cost while no registration is cached (always, unless zero-copy is on
//! and was used): one relaxed atomic load per call.
//!
//! `mremap` is variadic in C (the new address is passed only with
//! MREMAP_FIXED); it is defined with the fifth argument fixed, sound on the
//! x86-64 and AArch64 Linux ABIs for the reasons `hooks/fd.rs` gives for
//! fcntl: the argument travels in the register a fixed fifth argument
//! would, and is only forwarded or read under MREMAP_FIXED.
//!
//! free/realloc/reallocarray are written out by hand instead of with
//! `hooks!`: they run before the library is initialized and inside
//! dlsym, which may itself free. Their next definitions are resolved with
//! a per-thread guard: a free that arrives while this thread resolves is
//! leaked (once, at start-up) rather than recursing.

use std::ffi::c_void;

use libc::{c_int, intptr_t, off_t, size_t};
use ringsock_ring::transport::verbs::regcache;

use super::define::hooks;
use crate::interpose::Symbol;

#[inline]
fn drop_range(addr: *const c_void, len: usize) {
    regcache::invalidate(addr as usize, len);
}

/// Whether `advice` can drop, replace or move the pages of a range (then
/// the cached registrations over it go). Unknown advice counts as yes.
fn advice_changes_pages(advice: c_int) -> bool {
    !matches!(
        advice,
        libc::MADV_NORMAL
            | libc::MADV_RANDOM
            | libc::MADV_SEQUENTIAL
            | libc::MADV_WILLNEED
            | libc::MADV_DONTDUMP
            | libc::MADV_DODUMP
    )
}

hooks! {
    /// munmap(2).
    fn munmap(addr: *mut c_void, len: size_t) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_munmap, addr, len) as c_int)
    |next| {
        drop_range(addr, len);
        next()
    }

    /// mremap(2); the fifth argument is read only with MREMAP_FIXED.
    fn mremap(old: *mut c_void, old_len: size_t, new_len: size_t, flags: c_int, new_addr: *mut c_void) -> *mut c_void;
        fallback(crate::sys::sys_call!(libc::SYS_mremap, old, old_len, new_len, flags, new_addr) as *mut c_void)
    |next| {
        drop_range(old, old_len);
        if flags & libc::MREMAP_FIXED != 0 {
            drop_range(new_addr, new_len);
        }
        next()
    }

    /// madvise(2).
    fn madvise(addr: *mut c_void, len: size_t, advice: c_int) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_madvise, addr, len, advice) as c_int)
    |next| {
        if advice_changes_pages(advice) {
            drop_range(addr, len);
        }
        next()
    }

    /// mmap(2): MAP_FIXED replaces whatever was mapped there.
    fn mmap(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void;
        fallback(crate::sys::sys_call!(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void)
    |next| {
        if flags & libc::MAP_FIXED != 0 {
            drop_range(addr, len);
        }
        next()
    }

    /// mmap64 (the same function under glibc's LFS name).
    fn mmap64(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void;
        fallback(crate::sys::sys_call!(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void)
    |next| {
        if flags & libc::MAP_FIXED != 0 {
            drop_range(addr, len);
        }
        next()
    }

    /// brk(2): a lower break unmaps the heap above it.
    fn brk(addr: *mut c_void) -> c_int;
        fallback(if crate::sys::sys_call!(libc::SYS_brk, addr) as usize == addr as usize { 0 } else { -1 })
    |next| {
        if regcache::entries() > 0 {
            // SAFETY: sbrk(0) only reads the current break.
            let cur = unsafe { sbrk::next(0) } as usize;
            if (addr as usize) < cur && cur != usize::MAX {
                drop_range(addr, cur - addr as usize);
            }
        }
        next()
    }

    /// sbrk(3): a negative increment unmaps the top of the heap.
    fn sbrk(incr: intptr_t) -> *mut c_void;
        fallback(usize::MAX as *mut c_void)
    |next| {
        if incr < 0 && regcache::entries() > 0 {
            // SAFETY: sbrk(0) only reads the current break.
            let cur = unsafe { sbrk::next(0) } as usize;
            if cur != usize::MAX {
                let down = incr.unsigned_abs();
                drop_range(cur.saturating_sub(down) as *const c_void, down);
            }
        }
        next()
    }

    /// shmdt(2): the segment's size is not known here, so every cached
    /// registration goes (shmdt is rare).
    fn shmdt(addr: *const c_void) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_shmdt, addr) as c_int)
    |next| {
        if regcache::entries() > 0 {
            regcache::invalidate_all();
        }
        next()
    }
}

// Resolved with `get_reentrant` (see the module documentation).
static FREE: Symbol = Symbol::new("free\0");
static REALLOC: Symbol = Symbol::new("realloc\0");
static REALLOCARRAY: Symbol = Symbol::new("reallocarray\0");

/// Drops the registrations over a heap chunk before the allocator gets it
/// back (glibc may unmap it or give its pages back internally).
#[inline]
fn drop_chunk(p: *mut c_void) {
    // A sandboxed process uses no ring any more: what stays registered is
    // never sent from, and deregistering would make system calls.
    if !p.is_null() && regcache::entries() > 0 && !crate::process::sandboxed() {
        // SAFETY: p is a live chunk of the malloc whose free/realloc is
        // being called (the caller's contract).
        let n = unsafe { libc::malloc_usable_size(p) };
        drop_range(p, n);
    }
}

/// free(3).
///
/// # Safety
/// Called by C code with free's contract.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    drop_chunk(p);
    if let Some(f) = FREE.get_reentrant() {
        // SAFETY: dlsym's address for "free", whose prototype this is.
        let f: unsafe extern "C" fn(*mut c_void) = unsafe { std::mem::transmute(f) };
        // SAFETY: our C caller's pointer, unchanged, under free's contract
        // (drop_chunk only read its usable size).
        unsafe { f(p) }
    }
}

/// realloc(3).
///
/// # Safety
/// Called by C code with realloc's contract.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, n: size_t) -> *mut c_void {
    drop_chunk(p);
    match REALLOC.get_reentrant() {
        Some(f) => {
            // SAFETY: dlsym's address for "realloc", whose prototype this is.
            let f: unsafe extern "C" fn(*mut c_void, size_t) -> *mut c_void =
                unsafe { std::mem::transmute(f) };
            // SAFETY: our C caller's arguments, unchanged, under realloc's
            // contract.
            unsafe { f(p, n) }
        }
        None => {
            crate::sys::set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

/// reallocarray(3) (glibc's calls its internal realloc, past our hook).
///
/// # Safety
/// Called by C code with reallocarray's contract.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, m: size_t, n: size_t) -> *mut c_void {
    drop_chunk(p);
    match REALLOCARRAY.get_reentrant() {
        Some(f) => {
            // SAFETY: dlsym's address for "reallocarray", whose prototype
            // this is.
            let f: unsafe extern "C" fn(*mut c_void, size_t, size_t) -> *mut c_void =
                unsafe { std::mem::transmute(f) };
            // SAFETY: our C caller's arguments, unchanged, under
            // reallocarray's contract.
            unsafe { f(p, m, n) }
        }
        None => {
            crate::sys::set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

/// Resolves the allocator functions' next definitions (the constructor).
pub fn resolve_allocators() {
    let _ = (
        FREE.get_reentrant(),
        REALLOC.get_reentrant(),
        REALLOCARRAY.get_reentrant(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn harmless_advice_keeps_registrations() {
        for a in [libc::MADV_NORMAL, libc::MADV_WILLNEED, libc::MADV_DONTDUMP] {
            assert!(!advice_changes_pages(a), "{a}");
        }
        for a in [
            libc::MADV_DONTNEED,
            libc::MADV_FREE,
            libc::MADV_REMOVE,
            libc::MADV_HUGEPAGE,
            libc::MADV_MERGEABLE,
            libc::MADV_PAGEOUT,
            libc::MADV_COLD,
            libc::MADV_WIPEONFORK,
            libc::MADV_DONTFORK,
            12345,
        ] {
            assert!(advice_changes_pages(a), "{a}");
        }
    }
}
