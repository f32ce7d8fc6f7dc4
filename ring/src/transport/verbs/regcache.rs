//! The registration cache behind zero-copy sends: memory regions over the
//! program's own buffers, so a large send can be one RDMA WRITE straight
//! from the program's memory instead of a copy into the ring first.
//!
//! Registering memory pins the pages mapped at that moment. If the program
//! later unmaps the range (or frees a malloc chunk that glibc unmaps, or
//! drops its pages with `madvise`) and the addresses get new pages, a
//! cached registration still points at the OLD pages: a send from it would
//! silently carry stale bytes. So every entry must be dropped when what its
//! addresses map to may change: `invalidate(start, len)`, which the shim
//! calls from its hooks of munmap, mremap, madvise, brk/sbrk, mmap with
//! MAP_FIXED, shmdt, free and realloc. Changes it cannot see (raw
//! syscalls, an allocator's internal unmaps) are why zero-copy is opt-in.
//!
//! `RegCache` is the logic, generic over a `Registrar` so it is tested
//! without a device: entries are page-aligned ranges with their lkey; an
//! acquire either finds an entry covering the request or registers the
//! request's pages (no merging: an entry covers only pages of one buffer
//! the program sent from, never memory around it that the program did not
//! hand us); bounded by entry count and pinned bytes, least recently used
//! evicted first; an entry in use by a send in flight is only marked dead
//! by `invalidate` and deregistered when released (refcount); a failed
//! registration is remembered (`Failure`) so a process short of locked
//! memory does not retry on every send.
//!
//! The process-wide side: one `ZcCache` per open device (protection
//! domain), all listed in `CACHES` for `invalidate`. `ENTRIES` counts
//! entries over all caches: the hooks' fast path is one relaxed load of it
//! (zero unless zero-copy was used). Relaxed is enough: a stale
//! registration needs the program to send from a buffer and then change
//! its mapping, and the program orders those two itself (a send
//! happens-before the free/unmap that follows it, in the program's own
//! synchronization), so the load sees the count the send left.

use super::device::Device;
use super::ibv::{ibv_dereg_mr, ibv_is_fork_initialized, ibv_reg_mr};
use rdma_sys::*;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

const PAGE: usize = 4096;

/// Registers and deregisters memory (verbs: `ibv_reg_mr` on a PD).
pub(crate) trait Registrar {
    type Mr;
    /// Registers `[addr, addr + len)` (page-aligned) for local reads by
    /// the device. `Ok((mr, lkey))`, or `Err(errno)`.
    fn register(&mut self, addr: usize, len: usize) -> Result<(Self::Mr, u32), i32>;
    fn deregister(&mut self, mr: Self::Mr);
}

/// Bounds of one cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    pub max_entries: usize,
    pub max_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_entries: 64,
            max_bytes: 256 << 20,
        }
    }
}

struct Entry<M> {
    id: u64,
    start: usize,
    end: usize,
    lkey: u32,
    mr: Option<M>,
    refs: u32,
    /// False once invalidated: never found again; deregistered when the
    /// last user releases it.
    live: bool,
    last_use: u64,
}

/// What a failed registration left behind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Failure {
    /// Locked-memory failures (ENOMEM, EPERM, EAGAIN): registering failed
    /// with this many bytes pinned in total (what we had plus the
    /// request); no registration is tried again that would pin as much.
    /// Frees (eviction, invalidation) lower what we have pinned, so a
    /// smaller total is tried again.
    pinned_limit: Option<usize>,
}

/// A lease on an entry: `lkey` covers the requested bytes until `release`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lease {
    pub id: u64,
    pub lkey: u32,
}

/// Why `acquire` gave no lease (the caller copies instead).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Miss {
    /// Larger than the cache may pin at all.
    TooLarge,
    /// Every entry is in use and the cache is full.
    Full,
    /// A registration failed (or would: see `Failure`); errno.
    Failed(i32),
}

