//! Per-socket (per open file description) state shared by every fd that
//! refers to it in this process.
//!
//! All fields are atomics (or are only touched under a reference): a stale
//! reader that lost a race with `close` may still look at `refs` and `conn`
//! of a recycled object (see pool.rs), which must not be a data race.

use std::any::Any;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ptr;
use std::sync::atomic::{
    fence, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
use std::sync::{Arc, Mutex};

use libc::pid_t;

use crate::attached::{AttachedConn, Errno, TcpMemo, TcpReason};
use crate::process;

/// What an fd table entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A TCP socket (AF_INET/AF_INET6, SOCK_STREAM): a candidate before
    /// connect/accept, then either plain TCP or ring-attached.
    Tcp = 1,
    /// A TCP socket on which listen() succeeded.
    Listener = 2,
    /// An epoll instance that holds ring-attached registrations.
    Epoll = 3,
}

/// What a tracked socket currently is, as the hooks see it.
pub enum Socket<'a> {
    /// Plain kernel TCP with metadata (candidate, or decided for TCP).
    Tcp,
    /// A listening socket: accepted connections become candidates.
    Listener,
    /// Ring-attached: data hooks dispatch to the connection.
    Ring(&'a dyn AttachedConn),
}

const F_NONBLOCK: u32 = 1;
/// socket() done, connect() not yet decided: the only window in which a ring
/// can still be attached by connect.
const F_PRECONNECT: u32 = 2;
/// `pre_epoll` may hold registrations (set under its lock when one is
/// recorded): where it is clear, the list is empty and unallocated, and
/// nobody takes its lock.
const F_PRE_EPOLL: u32 = 4;

type ConnBox = Arc<dyn AttachedConn>;

/// What the epoll layer keeps with an epoll instance (`Kind::Epoll`),
/// opaque to the fd table.
pub type EpollSlot = dyn Any + Send + Sync;

type SlotBox = Box<EpollSlot>;

/// Attached connections alive in this process: lets poll/select/epoll skip
/// scanning their sets when there are none (always, in pass-through mode).
static RINGS: AtomicUsize = AtomicUsize::new(0);

/// Number of ring-attached connections alive in this process.
#[inline]
pub fn rings_alive() -> usize {
    RINGS.load(Ordering::Relaxed)
}

pub struct FdState {
    /// Table slots + borrows; 0 = free (in the pool).
    refs: AtomicUsize,
    /// Free-list link (pool.rs), meaningful only while free.
    next_free: AtomicPtr<FdState>,
    /// Table slots (fds) referring to this object in this process.
    fds: AtomicU32,
    kind: AtomicU8,
    tcp_reason: AtomicU8,
    flags: AtomicU32,
    family: AtomicI32,
    /// Receive/send timeouts (SO_RCVTIMEO/SO_SNDTIMEO) in ns; 0 = none.
    rcvtimeo_ns: AtomicU64,
    sndtimeo_ns: AtomicU64,
    /// The process that attached or last claimed the connection, and the
    /// fork generation it did so in.
    owner_pid: AtomicI32,
    owner_epoch: AtomicU64,
    /// Boxed `Arc<dyn AttachedConn>` once attached; set once, freed on
    /// recycle.
    conn: AtomicPtr<ConnBox>,
    /// Boxed `EpollSlot` of an epoll instance once created; set once,
    /// freed on recycle.
    epoll: AtomicPtr<SlotBox>,
    /// Threads waiting on this epoll instance in the kernel alone (before
    /// its slot held a ring).
    kernel_waiters: AtomicU32,
    /// Epoll registrations (epfd, events, data) made while the socket was
    /// pre-connect, recorded only when a ring layer is registered: a ring
    /// attached by connect() must take them over (nginx adds upstream
    /// sockets to its epoll set before connecting).
    pre_epoll: Mutex<Vec<PreEpoll>>,
    /// Epoll fds this socket's ring was added to (at most `HOMES_MAX`):
    /// their sets hold a reference to this object, which the last close
    /// must take back at once, as the kernel drops a closed file from its
    /// epoll instances (close.rs).
    /// Lock-free (-1 = empty), so that a fork cannot copy it locked.
    epoll_homes: [AtomicI32; HOMES_MAX],
    /// A listener's address while it is bound to one IP, which every
    /// socket it accepts has as its local address: family and port, then
    /// the IP's two halves (`set_bound`); all zero when not known.
    bound: [AtomicU64; 3],
    /// The ring layer's `TcpMemo` of a connection decided plain TCP: the
    /// skipped destination (packed as `bound`), when it was connected, and
    /// its report's ticket; all zero when there is none.
    memo_dest: [AtomicU64; 3],
    memo_since: AtomicU64,
    memo_report: AtomicU64,
    /// TCP_DEFER_ACCEPT as the kernel would report it, kept here while the
    /// kernel socket has it off (`defer_accept.rs`); 0: none kept.
    defer_accept: AtomicI32,
}

