//! Which ring connections an exec hands to the new image: those a
//! descriptor without FD_CLOEXEC holds when the exec happens.
//!
//! In a process that owns its memory the table follows every descriptor,
//! so its numbers say it. A child that shares our memory (vfork, as
//! python's subprocess and posix_spawn use) has descriptors of its own
//! that the table does not follow: it dup2s a connection onto 0 and 1
//! (`stdin=conn`) and closes the first number, or closes every number. Its
//! open descriptors are read from /proc/self/fd and matched to the
//! table's connections by their sockets' ports.

use libc::c_int;

use crate::fdtable;

/// The table's numbers whose connections the exec'd image gets.
pub fn at_exec(shared: bool) -> Vec<c_int> {
    let table: Vec<c_int> = (0..fdtable::capacity() as i32)
        .filter(|&fd| fdtable::attached(fd).is_some())
        .collect();
    if !shared {
        return table.into_iter().filter(|&fd| inherited(fd)).collect();
    }
    let mut held = vec![false; table.len()];
    let listed = each_open_fd(|fd| {
        if !inherited(fd) || listening(fd) {
            return;
        }
        // Named once per descriptor: a process may hold thousands of rings.
        let Some(local) = crate::sockaddr::query(fd, false) else {
            return;
        };
        let peer = crate::sockaddr::query(fd, true);
        for (i, &t) in table.iter().enumerate() {
            if !held[i] {
                let r = fdtable::attached(t);
                held[i] = r
                    .as_ref()
                    .and_then(|r| r.conn())
                    .is_some_and(|c| c.may_be_socket(local, peer));
            }
        }
    });
    if !listed {
        // No /proc: every connection may be there.
        return table;
    }
    table
        .into_iter()
        .zip(held)
        .filter_map(|(fd, h)| h.then_some(fd))
        .collect()
}

/// Whether `fd` is open without FD_CLOEXEC.
fn inherited(fd: c_int) -> bool {
    crate::sys::fcntl(fd, libc::F_GETFD, 0).is_ok_and(|f| f & libc::FD_CLOEXEC == 0)
}

/// Whether `fd` is a listening socket (it shares its port with the
/// connections it accepted, and is none of them).
fn listening(fd: c_int) -> bool {
    crate::sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_ACCEPTCONN).is_some_and(|on| on != 0)
}

/// Calls `f` with each descriptor open in this process (from
/// /proc/self/fd, read with raw system calls into a stack buffer); false
/// when the directory cannot be read.
fn each_open_fd(mut f: impl FnMut(c_int)) -> bool {
    // SAFETY: a NUL-terminated path; the result is checked.
    let dir = unsafe {
        crate::sys::sys_call!(
            libc::SYS_openat,
            libc::AT_FDCWD,
            c"/proc/self/fd".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    } as c_int;
    if dir < 0 {
        return false;
    }
    let mut buf = [0u8; 4096];
    let mut ok = true;
    loop {
        // SAFETY: buf is ours and its length is given.
        let n = unsafe {
            crate::sys::sys_call!(libc::SYS_getdents64, dir, buf.as_mut_ptr(), buf.len())
        };
        if n < 0 {
            ok = false;
            break;
        }
        if n == 0 {
            break;
        }
        let mut off = 0usize;
        while off + 19 < n as usize {
            // struct linux_dirent64: d_ino u64, d_off i64, d_reclen u16,
            // d_type u8, then the NUL-terminated name.
            let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
            if reclen == 0 {
                break;
            }
            let name = &buf[off + 19..(off + reclen).min(n as usize)];
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            if let Some(fd) = std::str::from_utf8(name)
                .ok()
                .and_then(|s| s.parse::<c_int>().ok())
            {
                if fd != dir {
                    f(fd);
                }
            }
            off += reclen;
        }
    }
    crate::sys::close(dir);
    ok
}

/// glibc's `posix_spawn_file_actions_t` (2.36, unchanged since 2.x).
#[repr(C)]
struct FileActions {
    allocated: c_int,
    used: c_int,
    actions: *const SpawnAction,
}

/// glibc's `struct __spawn_action`: a tag, then a union whose first ints
/// are the descriptors (it holds pointers, so it starts at byte 8 and the
/// whole is 32 bytes on 64-bit targets).
#[repr(C)]
struct SpawnAction {
    tag: c_int,
    _pad: c_int,
    args: [c_int; 6],
}

const DO_CLOSE: c_int = 0;
const DO_DUP2: c_int = 1;
const DO_OPEN: c_int = 2;
const DO_CHDIR: c_int = 3;
const DO_FCHDIR: c_int = 4;
const DO_CLOSEFROM: c_int = 5;
const DO_TCSETPGRP: c_int = 6;

/// The table's numbers whose connections a posix_spawn child gets, its
/// file actions run (a dup2 onto stdin of a CLOEXEC connection passes
/// it; a close of its only inherited number does not). An action this
/// does not know makes every connection a survivor.
///
/// # Safety
/// `actions` is null or points at file actions initialized by glibc, as
/// posix_spawn's caller guarantees.
pub unsafe fn at_spawn(actions: *const libc::posix_spawn_file_actions_t) -> Vec<c_int> {
    // (number in the child, the table's number of its connection, inherited)
    let mut held: Vec<(c_int, c_int, bool)> = (0..fdtable::capacity() as i32)
        .filter(|&fd| fdtable::attached(fd).is_some())
        .map(|fd| (fd, fd, inherited(fd)))
        .collect();
    let all: Vec<c_int> = held.iter().map(|h| h.1).collect();
    if !actions.is_null() {
        // SAFETY: per the caller, glibc's initialized file actions; `used`
        // entries of `actions` are valid.
        let fa = unsafe { &*actions.cast::<FileActions>() };
        let used = usize::try_from(fa.used).unwrap_or(0);
        if (used > 0 && fa.actions.is_null()) || fa.used > fa.allocated {
            return all;
        }
        for i in 0..used {
            // SAFETY: i < used, within the array glibc allocated.
            let a = unsafe { &*fa.actions.add(i) };
            let fd = a.args[0];
            match a.tag {
                DO_CLOSE | DO_OPEN => held.retain(|h| h.0 != fd),
                DO_DUP2 if a.args[1] == fd => {
                    // glibc clears FD_CLOEXEC for a dup2 onto itself.
                    held.iter_mut()
                        .filter(|h| h.0 == fd)
                        .for_each(|h| h.2 = true);
                }
                DO_DUP2 => {
                    let new = a.args[1];
                    let from = held.iter().find(|h| h.0 == fd).map(|h| h.1);
                    held.retain(|h| h.0 != new);
                    if let Some(t) = from {
                        held.push((new, t, true));
                    }
                }
                DO_CLOSEFROM => held.retain(|h| h.0 < fd),
                DO_CHDIR | DO_FCHDIR | DO_TCSETPGRP => {}
                _ => return all,
            }
        }
    }
    let mut out: Vec<c_int> = held.into_iter().filter(|h| h.2).map(|h| h.1).collect();
    out.sort_unstable();
    out.dedup();
    out
}