pub(crate) struct RegCache<R: Registrar> {
    reg: R,
    limits: Limits,
    entries: Vec<Entry<R::Mr>>,
    /// Bytes registered (live and dead entries).
    pinned: usize,
    clock: u64,
    next_id: u64,
    failure: Failure,
    /// Ranges whose registration failed for another reason (EFAULT: not
    /// memory the device can pin), until invalidated; a few at most.
    bad: Vec<(usize, usize)>,
}

fn page_range(addr: usize, len: usize) -> Option<(usize, usize)> {
    let start = addr & !(PAGE - 1);
    let end = addr.checked_add(len)?.checked_add(PAGE - 1)? & !(PAGE - 1);
    Some((start, end))
}

fn overlaps(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

impl<R: Registrar> RegCache<R> {
    pub fn new(reg: R, limits: Limits) -> Self {
        RegCache {
            reg,
            limits,
            entries: Vec::new(),
            pinned: 0,
            clock: 0,
            next_id: 1,
            failure: Failure::default(),
            bad: Vec::new(),
        }
    }

    /// Entries registered (live or waiting for their last release).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// A lease covering `[addr, addr + len)`: an entry that covers it, or
    /// a new registration of its pages (evicting unused entries, least
    /// recently used first, to stay within the limits).
    pub fn acquire(&mut self, addr: usize, len: usize) -> Result<Lease, Miss> {
        let Some((start, end)) = page_range(addr, len) else {
            return Err(Miss::TooLarge);
        };
        self.clock += 1;
        let now = self.clock;
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| e.live && e.start <= start && end <= e.end)
        {
            e.refs += 1;
            e.last_use = now;
            return Ok(Lease {
                id: e.id,
                lkey: e.lkey,
            });
        }
        let size = end - start;
        if size > self.limits.max_bytes {
            return Err(Miss::TooLarge);
        }
        if self.bad.iter().any(|&b| overlaps(b, (start, end))) {
            return Err(Miss::Failed(libc::EFAULT));
        }
        while self.entries.len() >= self.limits.max_entries
            || self.pinned + size > self.limits.max_bytes
        {
            if !self.evict_one() {
                return Err(Miss::Full);
            }
        }
        // After eviction: a total we already failed to pin is not tried
        // again (evict first, it may bring us below it).
        if self
            .failure
            .pinned_limit
            .is_some_and(|l| self.pinned + size >= l)
        {
            return Err(Miss::Failed(libc::ENOMEM));
        }
        match self.reg.register(start, size) {
            Ok((mr, lkey)) => {
                let id = self.next_id;
                self.next_id += 1;
                self.pinned += size;
                self.entries.push(Entry {
                    id,
                    start,
                    end,
                    lkey,
                    mr: Some(mr),
                    refs: 1,
                    live: true,
                    last_use: now,
                });
                Ok(Lease { id, lkey })
            }
            Err(e) => {
                if crate::error::is_memlock_errno(e) {
                    self.failure.pinned_limit = Some(self.pinned + size);
                } else {
                    if self.bad.len() >= 8 {
                        self.bad.remove(0);
                    }
                    self.bad.push((start, end));
                }
                Err(Miss::Failed(e))
            }
        }
    }

    /// Ends a lease; a dead entry is deregistered with its last lease.
    pub fn release(&mut self, lease: Lease) {
        let Some(i) = self.entries.iter().position(|e| e.id == lease.id) else {
            debug_assert!(false, "release of an unknown lease");
            return;
        };
        let e = &mut self.entries[i];
        e.refs = e.refs.saturating_sub(1);
        if e.refs == 0 && !e.live {
            self.remove(i);
        }
    }

    /// Drops every entry overlapping `[start, start + len)`: unused ones
    /// are deregistered now, ones in use when their last lease ends.
    /// Returns how many entries it dropped.
    pub fn invalidate(&mut self, start: usize, len: usize) -> usize {
        let range = (start, start.saturating_add(len));
        self.bad.retain(|&b| !overlaps(b, range));
        let mut n = 0;
        let mut i = 0;
        while i < self.entries.len() {
            let e = &mut self.entries[i];
            if e.live && overlaps((e.start, e.end), range) {
                e.live = false;
                n += 1;
                if e.refs == 0 {
                    self.remove(i);
                    continue;
                }
            }
            i += 1;
        }
        n
    }

    /// Drops every entry (as `invalidate` of the whole address space).
    pub fn invalidate_all(&mut self) -> usize {
        self.invalidate(0, usize::MAX)
    }

    /// Deregisters the least recently used entry nobody uses; false if
    /// there is none.
    fn evict_one(&mut self) -> bool {
        let victim = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.refs == 0)
            .min_by_key(|(_, e)| e.last_use)
            .map(|(i, _)| i);
        match victim {
            Some(i) => {
                self.remove(i);
                true
            }
            None => false,
        }
    }

    fn remove(&mut self, i: usize) {
        let mut e = self.entries.swap_remove(i);
        self.pinned -= e.end - e.start;
        if let Some(mr) = e.mr.take() {
            self.reg.deregister(mr);
        }
    }
}

