//! The fd table: which fds the shim tracks, and their shared state.
//!
//! A fixed-capacity array of `AtomicPtr<FdState>` indexed by fd, allocated
//! once with mmap (never through malloc: hooks run in odd places) and sized
//! from the RLIMIT_NOFILE hard limit, capped at `MAX_FDS` (fds beyond it are
//! simply never tracked and keep working as plain kernel fds). The kernel
//! hands out untouched pages lazily, so a large capacity costs address
//! space, not memory.
//!
//! Fast path: a hook on an fd we do not track does one relaxed load of the
//! table base (a plain `mov` on x86) and one relaxed load of the slot, sees
//! null, and calls libc.
//!
//! Lifetime protocol. A slot owns one reference to its `FdState`; `get`
//! borrows another for the duration of a call, so a concurrent `close` can
//! never free the object under a running hook:
//!
//! 1. load the slot (Acquire); null → untracked;
//! 2. `try_acquire` on the object (fails if its count is 0 = freed);
//! 3. re-load the slot: if it still holds the same pointer, the reference
//!    is to the current object of this fd; otherwise drop it and retry.
//!
//! Step 2 may touch an object that was freed and reused meanwhile: pool.rs
//! keeps objects type-stable, so that touches only an atomic counter, and
//! step 3 catches it. If the object was reused *for the same fd*, the fd was
//! closed and reopened in between, and the hook sees the new socket, as the
//! kernel would.
//!
//! dup/dup2/dup3/F_DUPFD make another slot point to the same object (`fds`
//! counts them); `close` clears one slot; when the last slot of an object
//! goes, the ring layer hears of it (close.rs): an attached connection's
//! `release` runs (owner or inherited, by fork generation: see state.rs and
//! docs/design.md, "fork, exec, dup"). After fork the child has its own copy
//! of the table and of every object (memory is copied), with the same entries
//! as the parent: exactly the kernel's picture of inherited fds.

mod close;
mod pool;
mod state;

use std::ops::Deref;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

pub use close::on_close_in_epoll;
pub use state::{rings_alive, EpollSlot, FdState, Kind, PreEpoll, Socket};

/// Upper bound on tracked fd numbers (8 MiB of address space for slots).
pub const MAX_FDS: usize = 1 << 20;
/// Lower bound, for a hard limit set absurdly low.
const MIN_FDS: usize = 1024;

type Slot = AtomicPtr<FdState>;

static BASE: AtomicPtr<Slot> = AtomicPtr::new(ptr::null_mut());
static LEN: AtomicUsize = AtomicUsize::new(0);
/// One more than the highest fd ever given a state: `fd_of` looks no
/// further.
static HIGH: AtomicUsize = AtomicUsize::new(0);

#[inline]
fn slot(fd: i32) -> Option<&'static Slot> {
    let base = BASE.load(Ordering::Acquire);
    if base.is_null() || fd < 0 {
        return None;
    }
    let fd = fd as usize;
    if fd >= LEN.load(Ordering::Relaxed) {
        return None;
    }
    // SAFETY: base points to LEN initialised slots that are never unmapped
    // (LEN is stored before BASE is published with Release).
    Some(unsafe { &*base.add(fd) })
}

/// The table, creating it on first use. None if mmap failed (then nothing
/// is ever tracked, which is the safe degradation).
fn slot_or_init(fd: i32) -> Option<&'static Slot> {
    if BASE.load(Ordering::Acquire).is_null() {
        init_table();
    }
    slot(fd)
}

#[cold]
fn init_table() {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: rl is a valid out-pointer; getrlimit is not interposed.
    let hard = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0 {
        rl.rlim_max
    } else {
        MIN_FDS as libc::rlim_t
    };
    let len = (hard.min(MAX_FDS as libc::rlim_t) as usize).max(MIN_FDS);
    let bytes = len * std::mem::size_of::<Slot>();
    // SAFETY: anonymous private mapping; zero pages are null AtomicPtrs.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        log::error!("cannot map the fd table ({bytes} bytes); nothing will be accelerated");
        return;
    }
    // Publish LEN before BASE; a racing initialiser loses the CAS and
    // unmaps its copy (both computed the same LEN).
    LEN.store(len, Ordering::Relaxed);
    if BASE
        .compare_exchange(
            ptr::null_mut(),
            p.cast(),
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
    {
        // SAFETY: unmapping our own, never published, mapping.
        unsafe { libc::munmap(p, bytes) };
    }
}

/// Capacity of the table (0 before first use).
pub fn capacity() -> usize {
    LEN.load(Ordering::Relaxed)
}

