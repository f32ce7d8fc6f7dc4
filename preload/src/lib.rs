//! `libringsock.so`: the LD_PRELOAD shim that moves TCP connections of
//! unmodified programs onto ring buffers, and leaves everything it cannot
//! accelerate as plain kernel TCP, behaving exactly as without the shim.
//!
//! Layout (see README.md):
//! * `interpose` — the `hooks!` macro, next-symbol resolution, re-entrancy guard;
//! * `hooks` — the exported libc functions, grouped by concern;
//! * `real` — libc's definitions, for the shim's own calls;
//! * `fdtable` — which fds are tracked and their shared state;
//! * `attached` — the interface to the ring data path (`AttachedConn`,
//!   `Attacher`);
//! * `lifecycle` — which sockets are tracked, connect/accept decisions;
//! * `dispatch` — blocking and readiness semantics for ring fds;
//! * `ring` — the shared-memory ring layer (the `Attacher`);
//! * `config`, `log`, `process`, `signals`, `sockaddr`, `sys` — support.

pub mod attached;
pub mod config;
pub mod dispatch;
pub mod fdspace;
pub mod fdtable;
pub mod hooks;
mod interpose;
pub mod lifecycle;
pub mod log;
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
    real::resolve_all();
    hooks::resolve_all();
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
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = ringsock_init;