/// Epoll fds remembered per socket; a socket added to more instances than
/// this is dropped from the others by their sweeps instead.
const HOMES_MAX: usize = 8;

/// Stores `addr` in three words: family and port, then the IP's two
/// halves; the first word alone, zero, says none. The first word is
/// stored last (Release), so a reader that sees it sees the rest.
fn store_addr(w: &[AtomicU64; 3], addr: Option<SocketAddr>) {
    let Some(a) = addr else {
        w[0].store(0, Ordering::Release);
        return;
    };
    let (tag, ip) = match a.ip() {
        IpAddr::V4(v4) => (4u64, u128::from(u32::from(v4))),
        IpAddr::V6(v6) => (6u64, u128::from(v6)),
    };
    w[1].store((ip >> 64) as u64, Ordering::Relaxed);
    w[2].store(ip as u64, Ordering::Relaxed);
    w[0].store(tag << 16 | u64::from(a.port()), Ordering::Release);
}

/// The address `store_addr` stored, if any.
fn load_addr(w: &[AtomicU64; 3]) -> Option<SocketAddr> {
    let w0 = w[0].load(Ordering::Acquire);
    let ip =
        u128::from(w[1].load(Ordering::Relaxed)) << 64 | u128::from(w[2].load(Ordering::Relaxed));
    let ip = match w0 >> 16 {
        4 => IpAddr::V4(Ipv4Addr::from(ip as u32)),
        6 => IpAddr::V6(Ipv6Addr::from(ip)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, w0 as u16))
}

/// One epoll registration of a pre-connect socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreEpoll {
    pub epfd: i32,
    pub events: u32,
    pub data: u64,
}

impl FdState {
    /// A free object, as the pool creates it.
    pub(super) const fn new_free() -> Self {
        FdState {
            refs: AtomicUsize::new(0),
            next_free: AtomicPtr::new(ptr::null_mut()),
            fds: AtomicU32::new(0),
            kind: AtomicU8::new(0),
            tcp_reason: AtomicU8::new(0),
            flags: AtomicU32::new(0),
            family: AtomicI32::new(0),
            rcvtimeo_ns: AtomicU64::new(0),
            sndtimeo_ns: AtomicU64::new(0),
            owner_pid: AtomicI32::new(0),
            owner_epoch: AtomicU64::new(0),
            conn: AtomicPtr::new(ptr::null_mut()),
            epoll: AtomicPtr::new(ptr::null_mut()),
            kernel_waiters: AtomicU32::new(0),
            pre_epoll: Mutex::new(Vec::new()),
            epoll_homes: [const { AtomicI32::new(-1) }; HOMES_MAX],
            bound: [const { AtomicU64::new(0) }; 3],
            memo_dest: [const { AtomicU64::new(0) }; 3],
            memo_since: AtomicU64::new(0),
            memo_report: AtomicU64::new(0),
            defer_accept: AtomicI32::new(0),
        }
    }

    pub(super) fn next_free(&self) -> *const FdState {
        self.next_free.load(Ordering::Relaxed)
    }

