//! Two pinned processes: fork, pin each to its own core, collect the
//! child's exit status.

use std::io;

/// Pins the calling process to `cpu` (ignored when the machine has fewer
/// cores: the measurement is then noted as unpinned).
pub fn pin(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu % num_cpus(), &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Online cores of the machine. Not `available_parallelism`: that follows
/// our own affinity mask, which `pin` narrows to one core.
pub fn num_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize
}

/// Runs `child` in a forked process pinned to core 1 while the caller,
/// pinned to core 0, runs `parent`; returns the parent's result after the
/// child exited successfully.
pub fn run_pair<R>(
    child: impl FnOnce() -> io::Result<()>,
    parent: impl FnOnce() -> io::Result<R>,
) -> io::Result<R> {
    // SAFETY: the benchmark is single-threaded when it forks.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        pin(1);
        let code = match child() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("ringbench child: {e}");
                1
            }
        };
        // SAFETY: leave the forked child without running the parent's
        // destructors or atexit handlers.
        unsafe { libc::_exit(code) };
    }
    pin(0);
    let result = parent();
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    pin_all();
    let r = result?;
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        return Err(io::Error::other("benchmark child failed"));
    }
    Ok(r)
}

/// Undoes `pin` for the parent between runs.
fn pin_all() {
    // SAFETY: as in `pin`.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for c in 0..num_cpus() {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
