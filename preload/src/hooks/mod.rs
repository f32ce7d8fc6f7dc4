//! The exported hook functions, grouped by concern. Every one of them passes
//! straight through to libc for fds the shim does not track.

mod define;
pub mod epoll;
pub mod exec;
pub mod fd;
pub mod handlers;
mod hidden;
pub mod io;
#[cfg(feature = "verbs")]
pub mod memory;
pub mod poll;
pub mod process;
pub mod seccomp;
pub mod socket;
pub mod syscall;

/// Resolves every hook's next symbol (called by the constructor, so that no
/// first call at an awkward moment has to enter the dynamic linker).
pub fn resolve_all() {
    epoll::resolve_all();
    exec::resolve_all();
    fd::resolve_caller_hooks();
    handlers::resolve_all();
    io::resolve_all();
    #[cfg(feature = "verbs")]
    {
        memory::resolve_all();
        memory::resolve_allocators();
    }
    poll::resolve_all();
    process::resolve_all();
    process::resolve_vfork();
    seccomp::resolve_all();
    socket::resolve_all();
}