impl<R: Registrar> Drop for RegCache<R> {
    fn drop(&mut self) {
        while let Some(mut e) = self.entries.pop() {
            if let Some(mr) = e.mr.take() {
                self.reg.deregister(mr);
            }
        }
    }
}

/// `ibv_reg_mr` on one protection domain, local read access only (the
/// device reads the program's buffer; nothing writes into it, so
/// read-only memory registers too).
pub(crate) struct PdRegistrar {
    pd: *mut ibv_pd,
}

// SAFETY: a PD may be used from any thread (libibverbs locks internally);
// the cache that owns this is behind a mutex.
unsafe impl Send for PdRegistrar {}

impl Registrar for PdRegistrar {
    type Mr = MrPtr;

    fn register(&mut self, addr: usize, len: usize) -> Result<(MrPtr, u32), i32> {
        // SAFETY: the PD is open while its Device lives, and the Device
        // owns this cache; the range is the program's memory, which the
        // kernel checks (EFAULT) and pins.
        let mr = unsafe { ibv_reg_mr(self.pd, addr as *mut libc::c_void, len, 0) };
        if mr.is_null() {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::ENOMEM));
        }
        // SAFETY: a registered MR is valid until deregistered.
        let lkey = unsafe { (*mr).lkey };
        Ok((MrPtr(mr), lkey))
    }

    fn deregister(&mut self, mr: MrPtr) {
        // SAFETY: registered by `register`, deregistered once (the cache
        // takes it out of its entry), never while a lease is out.
        unsafe { ibv_dereg_mr(mr.0) };
    }
}

pub(crate) struct MrPtr(*mut ibv_mr);

// SAFETY: an MR handle is a plain pointer that libibverbs lets any thread
// deregister.
unsafe impl Send for MrPtr {}

/// The cache of one device (one protection domain).
pub(crate) struct ZcCache {
    inner: Mutex<RegCache<PdRegistrar>>,
}

/// Entries over all caches of the process: the hooks' fast path.
static ENTRIES: AtomicUsize = AtomicUsize::new(0);
/// In a forked child the caches belong to the parent: hands off.
static FORKED: AtomicBool = AtomicBool::new(false);
static CACHES: Mutex<Vec<Weak<ZcCache>>> = Mutex::new(Vec::new());