    pub(super) fn set_next_free(&self, p: *const FdState) {
        self.next_free.store(p.cast_mut(), Ordering::Relaxed);
    }

    /// Prepares a freshly allocated object; the caller holds its only
    /// reference.
    pub(super) fn init(&self, kind: Kind, family: i32, nonblocking: bool) {
        self.kind.store(kind as u8, Ordering::Relaxed);
        self.family.store(family, Ordering::Relaxed);
        let mut f = if kind == Kind::Tcp { F_PRECONNECT } else { 0 };
        if nonblocking {
            f |= F_NONBLOCK;
        }
        self.flags.store(f, Ordering::Relaxed);
        self.kernel_waiters.store(0, Ordering::Relaxed);
        // Publishing the object happens later with a Release store of the
        // table slot; refs = 1 is the allocator's reference.
        self.refs.store(1, Ordering::Relaxed);
    }

    // ---- reference counting (see fdtable/mod.rs for the protocol) ----

    /// Takes a reference unless the object is free. Works on stale pointers.
    pub(super) fn try_acquire(&self) -> bool {
        let mut r = self.refs.load(Ordering::Relaxed);
        loop {
            if r == 0 {
                return false;
            }
            match self
                .refs
                .compare_exchange_weak(r, r + 1, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(now) => r = now,
            }
        }
    }

    /// Takes another reference; the caller already holds one.
    pub(super) fn retain(&self) {
        self.refs.fetch_add(1, Ordering::Relaxed);
    }

    /// Drops a reference; the last one resets the object and frees it.
    pub(super) fn release(&'static self) {
        if self.refs.fetch_sub(1, Ordering::Release) != 1 {
            return;
        }
        fence(Ordering::Acquire);
        let conn = self.conn.swap(ptr::null_mut(), Ordering::AcqRel);
        if !conn.is_null() {
            // SAFETY: conn came from Box::into_raw in `attach`, and the swap
            // gave us the only copy of the pointer.
            drop(unsafe { Box::from_raw(conn) });
            RINGS.fetch_sub(1, Ordering::Relaxed);
            // Only a ring is added to epoll sets as one (`note_epoll_home`).
            self.take_epoll_homes().for_each(drop);
        }
        let ep = self.epoll.swap(ptr::null_mut(), Ordering::AcqRel);
        if !ep.is_null() {
            // SAFETY: as above, from Box::into_raw in `epoll_slot_or_init`.
            drop(unsafe { Box::from_raw(ep) });
        }
        if self.flags.load(Ordering::Relaxed) & F_PRE_EPOLL != 0 {
            drop(std::mem::take(&mut *self.pre_epoll_lock()));
        }
        self.set_bound(None);
        self.memo_dest[0].store(0, Ordering::Relaxed);
        self.memo_report.store(0, Ordering::Relaxed);
        self.defer_accept.store(0, Ordering::Relaxed);
        self.fds.store(0, Ordering::Relaxed);
        self.kind.store(0, Ordering::Relaxed);
        self.tcp_reason.store(0, Ordering::Relaxed);
        self.flags.store(0, Ordering::Relaxed);
        self.family.store(0, Ordering::Relaxed);
        self.rcvtimeo_ns.store(0, Ordering::Relaxed);
        self.sndtimeo_ns.store(0, Ordering::Relaxed);
        self.owner_pid.store(0, Ordering::Relaxed);
        self.owner_epoch.store(0, Ordering::Relaxed);
        super::pool::free(self);
    }

    /// One more fd refers to this object.
    pub(super) fn add_fd(&self) {
        self.fds.fetch_add(1, Ordering::Relaxed);
    }

