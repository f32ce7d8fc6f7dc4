//! Lazily resolved "next" definitions of interposed functions.
//!
//! A `Symbol` caches `dlsym(RTLD_NEXT, name)` in an `AtomicPtr`. Hooks can
//! run before our constructor (another library's constructor may call
//! `socket`), so resolution happens on first use, with no allocation of ours
//! and no call into any interposed function; the constructor then resolves
//! every symbol eagerly so that no later first call (say, from a signal
//! handler) has to enter the dynamic linker. Two threads racing to resolve
//! the same symbol store the same pointer; that race is harmless.

use std::cell::Cell;
use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

/// Marks a symbol that dlsym could not find: callers use their raw-syscall
/// fallback from then on. Never a valid function address.
const MISSING: *mut c_void = ptr::dangling_mut::<c_void>();

thread_local! {
    /// This thread is inside dlsym through `get_reentrant`.
    static RESOLVING: Cell<bool> = const { Cell::new(false) };
}

/// One interposed function's next definition.
pub struct Symbol {
    /// NUL-terminated name.
    name: &'static str,
    ptr: AtomicPtr<c_void>,
}

impl Symbol {
    /// `name` must end with a NUL byte (the `hooks!` macro appends it).
    pub const fn new(name: &'static str) -> Self {
        Symbol {
            name,
            ptr: AtomicPtr::new(ptr::null_mut()),
        }
    }

    /// The next definition's address, or None if there is none (the caller
    /// then falls back to the raw system call).
    #[inline]
    pub fn get(&self) -> Option<*mut c_void> {
        // Acquire pairs with the Release store below; on x86 it is a plain
        // load, so the cached path costs one mov.
        let p = self.ptr.load(Ordering::Acquire);
        if p.is_null() {
            return self.resolve();
        }
        (p != MISSING).then_some(p)
    }

    /// `get` for functions dlsym itself may call (the allocator's `free`,
    /// `realloc`): a lookup made while this thread is already inside dlsym
    /// for one of them returns None, uncached, instead of recursing.
    #[inline]
    // Only the memory hooks of the RDMA registration cache use it.
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub fn get_reentrant(&self) -> Option<*mut c_void> {
        let p = self.ptr.load(Ordering::Acquire);
        if !p.is_null() {
            return (p != MISSING).then_some(p);
        }
        if RESOLVING.with(|r| r.replace(true)) {
            return None;
        }
        let p = self.resolve();
        RESOLVING.with(|r| r.set(false));
        p
    }

    #[cold]
    fn resolve(&self) -> Option<*mut c_void> {
        debug_assert!(self.name.ends_with('\0'));
        // SAFETY: name is a NUL-terminated static string; RTLD_NEXT asks for
        // the next object after ours in the lookup order, i.e. libc.
        let p = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr().cast()) };
        if p.is_null() {
            let shown = self.name.trim_end_matches('\0');
            crate::log::always(format_args!(
                "cannot resolve the next definition of {shown}; using its fallback"
            ));
            self.ptr.store(MISSING, Ordering::Release);
            None
        } else {
            self.ptr.store(p, Ordering::Release);
            Some(p)
        }
    }
}
