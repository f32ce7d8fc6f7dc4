//! `libringsock.so`: the LD_PRELOAD shim that moves TCP connections of
//! unmodified programs onto ring buffers, and leaves everything it cannot
//! accelerate as plain kernel TCP, behaving exactly as without the shim.
//!
//! The modules are layers, from the top down; each names only the ones
//! below it, so a call is followed downwards (tests/layers.rs checks it;
//! README.md maps the files):
//! * `hooks` — the exported libc functions, grouped by concern, made with
//!   the `hooks!` macro (hooks/define.rs);
//! * `lifecycle` — which sockets are tracked, the connect/accept decision,
//!   the exit drain;
//! * `dispatch` — blocking and readiness semantics for ring fds (recv and
//!   send, poll/select, epoll);
//! * `fdtable` — which fds are tracked and their shared state;
//! * `ring` — the ring layer, which this root installs; the layers above
//!   reach it only through
//! * `attached` — the interface to the ring connections (`AttachedConn`,
//!   `Attacher`);
//! * support: `sockaddr` (addresses), `real` (libc's definitions of the
//!   interposed functions the shim calls itself), `interpose` (finding the
//!   next definition, the re-entrancy guard), `config` (the knobs), `log`,
//!   `fdspace` (the shim's descriptors at high numbers), `signals` (EINTR
//!   restarts), `plock` (a lock for process-wide state that survives
//!   fork), `process` (pid, fork generation), `sys` (raw syscalls).

pub mod attached;
pub mod config;
pub mod dispatch;
pub mod fdspace;
pub mod fdtable;
pub mod hooks;
mod interpose;
pub mod keymap;
pub mod lifecycle;
pub mod log;
mod plock;
pub mod process;
pub mod real;
pub mod ring;
pub mod signals;
pub mod sockaddr;
pub mod sys;
#[cfg(test)]
mod tests;

pub use attached::{
    attacher, register_attacher, AttachedConn, Attacher, Decision, Errno, Ready, ReleaseKind,
    TcpReason, WaitFd, WaitFds,
};

/// Library constructor: parse the knobs, install the logger, register the
/// fork handlers and resolve every next symbol while the process is still
/// single-threaded and nothing is in a signal handler. Hooks that run even
/// earlier (from another library's constructor) initialise lazily.
extern "C" fn ringsock_init() {
    let cfg = config::get();
    process::pid();
    process::register_atfork();
    lifecycle::register_fork_handlers();
    real::resolve_all();
    hooks::resolve_all();
    interpose::caller::init();
    // Unit tests install their own test double instead.
    #[cfg(not(test))]
    if !cfg.disable {
        ring::install();
        // Registered first, so it runs after the program's own handlers
        // (which may still write): rings deliver what was written, as the
        // kernel does for sockets left open at exit.
        // SAFETY: registers a plain extern "C" function.
        unsafe { libc::atexit(drain_at_exit) };
    }
    #[cfg(not(test))]
    std::panic::set_hook(Box::new(|info| {
        log::always(format_args!("internal error: {info}"));
    }));
    ::log::debug!(
        "loaded (disable={}, ring {}x{} B, spin {} us)",
        cfg.disable,
        cfg.ring_slots,
        cfg.slot_size,
        cfg.spin_us
    );
}

#[cfg(not(test))]
extern "C" fn drain_at_exit() {
    lifecycle::drain_at_exit();
    interpose::defer::flush();
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = ringsock_init;
