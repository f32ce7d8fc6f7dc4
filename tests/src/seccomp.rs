//! seccomp-BPF filters for the helpers that run the shim inside a sandbox
//! (x86-64 only, spelled out instruction by instruction: they are short).
//!
//! * [`errno_filter`]: the given calls fail with an errno, all else runs;
//! * [`sshd_preauth_filter`]: the allow-list OpenSSH's pre-authentication
//!   child (sandbox-seccomp-filter.c, as in Debian 12's 9.2p1) puts itself
//!   under: a few file calls fail with EACCES, the calls it needs run, and
//!   any other call kills the process (sshd: the thread, audit `sig=31`).
//!   [`sandbox_like_sshd`] also sets sshd's resource limits (no new file,
//!   no new process) and installs it.
//!
//! A call made under another ABI (x32, i386) is always killed: its numbers
//! mean different calls, and a test must never pass because a call slipped
//! through that way.

// linux/filter.h and linux/seccomp.h.
const BPF_LD: u16 = 0x00;
const BPF_JMP: u16 = 0x05;
const BPF_RET: u16 = 0x06;
const BPF_ALU: u16 = 0x04;
const BPF_W: u16 = 0x00;
const BPF_ABS: u16 = 0x20;
const BPF_JEQ: u16 = 0x10;
const BPF_JGE: u16 = 0x30;
const BPF_AND: u16 = 0x50;
const BPF_K: u16 = 0x00;
const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const RET_LOG: u32 = 0x7ffc_0000;
const RET_ALLOW: u32 = 0x7fff_0000;
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
/// x32 system calls carry this bit in their number.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// Offsets in `struct seccomp_data`: nr, arch, args[i] (low word first).
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
const fn off_arg_lo(i: u32) -> u32 {
    16 + 8 * i
}
const fn off_arg_hi(i: u32) -> u32 {
    16 + 8 * i + 4
}

pub type Filter = Vec<libc::sock_filter>;

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

/// Wrong ABI -> kill; leaves the call's number in the accumulator.
fn prologue() -> Filter {
    vec![
        stmt(BPF_LD | BPF_W | BPF_ABS, OFF_ARCH),
        // arch == x86-64: skip the kill.
        jump(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        stmt(BPF_RET | BPF_K, RET_KILL_PROCESS),
        stmt(BPF_LD | BPF_W | BPF_ABS, OFF_NR),
        // nr >= X32 bit: kill (the next instruction); else skip it.
        jump(BPF_JMP | BPF_JGE | BPF_K, X32_SYSCALL_BIT, 0, 1),
        stmt(BPF_RET | BPF_K, RET_KILL_PROCESS),
    ]
}

/// `nr` returns `ret`; any other call falls through.
fn on_call(p: &mut Filter, nr: i64, ret: u32) {
    p.push(jump(BPF_JMP | BPF_JEQ | BPF_K, nr as u32, 0, 1));
    p.push(stmt(BPF_RET | BPF_K, ret));
}

/// `nr` is allowed when its argument `arg` has no bit outside `mask`;
/// otherwise (or for another call) it falls through, the number reloaded.
fn on_call_masked(p: &mut Filter, nr: i64, arg: u32, mask: u64) {
    p.push(jump(BPF_JMP | BPF_JEQ | BPF_K, nr as u32, 0, 8));
    p.push(stmt(BPF_LD | BPF_W | BPF_ABS, off_arg_lo(arg)));
    p.push(stmt(BPF_ALU | BPF_AND | BPF_K, !(mask as u32)));
    p.push(jump(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 4));
    p.push(stmt(BPF_LD | BPF_W | BPF_ABS, off_arg_hi(arg)));
    p.push(stmt(BPF_ALU | BPF_AND | BPF_K, !((mask >> 32) as u32)));
    p.push(jump(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 1));
    p.push(stmt(BPF_RET | BPF_K, RET_ALLOW));
    p.push(stmt(BPF_LD | BPF_W | BPF_ABS, OFF_NR));
}

/// The calls in `nrs` fail with `errno`; everything else is allowed.
pub fn errno_filter(nrs: &[i64], errno: u32) -> Filter {
    let mut p = prologue();
    for &nr in nrs {
        on_call(&mut p, nr, RET_ERRNO | (errno & 0xffff));
    }
    p.push(stmt(BPF_RET | BPF_K, RET_ALLOW));
    p
}

/// What a call outside sshd's allow-list gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outside {
    /// Kills the process, as sshd's filter does (SIGSYS).
    Kill,
    /// Runs, and the kernel logs it (audit type 1326 in the kernel log):
    /// to list every such call a program makes in one run.
    Log,
    /// Fails with EPERM.
    Errno,
}