thread_local! {
    /// This thread holds a cache lock (or the list's): a free or munmap
    /// that the cache's own work does (libibverbs allocating, the list
    /// growing) must not lock again. Such memory is the library's, never
    /// a buffer the program sent from.
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

struct Busy(bool);

impl Busy {
    fn enter() -> Busy {
        Busy(BUSY.with(|b| b.replace(true)))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let was = self.0;
        BUSY.with(|b| b.set(was));
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Keeps `ENTRIES` equal to the sum of the caches' entries.
fn account(before: usize, after: usize) {
    if after > before {
        ENTRIES.fetch_add(after - before, Ordering::Relaxed);
    } else if before > after {
        ENTRIES.fetch_sub(before - after, Ordering::Relaxed);
    }
}

extern "C" fn in_forked_child() {
    // The child has copies of the parent's MRs and maybe of a lock some
    // other parent thread held: it never touches the caches.
    FORKED.store(true, Ordering::Relaxed);
    ENTRIES.store(0, Ordering::Relaxed);
}

impl ZcCache {
    pub(super) fn new(pd: *mut ibv_pd) -> Arc<ZcCache> {
        static ATFORK: std::sync::Once = std::sync::Once::new();
        ATFORK.call_once(|| {
            // SAFETY: registers a child handler that only stores atomics.
            unsafe { libc::pthread_atfork(None, None, Some(in_forked_child)) };
        });
        let c = Arc::new(ZcCache {
            inner: Mutex::new(RegCache::new(PdRegistrar { pd }, Limits::default())),
        });
        let _b = Busy::enter();
        let mut list = lock(&CACHES);
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(&c));
        c
    }

    /// A lease over `buf`, or why not (the caller copies instead).
    pub fn acquire(self: &Arc<Self>, buf: &[u8]) -> Result<ZcLease, Miss> {
        if FORKED.load(Ordering::Relaxed) {
            return Err(Miss::Failed(libc::EPERM));
        }
        let _b = Busy::enter();
        let mut c = lock(&self.inner);
        let before = c.len();
        let r = c.acquire(buf.as_ptr() as usize, buf.len());
        account(before, c.len());
        r.map(|lease| ZcLease {
            cache: self.clone(),
            lease,
        })
    }

    /// Deregisters everything (the device is closing: no connection, so
    /// no lease, is left).
    pub(super) fn clear(&self) {
        let _b = Busy::enter();
        let mut c = lock(&self.inner);
        let before = c.len();
        c.invalidate_all();
        account(before, c.len());
    }
}

/// A registration in use by one zero-copy send; released on drop.
pub struct ZcLease {
    cache: Arc<ZcCache>,
    lease: Lease,
}

impl ZcLease {
    pub fn lkey(&self) -> u32 {
        self.lease.lkey
    }
}

impl Drop for ZcLease {
    fn drop(&mut self) {
        let _b = Busy::enter();
        let mut c = lock(&self.cache.inner);
        let before = c.len();
        c.release(self.lease);
        account(before, c.len());
    }
}

/// Drops every cached registration overlapping `[start, start + len)` in
/// every cache of the process. Costs one relaxed load while no cache holds
/// an entry. Safe to call from any hook: it never allocates on that path,
/// and a call from inside the caches' own work returns at once.
#[inline]
pub fn invalidate(start: usize, len: usize) {
    if ENTRIES.load(Ordering::Relaxed) == 0 {
        return;
    }
    invalidate_slow(start, len);
}

#[cold]
fn invalidate_slow(start: usize, len: usize) {
    if FORKED.load(Ordering::Relaxed) || BUSY.with(Cell::get) {
        return;
    }
    let _b = Busy::enter();
    let list = lock(&CACHES);
    for c in list.iter().filter_map(Weak::upgrade) {
        let mut g = lock(&c.inner);
        let before = g.len();
        g.invalidate(start, len);
        account(before, g.len());
        drop(g);
        // `c` may be the last reference (its device closed meanwhile):
        // dropping it here deregisters nothing (clear ran) and frees
        // memory, which the BUSY flag keeps out of this function.
    }
}

/// Drops every cached registration (e.g. `shmdt`, whose range the hook
/// does not know).
pub fn invalidate_all() {
    invalidate(0, usize::MAX);
}

/// Whether pinned pages are safe across fork in this process: the kernel
/// copies them for the child (Linux >= 5.13, rdma-core reports
/// `IBV_FORK_UNNEEDED`). Otherwise a fork would make a registered page
/// copy-on-write under the device, and zero-copy stays off.
pub fn fork_safe() -> bool {
    static SAFE: OnceLock<bool> = OnceLock::new();
    // SAFETY: ibv_is_fork_initialized takes no arguments and only reads
    // libibverbs' own state.
    *SAFE.get_or_init(|| unsafe { ibv_is_fork_initialized() } == IBV_FORK_UNNEEDED)
}

/// Entries in all caches (for tests and logs).
pub fn entries() -> usize {
    ENTRIES.load(Ordering::Relaxed)
}

impl Device {
    /// This device's registration cache (made on first use).
    pub(crate) fn zc_cache(&self) -> &Arc<ZcCache> {
        self.zc.get_or_init(|| ZcCache::new(self.pd))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    /// Fake registrar: hands out lkeys, remembers what is registered, can
    /// be told to fail once the pinned total would pass a limit.
    #[derive(Default)]
    struct Fake {
        next: u32,
        live: HashSet<u32>,
        ranges: Vec<(u32, usize, usize)>,
        calls: u32,
        memlock: Option<usize>,
        errno: Option<i32>,
        outstanding: Option<std::rc::Rc<Cell<usize>>>,
    }

    impl Registrar for Fake {
        type Mr = u32;
        fn register(&mut self, addr: usize, len: usize) -> Result<(u32, u32), i32> {
            self.calls += 1;
            assert_eq!(addr % PAGE, 0);
            assert_eq!(len % PAGE, 0);
            if let Some(e) = self.errno {
                return Err(e);
            }
            let pinned: usize = self.ranges.iter().map(|r| r.2).sum();
            if self.memlock.is_some_and(|m| pinned + len > m) {
                return Err(libc::ENOMEM);
            }
            self.next += 1;
            self.live.insert(self.next);
            self.ranges.push((self.next, addr, len));
            if let Some(o) = &self.outstanding {
                o.set(o.get() + 1);
            }
            Ok((self.next, self.next))
        }
        fn deregister(&mut self, mr: u32) {
            assert!(self.live.remove(&mr), "double deregistration of {mr}");
            if let Some(o) = &self.outstanding {
                o.set(o.get() - 1);
            }
            self.ranges.retain(|r| r.0 != mr);
        }
    }

    fn cache(entries: usize, bytes: usize) -> RegCache<Fake> {
        RegCache::new(
            Fake::default(),
            Limits {
                max_entries: entries,
                max_bytes: bytes,
            },
        )
    }

    const M: usize = 1 << 20;

    #[test]
    fn hit_inside_an_entry_registers_once() {
        let mut c = cache(8, 64 * M);
        let a = c.acquire(0x10_0100, 100_000).unwrap();
        c.release(a);
        // Inside the same pages: a hit, the same lkey.
        let b = c.acquire(0x10_0200, 50_000).unwrap();
        assert_eq!(a.lkey, b.lkey);
        c.release(b);
        assert_eq!(c.reg.calls, 1);
        assert_eq!(
            c.pinned,
            (0x10_0100 + 100_000usize).div_ceil(PAGE) * PAGE - 0x10_0000
        );
        // Sticking out of it by one byte: a new registration.
        let end = 0x10_0000 + c.pinned;
        let d = c.acquire(end - 10, 11).unwrap();
        assert_ne!(d.lkey, a.lkey);
        assert_eq!(c.reg.calls, 2);
    }

    #[test]
    fn invalidate_drops_overlapping_entries_only() {
        let mut c = cache(8, 64 * M);
        let a = c.acquire(0x100000, 2 * PAGE).unwrap();
        let b = c.acquire(0x200000, PAGE).unwrap();
        c.release(a);
        c.release(b);
        // Touches the last byte of a's range.
        assert_eq!(c.invalidate(0x100000 + 2 * PAGE - 1, 1), 1);
        assert_eq!(c.len(), 1);
        // Ends exactly where b starts: no overlap.
        assert_eq!(c.invalidate(0x1ff000, PAGE), 0);
        assert_eq!(c.len(), 1);
        // a's range again: registers anew, b still hits.
        let a2 = c.acquire(0x100000, 2 * PAGE).unwrap();
        assert_ne!(a2.lkey, a.lkey);
        assert_eq!(c.acquire(0x200000, 10).unwrap().lkey, b.lkey);
        assert_eq!(c.reg.live.len(), 2);
    }

    #[test]
    fn an_entry_in_use_is_deregistered_at_its_last_release() {
        let mut c = cache(8, 64 * M);
        let a = c.acquire(0x100000, PAGE).unwrap();
        let a2 = c.acquire(0x100000, PAGE).unwrap();
        assert_eq!(c.invalidate(0x100000, 1), 1);
        // Still registered: two sends read from it.
        assert!(c.reg.live.contains(&a.lkey));
        // But never found again: a new lookup registers anew.
        let n = c.acquire(0x100000, PAGE).unwrap();
        assert_ne!(n.lkey, a.lkey);
        c.release(a);
        assert!(c.reg.live.contains(&a.lkey));
        c.release(a2);
        assert!(!c.reg.live.contains(&a.lkey));
        // A second invalidation does not count the dead entry again.
        assert_eq!(c.invalidate(0, usize::MAX), 1);
        assert!(c.reg.live.contains(&n.lkey));
        c.release(n);
        assert!(c.reg.live.is_empty());
        assert_eq!(c.pinned, 0);
    }

    #[test]
    fn eviction_is_lru_and_skips_entries_in_use() {
        let mut c = cache(2, 64 * M);
        let a = c.acquire(0x100000, PAGE).unwrap();
        let b = c.acquire(0x200000, PAGE).unwrap();
        c.release(b);
        // Full: b is the only one not in use, so it goes.
        let x = c.acquire(0x300000, PAGE).unwrap();
        assert!(!c.reg.live.contains(&b.lkey));
        assert!(c.reg.live.contains(&a.lkey));
        // Both in use: no room.
        assert_eq!(c.acquire(0x400000, PAGE), Err(Miss::Full));
        c.release(a);
        c.release(x);
        // Touch a, so x is the least recently used.
        let t = c.acquire(0x100000, 1).unwrap();
        c.release(t);
        let t = c.acquire(0x500000, 1).unwrap();
        c.release(t);
        assert!(c.reg.live.contains(&a.lkey));
        assert!(!c.reg.live.contains(&x.lkey));
    }

    #[test]
    fn pinned_bytes_are_bounded() {
        let mut c = cache(64, 4 * PAGE);
        assert_eq!(c.acquire(0x100000, 5 * PAGE), Err(Miss::TooLarge));
        let a = c.acquire(0x100000, 3 * PAGE).unwrap();
        c.release(a);
        let _b = c.acquire(0x200000, 2 * PAGE).unwrap();
        assert_eq!(c.pinned, 2 * PAGE);
        assert!(!c.reg.live.contains(&a.lkey));
    }

    #[test]
    fn a_memlock_failure_is_remembered() {
        let mut c = cache(64, 64 * M);
        c.reg.memlock = Some(3 * PAGE);
        let a = c.acquire(0x100000, 2 * PAGE).unwrap();
        assert_eq!(
            c.acquire(0x200000, 2 * PAGE),
            Err(Miss::Failed(libc::ENOMEM))
        );
        let calls = c.reg.calls;
        // Not tried again at the same total, nor above it.
        for _ in 0..10 {
            assert!(c.acquire(0x200000, 2 * PAGE).is_err());
            assert!(c.acquire(0x300000, 4 * PAGE).is_err());
        }
        assert_eq!(c.reg.calls, calls);
        // Below it: tried (and fits).
        let s = c.acquire(0x400000, PAGE).unwrap();
        assert_eq!(c.reg.calls, calls + 1);
        c.release(s);
        // Once a's pages are gone, the 2-page send is tried again.
        c.release(a);
        c.invalidate(0x100000, PAGE);
        c.invalidate(0x400000, PAGE);
        assert!(c.acquire(0x200000, 2 * PAGE).is_ok());
    }

    #[test]
    fn other_failures_are_remembered_per_range() {
        let mut c = cache(64, 64 * M);
        c.reg.errno = Some(libc::EFAULT);
        assert_eq!(c.acquire(0x100000, PAGE), Err(Miss::Failed(libc::EFAULT)));
        c.reg.errno = None;
        assert!(c.acquire(0x100000, 10).is_err());
        assert_eq!(c.reg.calls, 1);
        // Elsewhere is fine.
        assert!(c.acquire(0x200000, 10).is_ok());
        // A remapping of the bad range clears it.
        c.invalidate(0x100000, PAGE);
        assert!(c.acquire(0x100000, 10).is_ok());
    }

    #[test]
    fn ranges_at_the_top_of_the_address_space_do_not_overflow() {
        let mut c = cache(8, 64 * M);
        assert_eq!(c.acquire(usize::MAX - 10, 100), Err(Miss::TooLarge));
        assert_eq!(c.invalidate(usize::MAX - 10, 100), 0);
    }

    #[test]
    fn drop_deregisters_everything() {
        let out = std::rc::Rc::new(Cell::new(0));
        let mut c = cache(8, 64 * M);
        c.reg.outstanding = Some(out.clone());
        let _a = c.acquire(0x100000, PAGE).unwrap();
        let b = c.acquire(0x200000, PAGE).unwrap();
        c.release(b);
        assert_eq!(out.get(), 2);
        drop(c);
        assert_eq!(out.get(), 0);
    }

    proptest! {
        /// Against a model: a lease's lkey always belongs to a live
        /// registration covering the bytes asked for, registered after
        /// the last invalidation that touched them; the limits hold; and
        /// nothing in use is ever deregistered.
        #[test]
        fn model(ops in proptest::collection::vec((0u8..4, 0usize..32, 1usize..5, 0usize..4), 1..200)) {
            let mut c = cache(6, 12 * PAGE);
            let mut held: Vec<(Lease, usize, usize)> = Vec::new();
            // Per page: the registration counter value when it was last
            // invalidated.
            let mut inval = [0u32; 40];
            for (op, page, pages, k) in ops {
                let (addr, len) = (0x100000 + page * PAGE + 17, pages * PAGE - 40);
                match op {
                    0 | 1 => {
                        if let Ok(l) = c.acquire(addr, len) {
                            let r = c.reg.ranges.iter().find(|r| r.0 == l.lkey).copied();
                            let (_, s, n) = r.expect("lease of a deregistered MR");
                            prop_assert!(s <= addr && addr + len <= s + n);
                            let pages = (s - 0x100000) / PAGE..(s + n - 0x100000) / PAGE;
                            for (p, &gone) in inval.iter().enumerate().filter(|(p, _)| pages.contains(p)) {
                                prop_assert!(l.lkey > gone, "stale registration for page {}", p);
                            }
                            held.push((l, s, n));
                        }
                    }
                    2 => {
                        if !held.is_empty() {
                            let (l, _, _) = held.remove(k % held.len());
                            c.release(l);
                        }
                    }
                    _ => {
                        c.invalidate(addr, len);
                        let last = c.reg.next;
                        let pages = (addr - 0x100000) / PAGE..(addr + len - 0x100000).div_ceil(PAGE);
                        for v in &mut inval[pages] {
                            *v = last;
                        }
                    }
                }
                prop_assert!(c.len() <= 6);
                prop_assert!(c.pinned <= 12 * PAGE);
                for (l, _, _) in &held {
                    prop_assert!(c.reg.live.contains(&l.lkey));
                }
                prop_assert_eq!(c.reg.live.len(), c.len());
            }
            for (l, _, _) in held {
                c.release(l);
            }
        }
    }
}