    /// One fd less; true if it was the last one in this process.
    pub(super) fn remove_fd(&self) -> bool {
        self.fds.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// Number of fds referring to this object in this process.
    pub fn fd_count(&self) -> u32 {
        self.fds.load(Ordering::Acquire)
    }

    // ---- what it is ----

    pub fn kind(&self) -> Option<Kind> {
        match self.kind.load(Ordering::Relaxed) {
            1 => Some(Kind::Tcp),
            2 => Some(Kind::Listener),
            3 => Some(Kind::Epoll),
            _ => None,
        }
    }

    /// The socket view; None for epoll objects.
    pub fn socket(&self) -> Option<Socket<'_>> {
        if let Some(c) = self.conn() {
            return Some(Socket::Ring(c));
        }
        match self.kind()? {
            Kind::Tcp => Some(Socket::Tcp),
            Kind::Listener => Some(Socket::Listener),
            Kind::Epoll => None,
        }
    }

    pub fn family(&self) -> i32 {
        self.family.load(Ordering::Relaxed)
    }

    pub fn set_listener(&self) {
        // Only a not-yet-attached TCP socket can become a listener.
        let _ = self.kind.compare_exchange(
            Kind::Tcp as u8,
            Kind::Listener as u8,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        self.flags.fetch_and(!F_PRECONNECT, Ordering::Relaxed);
    }

    /// True between socket() and the connect decision.
    pub fn is_preconnect(&self) -> bool {
        self.flags.load(Ordering::Relaxed) & F_PRECONNECT != 0
    }

    /// Records the TCP-or-ring decision; ends the pre-connect window.
    pub fn set_tcp_reason(&self, r: TcpReason) {
        self.tcp_reason.store(r as u8, Ordering::Relaxed);
        let was = self
            .flags
            .fetch_and(!(F_PRECONNECT | F_PRE_EPOLL), Ordering::Relaxed);
        if was & F_PRE_EPOLL != 0 {
            drop(std::mem::take(&mut *self.pre_epoll_lock()));
        }
    }

    fn pre_epoll_lock(&self) -> std::sync::MutexGuard<'_, Vec<PreEpoll>> {
        // A panic aborts the process, so the lock cannot be poisoned in
        // practice; recover the guard anyway.
        self.pre_epoll.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Mirrors a successful epoll_ctl on this pre-connect socket.
    pub fn note_pre_epoll(&self, op: i32, epfd: i32, events: u32, data: u64) {
        if !self.is_preconnect() {
            return;
        }
        let mut v = self.pre_epoll_lock();
        v.retain(|r| r.epfd != epfd);
        if op != libc::EPOLL_CTL_DEL {
            // Flagged before it is pushed: whoever finds the flag clear
            // comes before this registration, as if it had taken the lock
            // first.
            self.flags.fetch_or(F_PRE_EPOLL, Ordering::Relaxed);
            v.push(PreEpoll { epfd, events, data });
        }
    }

    /// Takes the recorded pre-connect epoll registrations.
    pub fn take_pre_epoll(&self) -> Vec<PreEpoll> {
        if self.flags.fetch_and(!F_PRE_EPOLL, Ordering::Relaxed) & F_PRE_EPOLL == 0 {
            return Vec::new();
        }
        std::mem::take(&mut *self.pre_epoll_lock())
    }

    /// Records a listener's own address (None: unknown, or not one every
    /// accepted socket shares).
    pub fn set_bound(&self, addr: Option<SocketAddr>) {
        store_addr(&self.bound, addr);
    }

    /// A listener's own address, if `set_bound` recorded one.
    pub fn bound(&self) -> Option<SocketAddr> {
        load_addr(&self.bound)
    }

    /// Keeps the ring layer's memo of a connection decided plain TCP.
    /// The TCP_DEFER_ACCEPT value kept for the program (0: none).
    pub fn defer_accept(&self) -> i32 {
        self.defer_accept.load(Ordering::Relaxed)
    }

    pub fn set_defer_accept(&self, v: i32) {
        self.defer_accept.store(v, Ordering::Relaxed);
    }

    pub fn set_tcp_memo(&self, m: TcpMemo) {
        if let Some((_, since)) = m.skipped {
            self.memo_since.store(since, Ordering::Relaxed);
        }
        store_addr(&self.memo_dest, m.skipped.map(|(d, _)| d));
        self.memo_report.store(m.report, Ordering::Relaxed);
    }

    /// What `set_tcp_memo` kept (the default if nothing).
    pub fn tcp_memo(&self) -> TcpMemo {
        TcpMemo {
            skipped: load_addr(&self.memo_dest)
                .map(|d| (d, self.memo_since.load(Ordering::Relaxed))),
            report: self.memo_report.load(Ordering::Relaxed),
        }
    }

    /// Remembers that the ring was added to epoll fd `epfd`.
    pub fn note_epoll_home(&self, epfd: i32) {
        if self
            .epoll_homes
            .iter()
            .any(|h| h.load(Ordering::Relaxed) == epfd)
        {
            return;
        }
        for h in &self.epoll_homes {
            if h.compare_exchange(-1, epfd, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }

    /// Takes the epoll fds the ring was added to.
    pub fn take_epoll_homes(&self) -> impl Iterator<Item = i32> + '_ {
        // A load first: most sockets were never in an epoll set, and a
        // close then costs no read-modify-write.
        self.epoll_homes
            .iter()
            .filter(|h| h.load(Ordering::Relaxed) >= 0)
            .map(|h| h.swap(-1, Ordering::Relaxed))
            .filter(|&fd| fd >= 0)
    }

    pub fn tcp_reason(&self) -> TcpReason {
        TcpReason::from_u8(self.tcp_reason.load(Ordering::Relaxed))
    }

    // ---- mirrored socket options ----

    /// O_NONBLOCK as last set through socket/accept4/fcntl/ioctl(FIONBIO).
    /// The flag belongs to the open file description, shared with dup'd fds
    /// (which share this object too).
    pub fn nonblocking(&self) -> bool {
        self.flags.load(Ordering::Relaxed) & F_NONBLOCK != 0
    }

    pub fn set_nonblocking(&self, on: bool) {
        if on {
            self.flags.fetch_or(F_NONBLOCK, Ordering::Relaxed);
        } else {
            self.flags.fetch_and(!F_NONBLOCK, Ordering::Relaxed);
        }
    }

    pub fn rcvtimeo_ns(&self) -> u64 {
        self.rcvtimeo_ns.load(Ordering::Relaxed)
    }

    pub fn sndtimeo_ns(&self) -> u64 {
        self.sndtimeo_ns.load(Ordering::Relaxed)
    }

    pub fn set_timeouts(&self, rcv: Option<u64>, snd: Option<u64>) {
        if let Some(v) = rcv {
            self.rcvtimeo_ns.store(v, Ordering::Relaxed);
        }
        if let Some(v) = snd {
            self.sndtimeo_ns.store(v, Ordering::Relaxed);
        }
    }

    // ---- the ring ----

    /// The attached connection, if any. Valid while the caller holds a
    /// reference to this object (an `FdRef`).
    pub fn conn(&self) -> Option<&dyn AttachedConn> {
        let p = self.conn.load(Ordering::Acquire);
        // SAFETY: a non-null conn stays valid until the object is recycled,
        // which cannot happen while the caller holds a reference.
        (!p.is_null()).then(|| unsafe { &**p })
    }

    /// A reference of its own to the attached connection, if any.
    pub fn conn_arc(&self) -> Option<Arc<dyn AttachedConn>> {
        let p = self.conn.load(Ordering::Acquire);
        // SAFETY: as `conn`: valid while the caller holds a reference.
        (!p.is_null()).then(|| unsafe { (*p).clone() })
    }

    /// True if a connection is attached. Cheap and safe on stale pointers:
    /// the hooks' filter before taking a reference.
    #[inline]
    pub(super) fn has_conn(&self) -> bool {
        !self.conn.load(Ordering::Relaxed).is_null()
    }

    /// `has_conn` for filters outside the table (`fdtable::get_if`).
    #[inline]
    pub fn conn_attached(&self) -> bool {
        self.has_conn()
    }

    /// Attaches `conn`; the calling process becomes its owner. Fails (giving
    /// the Arc back) if one is attached already or this is not a TCP socket.
    pub fn attach(&self, conn: Arc<dyn AttachedConn>) -> Result<(), Arc<dyn AttachedConn>> {
        if self.kind() != Some(Kind::Tcp) {
            return Err(conn);
        }
        let boxed = Box::into_raw(Box::new(conn));
        match self.conn.compare_exchange(
            ptr::null_mut(),
            boxed,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                RINGS.fetch_add(1, Ordering::Relaxed);
                self.mark_claimed();
                self.flags.fetch_and(!F_PRECONNECT, Ordering::Relaxed);
                Ok(())
            }
            Err(_) => {
                // SAFETY: boxed was never published.
                Err(*unsafe { Box::from_raw(boxed) })
            }
        }
    }

    fn mark_claimed(&self) {
        self.owner_pid.store(process::pid(), Ordering::Relaxed);
        self.owner_epoch
            .store(process::fork_epoch(), Ordering::Relaxed);
    }

    /// True if this process has claimed the connection in the current fork
    /// generation.
    pub fn claimed_here(&self) -> bool {
        self.owner_pid.load(Ordering::Relaxed) == process::pid()
            && self.owner_epoch.load(Ordering::Relaxed) == process::fork_epoch()
    }

    /// Makes sure this process may use the attached connection: after a
    /// fork, the first process to use it claims it (AttachedConn::claim).
    #[inline]
    pub fn claim(&self, conn: &dyn AttachedConn) -> Result<(), Errno> {
        if self.claimed_here() {
            return Ok(());
        }
        conn.claim()?;
        self.mark_claimed();
        Ok(())
    }

    /// The process that attached or last claimed the connection.
    pub fn owner_pid(&self) -> pid_t {
        self.owner_pid.load(Ordering::Relaxed)
    }

    // ---- epoll ----

    /// The epoll layer's object of this epoll instance, made by `make` on
    /// first use.
    pub fn epoll_slot_or_init(&self, make: impl FnOnce() -> SlotBox) -> &EpollSlot {
        let p = self.epoll.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: valid until recycle; the caller holds a reference.
            return unsafe { &**p };
        }
        let fresh = Box::into_raw(Box::new(make()));
        match self.epoll.compare_exchange(
            ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            // SAFETY: we published fresh; valid until recycle.
            Ok(_) => unsafe { &**fresh },
            Err(existing) => {
                // SAFETY: fresh was never published.
                drop(unsafe { Box::from_raw(fresh) });
                // SAFETY: as for `p` above.
                unsafe { &**existing }
            }
        }
    }

