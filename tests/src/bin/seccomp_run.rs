//! seccomp_run: runs a program with some system calls failing, to test
//! what the shim does when the kernel refuses it a resource.
//!
//! ```text
//! seccomp_run [--errno N] SYSCALL[,SYSCALL...] -- PROGRAM [ARGS...]
//! seccomp_run @system-service -- PROGRAM [ARGS...]
//! ```
//!
//! SYSCALL is a name this helper knows (`memfd_create`, `eventfd2`) or an
//! x86-64 system call number. It installs a seccomp-BPF filter that makes
//! those calls fail with errno N (default ENOSYS, as on a kernel without
//! them) and lets everything else through, then execs PROGRAM; with
//! `@system-service`, the filter systemd's `SystemCallFilter=@system-service`
//! makes (`SystemCallErrorNumber=EPERM`: other calls fail). The filter
//! is inherited by PROGRAM and its children and cannot be removed
//! (PR_SET_NO_NEW_PRIVS makes that possible without privileges). A system
//! call made under another ABI (x32, i386) is killed: its numbers mean
//! different calls, and a test must never pass because a call slipped
//! through that way.

use std::ffi::CString;

use ringsock_integration::seccomp;

fn usage() -> ! {
    eprintln!(
        "usage: seccomp_run [--errno N] SYSCALL[,SYSCALL...] | @system-service -- PROGRAM [ARGS...]"
    );
    std::process::exit(64);
}

fn syscall_nr(name: &str) -> i64 {
    match name {
        "memfd_create" => libc::SYS_memfd_create,
        "eventfd2" => libc::SYS_eventfd2,
        n => n.parse().unwrap_or_else(|_| {
            eprintln!("seccomp_run: unknown system call `{n}`");
            std::process::exit(64)
        }),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut errno = libc::ENOSYS as u32;
    let mut i = 0;
    if args.first().map(String::as_str) == Some("--errno") {
        errno = args
            .get(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| usage());
        i = 2;
    }
    let calls = args.get(i).unwrap_or_else(|| usage());
    if args.get(i + 1).map(String::as_str) != Some("--") {
        usage();
    }
    let rest = &args[i + 2..];
    if rest.is_empty() {
        usage();
    }
    let filter = if calls == "@system-service" {
        seccomp::system_service_filter().unwrap_or_else(|| {
            eprintln!("seccomp_run: no systemd-analyze to spell @system-service");
            std::process::exit(69)
        })
    } else {
        let nrs: Vec<i64> = calls.split(',').map(syscall_nr).collect();
        seccomp::errno_filter(&nrs, errno)
    };
    if let Err(e) = seccomp::install(&filter) {
        eprintln!("seccomp_run: installing the filter: {e}");
        std::process::exit(70);
    }
    let cargs: Vec<CString> = rest
        .iter()
        .map(|s| CString::new(s.as_str()).unwrap_or_else(|_| usage()))
        .collect();
    let mut argv: Vec<*const libc::c_char> = cargs.iter().map(|c| c.as_ptr()).collect();
    argv.push(std::ptr::null());
    // SAFETY: argv is a NULL-terminated array of C strings that outlive
    // the call; execvp returns only on failure.
    unsafe { libc::execvp(argv[0], argv.as_ptr()) };
    eprintln!(
        "seccomp_run: exec {}: {}",
        rest[0],
        std::io::Error::last_os_error()
    );
    std::process::exit(127);
}
