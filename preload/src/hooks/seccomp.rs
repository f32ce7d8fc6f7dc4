//! Entering a seccomp sandbox: prctl(PR_SET_SECCOMP) and seccomp(2) (the
//! latter has no libc function; programs and libseccomp make it through
//! syscall(2), whose hook calls `before_syscall`).
//!
//! A filter may forbid any call the shim makes on its own (sshd's
//! pre-authentication child allows a few dozen calls and kills for the
//! rest), and once installed it cannot be lifted. So before the program's
//! call reaches the kernel, the process leaves every ring for its kernel
//! sockets and stops the shim's work (`lifecycle::enter_sandbox`); from
//! then on every hook is libc's function and nothing else. Whether the
//! call then succeeds does not matter: the rings are left either way, and
//! the connections go on, exactly, over TCP.
//!
//! `prctl` is variadic in C. It is defined here with four fixed
//! `unsigned long` arguments after the option, as glibc's definition reads
//! them: on the x86-64 and AArch64 Linux ABIs a variadic caller passes them
//! where fixed ones go (registers), so reading four is sound whatever the
//! caller passed, and the values it did not pass are only forwarded.

use libc::{c_int, c_long, c_ulong};

use super::define::hooks;
use crate::lifecycle;

hooks! {
    /// prctl(2).
    fn prctl(option: c_int, a2: c_ulong, a3: c_ulong, a4: c_ulong, a5: c_ulong) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_prctl, option, a2, a3, a4, a5) as c_int)
    |next| {
        if installs_by_prctl(option, a2) {
            lifecycle::enter_sandbox();
        }
        next()
    }
}

/// Whether prctl(`option`, `mode`, ...) puts the caller under seccomp.
fn installs_by_prctl(option: c_int, mode: c_ulong) -> bool {
    option == libc::PR_SET_SECCOMP
        && matches!(
            mode as u32,
            libc::SECCOMP_MODE_STRICT | libc::SECCOMP_MODE_FILTER
        )
}

/// Whether seccomp(`op`, ...) puts the caller under seccomp.
fn installs_by_seccomp(op: c_ulong) -> bool {
    matches!(
        op as u32,
        libc::SECCOMP_SET_MODE_STRICT | libc::SECCOMP_SET_MODE_FILTER
    )
}

/// syscall(2) with number `n` and arguments `a`: enters the sandbox first
/// if the call installs a filter (prctl or seccomp made that way).
pub fn before_syscall(n: c_long, a: &[c_long; 6]) {
    let installs = match n {
        libc::SYS_prctl => installs_by_prctl(a[0] as c_int, a[1] as c_ulong),
        libc::SYS_seccomp => installs_by_seccomp(a[0] as c_ulong),
        _ => false,
    };
    if installs {
        lifecycle::enter_sandbox();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_installing_calls_enter_the_sandbox() {
        let filter = libc::SECCOMP_MODE_FILTER as c_ulong;
        let strict = libc::SECCOMP_MODE_STRICT as c_ulong;
        assert!(installs_by_prctl(libc::PR_SET_SECCOMP, filter));
        assert!(installs_by_prctl(libc::PR_SET_SECCOMP, strict));
        assert!(!installs_by_prctl(libc::PR_SET_SECCOMP, 0));
        assert!(!installs_by_prctl(libc::PR_GET_SECCOMP, filter));
        assert!(!installs_by_prctl(libc::PR_SET_NO_NEW_PRIVS, 1));
        assert!(installs_by_seccomp(
            libc::SECCOMP_SET_MODE_FILTER as c_ulong
        ));
        assert!(installs_by_seccomp(
            libc::SECCOMP_SET_MODE_STRICT as c_ulong
        ));
        assert!(!installs_by_seccomp(
            libc::SECCOMP_GET_ACTION_AVAIL as c_ulong
        ));
        assert!(!installs_by_seccomp(
            libc::SECCOMP_GET_NOTIF_SIZES as c_ulong
        ));
    }
}
