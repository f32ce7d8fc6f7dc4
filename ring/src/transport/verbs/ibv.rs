//! libibverbs, opened on first use (`dlopen`) instead of linked: a process
//! that never opens an RDMA device, as every same-host program under the
//! shim is, then neither maps nor relocates libibverbs and the netlink
//! libraries it loads, which would otherwise cost each process start about
//! as much again as the rest of the shim.
//!
//! The functions below stand for rdma-core's exported ones, with their
//! signatures (rdma-sys's types); rdma-sys's inline functions (posting,
//! polling) go through the context's operations and need no symbol.
//! Without the library each fails as the real one fails for want of
//! support: a null pointer, or an error code, with errno ENOSYS.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use rdma_sys::{
    _compat_ibv_port_attr, ibv_comp_channel, ibv_context, ibv_cq, ibv_device, ibv_device_attr,
    ibv_fork_status, ibv_gid, ibv_mr, ibv_pd, ibv_port_attr, ibv_qp, ibv_qp_attr, ibv_qp_init_attr,
    verbs_context, IBV_FORK_DISABLED,
};

/// The library's soname (the runtime package's, libibverbs1).
const SONAME: &CStr = c"libibverbs.so.1";

macro_rules! ibverbs {
    ($( $(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? = $missing:expr; )*) => {
        /// The library's entry points, once resolved.
        struct Lib {
            $( $name: unsafe extern "C" fn($($ty),*) $(-> $ret)?, )*
        }

        impl Lib {
            /// Every entry point from `handle`, or the first that is missing.
            fn resolve(handle: *mut c_void) -> Result<Lib, String> {
                Ok(Lib {
                    $( $name: {
                        let sym = concat!(stringify!($name), "\0");
                        // SAFETY: a handle dlopen returned (never closed) and a
                        // NUL-terminated name.
                        let p = unsafe { libc::dlsym(handle, sym.as_ptr().cast()) };
                        if p.is_null() {
                            return Err(format!("{} has no {}", SONAME.to_string_lossy(), stringify!($name)));
                        }
                        // SAFETY: libibverbs' definition of this function, whose C
                        // prototype the declaration above repeats (rdma-sys's
                        // bindings of verbs.h).
                        unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($ty),*) $(-> $ret)?>(p)
                        }
                    }, )*
                })
            }
        }

        $(
            $(#[$doc])*
            ///
            /// # Safety
            /// As for the C function of this name.
            pub unsafe fn $name($($arg: $ty),*) $(-> $ret)? {
                match open() {
                    // SAFETY: the library's own function, under the caller's
                    // contract for it.
                    Ok(lib) => unsafe { (lib.$name)($($arg),*) },
                    Err(_) => {
                        set_errno(libc::ENOSYS);
                        $missing
                    }
                }
            }
        )*
    };
}

ibverbs! {
    fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device = std::ptr::null_mut();
    fn ibv_free_device_list(list: *mut *mut ibv_device) = ();
    fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char = std::ptr::null();
    fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context = std::ptr::null_mut();
    fn ibv_close_device(context: *mut ibv_context) -> c_int = libc::ENOSYS;
    fn ibv_query_device(context: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int = libc::ENOSYS;
    /// The exported compat entry point, filling the part of
    /// `ibv_port_attr` that `_compat_ibv_port_attr` lays out.
    fn ibv_query_port(context: *mut ibv_context, port: u8, attr: *mut _compat_ibv_port_attr) -> c_int = libc::ENOSYS;
    fn ibv_query_gid(context: *mut ibv_context, port: u8, index: c_int, gid: *mut ibv_gid) -> c_int = libc::ENOSYS;
    fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd = std::ptr::null_mut();
    fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int = libc::ENOSYS;
    fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, length: usize, access: c_int) -> *mut ibv_mr = std::ptr::null_mut();
    fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int = libc::ENOSYS;
    fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel = std::ptr::null_mut();
    fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int = libc::ENOSYS;
    fn ibv_create_cq(context: *mut ibv_context, cqe: c_int, cq_context: *mut c_void, channel: *mut ibv_comp_channel, comp_vector: c_int) -> *mut ibv_cq = std::ptr::null_mut();
    fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int = libc::ENOSYS;
    fn ibv_get_cq_event(channel: *mut ibv_comp_channel, cq: *mut *mut ibv_cq, cq_context: *mut *mut c_void) -> c_int = -1;
    fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) = ();
    fn ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp = std::ptr::null_mut();
    fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int) -> c_int = libc::ENOSYS;
    fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int = libc::ENOSYS;
    /// Without the library no page is ever registered, so no fork can
    /// harm one; but nothing is fork-safe either: DISABLED.
    fn ibv_is_fork_initialized() -> ibv_fork_status = IBV_FORK_DISABLED;
}

/// Whether the library could be opened and resolved (once per process);
/// why not, if it could not (not installed, or too old).
pub fn available() -> Result<(), String> {
    open().map(|_| ())
}

fn open() -> Result<&'static Lib, String> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(|| {
        // SAFETY: a NUL-terminated soname; the handle is kept for the
        // process's life (its functions are called through it).
        let handle = unsafe { libc::dlopen(SONAME.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            // SAFETY: dlerror returns null or a NUL-terminated message of
            // this thread's last dl* failure.
            let why = unsafe { libc::dlerror() };
            return Err(if why.is_null() {
                format!("cannot open {}", SONAME.to_string_lossy())
            } else {
                // SAFETY: as above, non-null.
                unsafe { CStr::from_ptr(why) }
                    .to_string_lossy()
                    .into_owned()
            });
        }
        Lib::resolve(handle)
    })
    .as_ref()
    .map_err(Clone::clone)
}

fn set_errno(e: c_int) {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = e };
}

/// `ibv_query_port` as verbs.h defines it: through the context's extended
/// operation when its provider has one (the whole `ibv_port_attr`), else
/// through the exported compat function.
///
/// # Safety
/// `context` is an open device context and `attr` a writable
/// `ibv_port_attr`.
pub unsafe fn query_port(context: *mut ibv_context, port: u8, attr: *mut ibv_port_attr) -> c_int {
    // SAFETY: the caller's open context; a context whose abi_compat is
    // all ones is the `context` member of a provider's verbs_context
    // (verbs.h's verbs_get_ctx), whose `sz` says how far its operations
    // reach.
    unsafe {
        if (*context).abi_compat as usize == u32::MAX as usize {
            let vc = context
                .cast::<u8>()
                .sub(std::mem::offset_of!(verbs_context, context))
                .cast::<verbs_context>();
            let reach = std::mem::size_of::<verbs_context>()
                - std::mem::offset_of!(verbs_context, query_port);
            if (*vc).sz >= reach {
                if let Some(op) = (*vc).query_port {
                    return op(context, port, attr, std::mem::size_of::<ibv_port_attr>());
                }
            }
        }
        ibv_query_port(context, port, attr.cast())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every entry point above is a function of the installed library (a
    /// misspelt name would leave every RDMA connection on TCP).
    #[test]
    fn every_entry_point_resolves() {
        // SAFETY: a NUL-terminated soname (a second reference to the library
        // if the test loaded it already).
        let present = unsafe { libc::dlopen(SONAME.as_ptr(), libc::RTLD_LAZY) };
        if present.is_null() {
            eprintln!("skipped: {} is not installed", SONAME.to_string_lossy());
            return;
        }
        available().expect("libibverbs resolves");
        // SAFETY: a function of the library that takes no arguments.
        let status = unsafe { ibv_is_fork_initialized() };
        assert!(status <= rdma_sys::IBV_FORK_UNNEEDED, "{status}");
    }
}