/// Calls sshd's pre-authentication filter turns down with EACCES.
const SSHD_DENIED: &[i64] = &[
    libc::SYS_lstat,
    libc::SYS_fstat,
    libc::SYS_open,
    libc::SYS_openat,
    libc::SYS_newfstatat,
    libc::SYS_stat,
    libc::SYS_shmget,
    libc::SYS_shmat,
    libc::SYS_shmdt,
    libc::SYS_statx,
];

/// Calls it lets through (mmap and mprotect only with read/write
/// protections, below).
const SSHD_ALLOWED: &[i64] = &[
    libc::SYS_brk,
    libc::SYS_clock_gettime,
    libc::SYS_close,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_futex,
    libc::SYS_geteuid,
    libc::SYS_getpgid,
    libc::SYS_getpid,
    libc::SYS_getrandom,
    libc::SYS_gettid,
    libc::SYS_gettimeofday,
    libc::SYS_getuid,
    libc::SYS_madvise,
    libc::SYS_mremap,
    libc::SYS_munmap,
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_ppoll,
    libc::SYS_poll,
    libc::SYS_pselect6,
    libc::SYS_read,
    libc::SYS_rt_sigprocmask,
    libc::SYS_select,
    libc::SYS_shutdown,
    libc::SYS_time,
    libc::SYS_write,
];

/// OpenSSH's pre-authentication sandbox filter for x86-64.
pub fn sshd_preauth_filter(outside: Outside) -> Filter {
    sshd_filter_and(&[], outside)
}

/// sshd's filter with the calls in `extra` allowed too.
pub fn sshd_filter_and(extra: &[i64], outside: Outside) -> Filter {
    let mut p = prologue();
    for &nr in SSHD_DENIED {
        on_call(&mut p, nr, RET_ERRNO | libc::EACCES as u32);
    }
    for &nr in SSHD_ALLOWED.iter().chain(extra) {
        on_call(&mut p, nr, RET_ALLOW);
    }
    let rw = (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_NONE) as u64;
    on_call_masked(&mut p, libc::SYS_mmap, 2, rw);
    on_call_masked(&mut p, libc::SYS_mprotect, 2, rw);
    p.push(stmt(
        BPF_RET | BPF_K,
        match outside {
            Outside::Kill => RET_KILL_PROCESS,
            Outside::Log => RET_LOG,
            Outside::Errno => RET_ERRNO | libc::EPERM as u32,
        },
    ));
    p
}