/// True if `fd` is tracked. One relaxed load: the pass-through fast path.
#[inline]
pub fn is_tracked(fd: i32) -> bool {
    match slot(fd) {
        Some(s) => !s.load(Ordering::Relaxed).is_null(),
        None => false,
    }
}

/// A counted reference to an fd's state, valid while held.
pub struct FdRef {
    st: &'static FdState,
}

impl Deref for FdRef {
    type Target = FdState;
    fn deref(&self) -> &FdState {
        self.st
    }
}

impl Clone for FdRef {
    fn clone(&self) -> Self {
        self.st.retain();
        FdRef { st: self.st }
    }
}

impl Drop for FdRef {
    fn drop(&mut self) {
        self.st.release();
    }
}

impl FdRef {
    /// True if both refer to the same object.
    pub fn same(&self, other: &FdRef) -> bool {
        ptr::eq(self.st, other.st)
    }
}

/// The state of `fd`, if tracked (see the lifetime protocol above).
pub fn get(fd: i32) -> Option<FdRef> {
    get_at(slot(fd)?)
}

/// `get` on the slot of an fd.
#[inline]
fn get_at(s: &'static Slot) -> Option<FdRef> {
    loop {
        let p = s.load(Ordering::Acquire);
        if p.is_null() {
            return None;
        }
        // SAFETY: p came from a slot, so it points into the type-stable pool.
        let st: &'static FdState = unsafe { &*p };
        if !st.try_acquire() {
            // Freed: the slot has moved on (a slot's own reference keeps an
            // installed object alive). Look again.
            std::hint::spin_loop();
            continue;
        }
        if s.load(Ordering::Acquire) == p {
            return Some(FdRef { st });
        }
        st.release();
    }
}

/// The state of `fd` if a ring connection is attached to it. For every other
/// fd this costs one or two relaxed loads and takes no reference: the data
/// hooks' fast path for tracked plain-TCP sockets.
#[inline]
pub fn attached(fd: i32) -> Option<FdRef> {
    let s = slot(fd)?;
    let p = s.load(Ordering::Relaxed);
    if p.is_null() {
        return None;
    }
    // SAFETY: type-stable pool object; `has_conn` reads one atomic.
    if !unsafe { &*p }.has_conn() {
        return None;
    }
    get_at(s).filter(|r| r.conn().is_some())
}

/// The state of `fd` if `want` holds for it. `want` is first asked of the
/// slot's object before any reference is taken (it may read only the
/// state's atomics: the object may be a recycled one, as in `attached`),
/// so an fd it turns down costs a few loads; a reference taken is asked
/// again.
#[inline]
pub fn get_if(fd: i32, want: impl Fn(&FdState) -> bool) -> Option<FdRef> {
    let s = slot(fd)?;
    let p = s.load(Ordering::Acquire);
    if p.is_null() {
        return None;
    }
    // SAFETY: type-stable pool object (pool.rs); `want` reads atomics.
    if !want(unsafe { &*p }) {
        return None;
    }
    get_at(s).filter(|r| want(r))
}

/// Starts tracking a new socket (or epoll instance) at `fd`. Returns the
/// new state, or None if it could not be tracked (table or pool exhausted:
/// the fd then simply stays a plain kernel fd).
pub fn track_new(fd: i32, kind: Kind, family: i32, nonblocking: bool) -> Option<FdRef> {
    let s = slot_or_init(fd)?;
    let Some(st) = pool::alloc() else {
        log::warn!("out of memory for socket state; fd {fd} stays plain TCP");
        return None;
    };
    st.init(kind, family, nonblocking);
    note_high(fd);
    st.add_fd();
    // The allocation reference becomes the slot's; take one for the caller.
    st.retain();
    let old = s.swap(st as *const FdState as *mut FdState, Ordering::AcqRel);
    drop_stale(old, fd);
    Some(FdRef { st })
}

/// Makes `fd` refer to the same state as `r` (dup family). Whatever `fd`
/// referred to before is released as closed.
pub fn install_dup(fd: i32, r: &FdRef) {
    let Some(s) = slot_or_init(fd) else {
        return;
    };
    r.st.retain();
    r.st.add_fd();
    note_high(fd);
    let old = s.swap(r.st as *const FdState as *mut FdState, Ordering::AcqRel);
    drop_slot_ref(old, fd, false);
}

/// `fd` gets a state: `HIGH` covers it (one load unless it grows).
fn note_high(fd: i32) {
    let next = fd as usize + 1;
    if next > HIGH.load(Ordering::Relaxed) {
        HIGH.fetch_max(next, Ordering::Relaxed);
    }
}

/// Some fd of this process that refers to `st`, if one does (a scan up
/// to the highest fd tracked: only asked when a connection's reported
/// number closes while another number still holds it).
fn fd_of(st: &FdState) -> Option<i32> {
    let high = HIGH.load(Ordering::Relaxed).min(capacity());
    (0..high as i32).find(|&fd| holds(fd, st))
}

