//! Whose call is this: the program's, or the shim's own?
//!
//! The shim closes and duplicates its own descriptors through libc's
//! functions too (Rust's `OwnedFd`, the ring crate, rdma-core's
//! `ibv_close_device`), and those calls reach our hooks like the program's.
//! A few hooks must tell them apart (hooks/fd.rs hides the shim's
//! descriptors from the program only), and the thread-local `guard` does
//! not cover every such call (a drop outside a shim scope). The caller's
//! return address does: a naked stub passes it on, and it lies in the text
//! of libringsock.so or of libibverbs (which closes the device descriptors
//! the transport placed for us) exactly when the shim made the call.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};

/// Executable ranges `[start, end)` of the shim's objects, appended to
/// (never changed) and published by `COUNT`.
const MAX_RANGES: usize = 32;
static RANGES: [(AtomicUsize, AtomicUsize); MAX_RANGES] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; MAX_RANGES];
static COUNT: AtomicUsize = AtomicUsize::new(0);

const UNKNOWN: u8 = 0;
const KNOWN: u8 = 1;
const FAILED: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);

/// Objects whose calls are the shim's besides libringsock.so itself:
/// rdma-core's libibverbs and its providers (dlopened as
/// `lib<name>-rdmav<N>.so`, or linked as `libmlx5.so` and the like), which
/// use and close the device descriptors the transport placed for us.
const HELPERS: &[&[u8]] = &[
    b"libibverbs.so",
    b"-rdmav",
    b"libmlx4.so",
    b"libmlx5.so",
    b"libefa.so",
    b"libhns.so",
    b"libmana.so",
];

/// A return address no object has: a call the shim forwards on the
/// program's behalf (syscall(2) routed to a hook).
pub const PROGRAM: usize = 0;

/// Finds the ranges (the constructor calls it; a later call does nothing).
pub fn init() {
    if STATE.load(Ordering::Acquire) == UNKNOWN {
        scan();
    }
}

/// Held by the thread that scans. A thread that finds it held does not
/// wait (a fork child may inherit it held): it goes on with the ranges
/// recorded so far.
static SCANNING: AtomicBool = AtomicBool::new(false);

/// Looks through the loaded objects for ranges not recorded yet.
fn scan() {
    if SCANNING.swap(true, Ordering::Acquire) {
        return;
    }
    let mut found = Found {
        me: init as *const () as usize,
        n: COUNT.load(Ordering::Acquire),
    };
    // SAFETY: the callback only reads the headers dl_iterate_phdr hands it
    // and writes `found`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut found as *mut Found).cast()) };
    COUNT.store(found.n, Ordering::Release);
    let state = if found.n > 0 { KNOWN } else { FAILED };
    STATE.store(state, Ordering::Release);
    SCANNING.store(false, Ordering::Release);
}

fn recorded(ret: usize) -> bool {
    let n = COUNT.load(Ordering::Acquire);
    RANGES[..n]
        .iter()
        .any(|(s, e)| (s.load(Ordering::Relaxed)..e.load(Ordering::Relaxed)).contains(&ret))
}

/// True if the call that returns to `ret` was made by the program. An
/// address outside the recorded ranges is looked up again once more
/// objects may have been loaded (a provider rdma-core dlopened): this is
/// only asked about calls on the shim's descriptors. When the shim's text
/// could not be found, every call counts as the shim's: nothing is hidden
/// then, which is the behaviour without this check.
pub fn is_program(ret: usize) -> bool {
    if super::guard::active() {
        return false;
    }
    init();
    if STATE.load(Ordering::Acquire) != KNOWN || recorded(ret) {
        return false;
    }
    if ret == PROGRAM {
        return true;
    }
    scan();
    !recorded(ret)
}

struct Found {
    me: usize,
    n: usize,
}

unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: dl_iterate_phdr passes a valid info for this object and our
    // `data`, a `Found`.
    let (info, found) = unsafe { (&*info, &mut *data.cast::<Found>()) };
    // SAFETY: dlpi_phdr points at dlpi_phnum program headers.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let base = info.dlpi_addr as usize;
    let text = |p: &libc::Elf64_Phdr| {
        let start = base + p.p_vaddr as usize;
        (start, start + p.p_memsz as usize)
    };
    let exec = || {
        phdrs
            .iter()
            .filter(|p| p.p_type == libc::PT_LOAD && p.p_flags & libc::PF_X != 0)
    };
    let mine = exec().any(|p| {
        let (s, e) = text(p);
        (s..e).contains(&found.me)
    });
    let name = if info.dlpi_name.is_null() {
        &[][..]
    } else {
        // SAFETY: a non-null dlpi_name is a NUL-terminated path.
        unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }.to_bytes()
    };
    if mine || HELPERS.iter().any(|h| contains(name, h)) {
        for p in exec() {
            let (s, e) = text(p);
            let known = RANGES[..found.n]
                .iter()
                .any(|r| r.0.load(Ordering::Relaxed) == s);
            if !known && found.n < MAX_RANGES {
                RANGES[found.n].0.store(s, Ordering::Relaxed);
                RANGES[found.n].1.store(e, Ordering::Relaxed);
                found.n += 1;
            }
        }
    }
    0
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_text_is_the_shims_and_other_addresses_are_the_programs() {
        init();
        assert_eq!(
            STATE.load(Ordering::Acquire),
            KNOWN,
            "the test binary's text"
        );
        assert!(
            !is_program(is_program as *const () as usize + 4),
            "our own code"
        );
        assert!(is_program(PROGRAM));
        assert!(
            is_program(libc::strlen as *const () as usize),
            "libc's text is not ours"
        );
    }
}