/// systemd's `SystemCallFilter=@system-service` with
/// `SystemCallErrorNumber=EPERM`, as this host's systemd spells it: the
/// calls `systemd-analyze syscall-filter` lists for the group (its
/// subgroups expanded) run, every other call fails with EPERM. None where
/// systemd-analyze or the kernel's x86-64 call numbers
/// (`asm/unistd_64.h`) are missing.
pub fn system_service_filter() -> Option<Filter> {
    let numbers = std::fs::read_to_string("/usr/include/x86_64-linux-gnu/asm/unistd_64.h").ok()?;
    let nr_of = |name: &str| {
        numbers.lines().find_map(|l| {
            let mut w = l.split_whitespace();
            match (w.next(), w.next(), w.next()) {
                (Some("#define"), Some(n), Some(v)) if n.strip_prefix("__NR_") == Some(name) => {
                    v.parse::<i64>().ok()
                }
                _ => None,
            }
        })
    };
    let mut names = Vec::new();
    expand_group("@system-service", &mut names)?;
    // Names of other architectures' calls have no number here.
    let mut nrs: Vec<i64> = names.iter().filter_map(|n| nr_of(n)).collect();
    nrs.sort_unstable();
    nrs.dedup();
    let mut p = prologue();
    for nr in nrs {
        on_call(&mut p, nr, RET_ALLOW);
    }
    p.push(stmt(BPF_RET | BPF_K, RET_ERRNO | libc::EPERM as u32));
    Some(p)
}

/// The call names in systemd's group `group`, subgroups expanded.
fn expand_group(group: &str, out: &mut Vec<String>) -> Option<()> {
    let o = std::process::Command::new("systemd-analyze")
        .args(["syscall-filter", group])
        .output()
        .ok()?;
    if !o.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    // The first line names the group itself; `#` lines describe it.
    for item in text.lines().skip(1).map(str::trim) {
        if item.is_empty() || item.starts_with('#') {
            continue;
        }
        if item.starts_with('@') {
            expand_group(item, out)?;
        } else {
            out.push(item.to_string());
        }
    }
    Some(())
}

/// Puts the calling thread under `filter` for good (PR_SET_NO_NEW_PRIVS
/// first, which lets an unprivileged process do it), through prctl.
pub fn install(filter: &Filter) -> std::io::Result<()> {
    install_with(filter, false)
}

/// As `install`, through seccomp(2) with SECCOMP_FILTER_FLAG_TSYNC: every
/// thread of the process goes under `filter` at once.
pub fn install_all_threads(filter: &Filter) -> std::io::Result<()> {
    install_with(filter, true)
}

fn install_with(filter: &Filter, all_threads: bool) -> std::io::Result<()> {
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: prctl and seccomp with documented arguments; `prog` and
    // `filter` outlive the calls (the kernel copies the program).
    let r = unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if all_threads {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                libc::SECCOMP_FILTER_FLAG_TSYNC,
                &prog as *const libc::sock_fprog,
            )
        } else {
            libc::c_long::from(libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog,
            ))
        }
    };
    match r {
        0 => Ok(()),
        // TSYNC: the thread that could not be synchronised.
        r if r > 0 => Err(std::io::Error::other(format!(
            "thread {r} not synchronised"
        ))),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Leaves at once with `FAIL msg` on stderr, making only the calls a
/// sandbox allows (write, then _exit: no unwinding, no exit handlers).
pub fn fail(msg: &str) -> ! {
    let b = format!("FAIL {msg}\n");
    // SAFETY: writing our own buffer to fd 2, then leaving at once.
    unsafe {
        libc::write(2, b.as_ptr().cast(), b.len());
        libc::_exit(1)
    }
}

/// What sshd's pre-authentication child does to itself: no file may grow,
/// no descriptor beyond one may be made (poll then refuses more than one
/// entry with EINVAL), no process created; then the filter. With
/// `keep_fds` the descriptor limit stays as it was (to list, with
/// [`Outside::Log`], the calls a program makes past a wait that the limit
/// would fail).
pub fn sandbox_like_sshd(outside: Outside, keep_fds: bool) -> std::io::Result<()> {
    let limit = |res, n| {
        let l = libc::rlimit {
            rlim_cur: n,
            rlim_max: n,
        };
        // SAFETY: setrlimit reads one struct of ours.
        if unsafe { libc::setrlimit(res, &l) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    limit(libc::RLIMIT_FSIZE, 0)?;
    if !keep_fds {
        limit(libc::RLIMIT_NOFILE, 1)?;
    }
    limit(libc::RLIMIT_NPROC, 0)?;
    install(&sshd_preauth_filter(outside))
}
