//! A signal's action as the kernel's rt_sigaction(2) reads and writes it,
//! through raw system calls (async-signal-safe, errno left as it was).

use libc::{c_int, c_ulong};

use crate::sys;

/// The kernel's struct sigaction on x86-64 and AArch64.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct KernelAction {
    pub handler: usize,
    pub flags: c_ulong,
    pub restorer: usize,
    pub mask: u64,
}

/// rt_sigaction(sig, act, old); Err(errno) on failure.
fn rt_sigaction(
    sig: c_int,
    act: Option<&KernelAction>,
    old: Option<&mut KernelAction>,
) -> Result<(), c_int> {
    let e = sys::errno();
    let ap = act.map_or(std::ptr::null(), |a| a as *const KernelAction);
    let op = old.map_or(std::ptr::null_mut(), |o| o as *mut KernelAction);
    // SAFETY: `ap` is null or a valid action, `op` null or writable, and 8
    // is the kernel's sigset size.
    let r = unsafe { sys::sys_call!(libc::SYS_rt_sigaction, sig, ap, op, 8) };
    let out = if r < 0 { Err(sys::errno()) } else { Ok(()) };
    sys::set_errno(e);
    out
}

/// What the kernel does when it delivers to an SA_RESETHAND action: the
/// handler becomes SIG_DFL and the flags and mask stay. Done only if the
/// action's handler still is `expect` (a program install that came
/// meanwhile stands); `flags` maps the held flags to those to keep.
pub fn reset_if(sig: c_int, expect: usize, flags: impl FnOnce(c_ulong) -> c_ulong) {
    let mut k = KernelAction::default();
    if rt_sigaction(sig, None, Some(&mut k)).is_ok() && k.handler == expect {
        k.handler = libc::SIG_DFL;
        k.flags = flags(k.flags);
        let _ = rt_sigaction(sig, Some(&k), None);
    }
}
