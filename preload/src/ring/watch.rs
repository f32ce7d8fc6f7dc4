//! The kernel sockets under this process's ring connections, watched by
//! the background thread: a peer that leaves the ring (its leave header),
//! closes or dies shows there first, and must be answered even while the
//! program does not call into the shim (it computes, or sleeps on
//! something else). The peer's successor waits for the bytes this side
//! resends, and a leaver waits for our acknowledgement.
//!
//! One edge-triggered epoll set per process (a forked child makes its own
//! and registers the connections it inherited that it uses); each socket
//! is registered under an id that maps to the connection, weakly, so a
//! connection that went away is simply skipped.

use std::collections::BTreeMap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use super::tracked::Tracked;
use crate::plock::PLock;
use crate::process;

/// The epoll fd and the pid it belongs to.
static EP: AtomicI32 = AtomicI32::new(-1);
static EP_PID: AtomicI32 = AtomicI32::new(0);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static WATCHED: PLock<Watched> = PLock::new(Watched::new(), Watched::new);

/// How many watched connections want their wire checked
/// (`Tracked::wire_checked`); changed under the WATCHED lock, read
/// without it on every turn of the background thread.
static WIRES: AtomicUsize = AtomicUsize::new(0);

/// The watched connections by id, each with whether its wire is checked.
struct Watched {
    conns: BTreeMap<u64, (Weak<dyn Tracked>, bool)>,
}

impl Watched {
    const fn new() -> Watched {
        Watched {
            conns: BTreeMap::new(),
        }
    }

    fn insert(&mut self, id: u64, conn: &Arc<dyn Tracked>) {
        let wire = conn.wire_checked();
        if wire {
            WIRES.fetch_add(1, Ordering::Relaxed);
        }
        self.conns.insert(id, (Arc::downgrade(conn), wire));
    }

    fn remove(&mut self, id: u64) {
        if let Some((_, true)) = self.conns.remove(&id) {
            WIRES.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// This process's epoll fd, made on first use (and anew in a forked
/// child, whose inherited one is its parent's).
fn epoll_fd() -> RawFd {
    let me = process::pid();
    if EP_PID.load(Ordering::Acquire) == me {
        return EP.load(Ordering::Acquire);
    }
    let mut map = WATCHED.lock();
    if EP_PID.load(Ordering::Acquire) == me {
        return EP.load(Ordering::Acquire);
    }
    *map = Watched::new();
    WIRES.store(0, Ordering::Relaxed);
    // SAFETY: plain epoll creation.
    let fd =
        unsafe { crate::sys::sys_call!(libc::SYS_epoll_create1, libc::EPOLL_CLOEXEC) } as RawFd;
    let fd = if fd >= 0 {
        crate::fdspace::high(fd)
    } else {
        -1
    };
    let old = EP.swap(fd, Ordering::AcqRel);
    if old >= 0 {
        crate::fdspace::close(old);
    }
    EP_PID.store(me, Ordering::Release);
    fd
}

/// The fd the background thread polls for watched sockets, if any.
pub fn fd() -> Option<RawFd> {
    if EP_PID.load(Ordering::Acquire) != process::pid() {
        return None;
    }
    let fd = EP.load(Ordering::Acquire);
    (fd >= 0).then_some(fd)
}

/// Watches `socket` (our duplicate of the connection's kernel socket).
pub fn watch(conn: &Arc<dyn Tracked>, socket: RawFd) {
    let ep = epoll_fd();
    if ep < 0 || socket < 0 {
        return;
    }
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    WATCHED.lock().insert(id, conn);
    let mut ev = libc::epoll_event {
        events: (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLET) as u32,
        u64: id,
    };
    // SAFETY: ev is a valid event; the fds are ours.
    let r = unsafe {
        crate::sys::sys_call!(
            libc::SYS_epoll_ctl,
            ep,
            libc::EPOLL_CTL_ADD,
            socket,
            &mut ev as *mut libc::epoll_event,
        )
    };
    if r < 0 {
        WATCHED.lock().remove(id);
        return;
    }
    let st = conn.report_state();
    st.watch_id.store(id, Ordering::Release);
    st.watch_pid.store(process::pid(), Ordering::Release);
}

/// Watches `conn` in this process unless it already is (a forked child
/// that uses a connection it inherited).
pub fn ensure(conn: &Arc<dyn Tracked>) {
    let st = conn.report_state();
    if st.watch_pid.load(Ordering::Acquire) != process::pid() {
        st.watch_id.store(0, Ordering::Release);
        watch(conn, conn.socket_fd());
    }
}

/// Stops watching `socket` for `conn` (it left the ring, or is released).
pub fn unwatch(conn: &dyn Tracked, socket: RawFd) {
    let st = conn.report_state();
    if st.watch_pid.load(Ordering::Acquire) != process::pid() {
        return;
    }
    let id = st.watch_id.swap(0, Ordering::AcqRel);
    if id == 0 {
        return;
    }
    WATCHED.lock().remove(id);
    if let Some(ep) = fd() {
        if socket >= 0 {
            // SAFETY: removing our own registration.
            unsafe {
                crate::sys::sys_call!(
                    libc::SYS_epoll_ctl,
                    ep,
                    libc::EPOLL_CTL_DEL,
                    socket,
                    std::ptr::null_mut::<libc::epoll_event>(),
                )
            };
        }
    }
}

/// Answers every watched socket with news (the background thread, after
/// its poll saw the epoll fd readable).
pub fn serve() {
    let Some(ep) = fd() else {
        return;
    };
    let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 32];
    loop {
        // SAFETY: evs has room for 32 events; zero timeout.
        let n = unsafe {
            crate::sys::sys_call!(
                libc::SYS_epoll_wait,
                ep,
                evs.as_mut_ptr(),
                evs.len() as i32,
                0,
            )
        };
        if n <= 0 {
            return;
        }
        for ev in &evs[..n as usize] {
            let id = ev.u64;
            let conn = WATCHED.lock().conns.get(&id).and_then(|(c, _)| c.upgrade());
            match conn {
                Some(c) if !c.is_released() => c.check_socket(),
                _ => WATCHED.lock().remove(id),
            }
        }
        if (n as usize) < evs.len() {
            return;
        }
    }
}

/// Whether this process watches a connection whose wire the background
/// thread must check (`check_wires`).
pub fn has_wires() -> bool {
    EP_PID.load(Ordering::Acquire) == process::pid() && WIRES.load(Ordering::Relaxed) > 0
}

/// Looks for a failed wire under every watched connection that wants it
/// (the background thread, every `WIRE_CHECK_NS`).
pub fn check_wires() {
    if EP_PID.load(Ordering::Acquire) != process::pid() {
        return;
    }
    let mut conns: Vec<Arc<dyn Tracked>> = Vec::new();
    {
        let mut w = WATCHED.lock();
        let mut gone = Vec::new();
        for (id, (c, wire)) in &w.conns {
            if *wire {
                match c.upgrade() {
                    Some(c) => conns.push(c),
                    None => gone.push(*id),
                }
            }
        }
        for id in gone {
            w.remove(id);
        }
    }
    for c in conns {
        if !c.is_released() {
            c.check_wire();
        }
    }
}
