//! A child started without an exec of the program's own: `system`,
//! `popen`, and `posix_spawn` whose file actions dup the connection onto
//! the child's stdout (the copy survives whatever the socket's
//! close-on-exec). The child writes on the connection, the program then
//! writes more and reads the peer's answer: the peer sees both writes in
//! order, and the connection goes on.

use std::ffi::CString;
use std::os::fd::RawFd;

use crate::ops;
use crate::role::Role;
use crate::scenario::{sc, Scenario};

pub fn list() -> Vec<Scenario> {
    vec![
        sc("system_child_writes", "system(): the shell writes on the inherited connection, then the program", system_writes),
        sc("popen_child_writes", "popen(): the shell writes on the inherited connection, then the program", popen_writes),
        sc("spawn_dup2_child_writes", "posix_spawn with the connection dup'd onto the child's stdout (close-on-exec set): the child writes, then the program", spawn_writes),
    ]
}

/// The bytes the child writes.
const CHILD: &str = "child";

/// Sets or clears FD_CLOEXEC on `fd`.
fn set_cloexec(fd: RawFd, on: bool) {
    let flag = if on { libc::FD_CLOEXEC } else { 0 };
    // SAFETY: F_SETFD on a descriptor of ours.
    unsafe { libc::fcntl(fd, libc::F_SETFD, flag) };
}

/// The shell command that writes CHILD on `fd` (a single digit: dash takes
/// no more).
fn write_cmd(r: &Role, fd: RawFd) -> CString {
    if fd > 9 {
        r.note(format!(
            "descriptor {fd} is above 9: the shell cannot name it"
        ));
    }
    CString::new(format!("printf {CHILD} >&{fd}")).expect("no NUL")
}

/// The server's side: `child` makes the child write, then the program
/// writes and the peer answers; the client's side reads both and answers.
fn exchange(r: &mut Role, child: impl FnOnce(&Role, RawFd)) {
    let fd = r.open();
    if r.is_server() {
        child(r, fd);
        r.call(ops::send(fd, b"parent", 0));
        r.barrier("sent");
        r.await_bytes(fd, 4);
        r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
    } else {
        r.barrier("sent");
        r.await_bytes(fd, CHILD.len() + 6);
        r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
        r.call(ops::send(fd, b"back", 0));
    }
    r.barrier("end");
}

fn system_writes(r: &mut Role) {
    exchange(r, |r, fd| {
        set_cloexec(fd, false);
        let cmd = write_cmd(r, fd);
        // SAFETY: a NUL-terminated command.
        let st = unsafe { libc::system(cmd.as_ptr()) };
        r.note(format!("system = exit {}", libc::WEXITSTATUS(st)));
    });
}

fn popen_writes(r: &mut Role) {
    exchange(r, |r, fd| {
        set_cloexec(fd, false);
        let cmd = write_cmd(r, fd);
        // SAFETY: NUL-terminated command and mode; the stream is closed
        // below.
        let st = unsafe {
            let f = libc::popen(cmd.as_ptr(), c"r".as_ptr());
            if f.is_null() {
                -1
            } else {
                libc::pclose(f)
            }
        };
        r.note(format!("popen = exit {}", libc::WEXITSTATUS(st)));
    });
}

fn spawn_writes(r: &mut Role) {
    exchange(r, |r, fd| {
        set_cloexec(fd, true);
        let script = CString::new(format!("printf {CHILD}")).expect("no NUL");
        let argv = [
            c"sh".as_ptr(),
            c"-c".as_ptr(),
            script.as_ptr(),
            std::ptr::null(),
        ];
        let mut pid: libc::pid_t = 0;
        // SAFETY: the file actions object lives for the calls and is
        // destroyed after them; argv is NULL-terminated and outlives the
        // spawn; environ is the process's environment.
        let rc = unsafe {
            let mut fa: libc::posix_spawn_file_actions_t = std::mem::zeroed();
            libc::posix_spawn_file_actions_init(&mut fa);
            libc::posix_spawn_file_actions_adddup2(&mut fa, fd, 1);
            extern "C" {
                static environ: *const *mut libc::c_char;
            }
            let rc = libc::posix_spawn(
                &mut pid,
                c"/bin/sh".as_ptr(),
                &fa,
                std::ptr::null(),
                argv.as_ptr().cast(),
                environ,
            );
            libc::posix_spawn_file_actions_destroy(&mut fa);
            rc
        };
        let mut st = 0;
        if rc == 0 {
            // SAFETY: waiting for the child we spawned.
            unsafe { libc::waitpid(pid, &mut st, 0) };
        }
        r.note(format!(
            "posix_spawn = {rc}, exit {}",
            libc::WEXITSTATUS(st)
        ));
    });
}