/// Whether the slot of `fd` refers to `st`.
fn holds(fd: i32, st: &FdState) -> bool {
    slot(fd).is_some_and(|s| ptr::eq(s.load(Ordering::Acquire), st))
}

/// Stops tracking `fd` (it is being closed, or replaced by dup2/dup3 with an
/// untracked fd). If it was the last fd of an attached connection in this
/// process, the connection is released before this returns.
pub fn untrack(fd: i32) {
    if let Some(s) = slot(fd) {
        let old = s.swap(ptr::null_mut(), Ordering::AcqRel);
        drop_slot_ref(old, fd, false);
    }
}

/// Untracks every fd in `lo..=hi` (close_range, closefrom).
pub fn untrack_range(lo: u32, hi: u32) {
    let cap = capacity();
    if cap == 0 {
        return;
    }
    let hi = (hi as usize).min(cap - 1);
    for fd in lo as usize..=hi {
        if is_tracked(fd as i32) {
            untrack(fd as i32);
        }
    }
}

/// Stops tracking every fd without any of them being closed: the program
/// keeps its descriptors and uses them without the shim from now on. An
/// attached connection is released as stale (nothing ends; its kernel
/// socket stays the program's), so it must have left its ring first.
pub fn forget_all() {
    for fd in 0..capacity() as i32 {
        if let Some(s) = slot(fd) {
            let old = s.swap(ptr::null_mut(), Ordering::AcqRel);
            drop_slot_ref(old, fd, true);
        }
    }
}

/// A slot was overwritten by a new socket although we never saw its fd
/// closed: it was closed behind our back.
fn drop_stale(old: *mut FdState, fd: i32) {
    drop_slot_ref(old, fd, true);
}

fn drop_slot_ref(old: *mut FdState, fd: i32, stale: bool) {
    if old.is_null() {
        return;
    }
    // SAFETY: the slot owned a reference, which the swap handed to us.
    let st: &'static FdState = unsafe { &*old };
    if st.remove_fd() {
        close::last_fd_gone(fd, st, stale);
    } else if !stale {
        close::one_fd_gone(fd, st);
    }
    st.release();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    // fds far above anything the test process opens.
    const BASE_FD: i32 = 900;

    #[test]
    fn a_listener_keeps_its_bound_address() {
        let st = track_new(BASE_FD + 40, Kind::Tcp, libc::AF_INET6, false).unwrap();
        assert_eq!(st.bound(), None);
        for a in [
            "127.0.0.1:6379",
            "[::1]:80",
            "[fe80::1:2:3:4]:65535",
            "10.1.2.3:0",
        ] {
            let a: std::net::SocketAddr = a.parse().unwrap();
            st.set_bound(Some(a));
            assert_eq!(st.bound(), Some(a));
        }
        st.set_bound(None);
        assert_eq!(st.bound(), None);
        untrack(BASE_FD + 40);
    }

    #[test]
    fn track_dup_untrack() {
        let a = BASE_FD;
        let b = BASE_FD + 1;
        let st = track_new(a, Kind::Tcp, libc::AF_INET, false).unwrap();
        assert!(is_tracked(a));
        assert!(!is_tracked(b));
        install_dup(b, &st);
        assert_eq!(st.fd_count(), 2);
        assert!(get(b).unwrap().same(&st));
        st.set_nonblocking(true);
        assert!(get(b).unwrap().nonblocking(), "dup'd fds share the state");
        untrack(a);
        assert!(!is_tracked(a));
        assert_eq!(st.fd_count(), 1);
        untrack(b);
        assert_eq!(st.fd_count(), 0);
        assert!(get(b).is_none());
        drop(st);
    }

    #[test]
    fn out_of_range_fds_are_untracked() {
        assert!(get(-1).is_none());
        assert!(!is_tracked(i32::MAX));
        assert!(track_new(i32::MAX, Kind::Tcp, libc::AF_INET, false).is_none());
    }

    #[test]
    fn concurrent_get_and_retrack_is_safe() {
        let fd = BASE_FD + 10;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut seen = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        if let Some(r) = get(fd) {
                            assert!(r.kind().is_some(), "a borrowed object is never free");
                            seen += 1;
                        }
                    }
                    seen
                })
            })
            .collect();
        for i in 0..20_000 {
            let r = track_new(fd, Kind::Tcp, libc::AF_INET6, i % 2 == 0).unwrap();
            drop(r);
            untrack(fd);
        }
        stop.store(true, Ordering::Relaxed);
        for t in readers {
            t.join().unwrap();
        }
        assert!(!is_tracked(fd));
    }
}
