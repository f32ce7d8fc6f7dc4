//! seccomp_run: runs a program with some system calls failing, to test
//! what the shim does when the kernel refuses it a resource.
//!
//! ```text
//! seccomp_run [--errno N] SYSCALL[,SYSCALL...] -- PROGRAM [ARGS...]
//! ```
//!
//! SYSCALL is a name this helper knows (`memfd_create`, `eventfd2`) or an
//! x86-64 system call number. It installs a seccomp-BPF filter that makes
//! those calls fail with errno N (default ENOSYS, as on a kernel without
//! them) and lets everything else through, then execs PROGRAM. The filter
//! is inherited by PROGRAM and its children and cannot be removed
//! (PR_SET_NO_NEW_PRIVS makes that possible without privileges). A system
//! call made under another ABI (x32, i386) is killed: its numbers mean
//! different calls, and a test must never pass because a call slipped
//! through that way.

use std::ffi::CString;

// linux/filter.h and linux/seccomp.h, spelled out here: the filter is
// short enough to read instruction by instruction.
const BPF_LD: u16 = 0x00;
const BPF_JMP: u16 = 0x05;
const BPF_RET: u16 = 0x06;
const BPF_W: u16 = 0x00;
const BPF_ABS: u16 = 0x20;
const BPF_JEQ: u16 = 0x10;
const BPF_JGE: u16 = 0x30;
const BPF_K: u16 = 0x00;
const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
/// x32 system calls carry this bit in their number.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// Offsets in `struct seccomp_data`.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

fn usage() -> ! {
    eprintln!("usage: seccomp_run [--errno N] SYSCALL[,SYSCALL...] -- PROGRAM [ARGS...]");
    std::process::exit(64);
}

fn syscall_nr(name: &str) -> u32 {
    match name {
        "memfd_create" => libc::SYS_memfd_create as u32,
        "eventfd2" => libc::SYS_eventfd2 as u32,
        n => n.parse().unwrap_or_else(|_| {
            eprintln!("seccomp_run: unknown system call `{n}`");
            std::process::exit(64)
        }),
    }
}

/// The filter: wrong ABI -> kill; one of `nrs` -> errno; else allow.
fn program(nrs: &[u32], errno: u32) -> Vec<libc::sock_filter> {
    let mut p = vec![
        stmt(BPF_LD | BPF_W | BPF_ABS, OFF_ARCH),
        // arch == x86-64: skip the kill.
        jump(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        stmt(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_LD | BPF_W | BPF_ABS, OFF_NR),
        // nr >= X32 bit: kill (the next instruction); else skip it.
        jump(BPF_JMP | BPF_JGE | BPF_K, X32_SYSCALL_BIT, 0, 1),
        stmt(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
    ];
    for &nr in nrs {
        // Match: fall into the errno return; else skip it.
        p.push(jump(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, 1));
        p.push(stmt(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (errno & 0xffff)));
    }
    p.push(stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
    p
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
    let nrs: Vec<u32> = calls.split(',').map(syscall_nr).collect();
    let filter = program(&nrs, errno);
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: prctl with documented arguments; `prog` and `filter` outlive
    // the call (the kernel copies the program).
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            eprintln!(
                "seccomp_run: PR_SET_NO_NEW_PRIVS: {}",
                std::io::Error::last_os_error()
            );
            std::process::exit(70);
        }
        if libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &prog as *const libc::sock_fprog,
        ) != 0
        {
            eprintln!(
                "seccomp_run: PR_SET_SECCOMP: {}",
                std::io::Error::last_os_error()
            );
            std::process::exit(70);
        }
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