    /// The epoll layer's object, if it was ever made.
    pub fn epoll_slot(&self) -> Option<&EpollSlot> {
        let p = self.epoll.load(Ordering::Acquire);
        // SAFETY: valid until recycle; the caller holds a reference.
        (!p.is_null()).then(|| unsafe { &**p })
    }

    /// A thread goes to sleep in this epoll instance through the kernel
    /// alone; returns the epoll layer's object if it was made meanwhile
    /// (the thread must then wait through it, after `kernel_wait_end`).
    /// Pairs with `kernel_waiters`: the count is stored before the slot is
    /// loaded, the slot before the count is loaded (SeqCst fences), so
    /// either this thread sees the slot or the one that made it sees the
    /// count.
    pub fn kernel_wait_begin(&self) -> Option<&EpollSlot> {
        self.kernel_waiters.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.epoll_slot()
    }

    pub fn kernel_wait_end(&self) {
        self.kernel_waiters.fetch_sub(1, Ordering::Relaxed);
    }

    /// Threads asleep in this instance through the kernel alone (see
    /// `kernel_wait_begin`); read after the slot was made.
    pub fn kernel_waiters(&self) -> u32 {
        fence(Ordering::SeqCst);
        self.kernel_waiters.load(Ordering::Relaxed)
    }
}
