//! The interposition machinery: the `hooks!` macro, next-symbol resolution,
//! the re-entrancy guard and the no-unwind boundary.
//!
//! `hooks!` takes a list of C function definitions and, for each, generates
//!
//! * `#[no_mangle] pub unsafe extern "C" fn NAME(...)`: the exported hook,
//!   whose body runs under an `AbortOnUnwind` bomb;
//! * `pub mod NAME { pub unsafe fn next(...) }`: the next definition
//!   (libc's), resolved lazily through a `Symbol`, or the raw-syscall
//!   fallback given in the definition when dlsym finds nothing. Modules and
//!   functions live in different namespaces, so `read` (the hook) and
//!   `read::next` (libc's read) sit side by side;
//! * `resolve_all()`, which the constructor calls to resolve every symbol of
//!   the list eagerly.
//!
//! Variadic C functions (`fcntl`, `ioctl`, `open`) cannot be defined on
//! stable Rust; the hook modules define them with a fixed extra argument and
//! explain why that is sound on the x86-64 and AArch64 Linux ABIs.

pub mod guard;
mod symbol;

pub use symbol::Symbol;

/// Aborts the process, with a log line naming the hook, if dropped during
/// unwinding. The hooks forget it on the normal path, so it costs nothing
/// there. With `panic = "abort"` (both our profiles) a panic never unwinds
/// anyway, and Rust aborts on unwinding out of an `extern "C"` function; the
/// bomb makes sure the abort says where it happened, also in unwinding test
/// builds.
pub struct AbortOnUnwind(pub &'static str);

impl Drop for AbortOnUnwind {
    #[cold]
    fn drop(&mut self) {
        crate::log::always(format_args!("panic inside hook {}; aborting", self.0));
        // SAFETY: abort never returns and is always safe to call.
        unsafe { libc::abort() }
    }
}

/// See the module documentation.
macro_rules! hooks {
    ($(
        $(#[$meta:meta])*
        fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty;
            fallback ( $fallback:expr )
            $body:block
    )*) => {
        $(
            #[allow(non_snake_case, dead_code)]
            #[doc = concat!("The next definition of `", stringify!($name), "`.")]
            pub mod $name {
                #[allow(unused_imports)]
                use super::*;

                pub(crate) static SYM: $crate::interpose::Symbol =
                    $crate::interpose::Symbol::new(concat!(stringify!($name), "\0"));

                #[doc = concat!("Calls libc's `", stringify!($name), "` (the next \
                    definition after ours), or its raw-syscall fallback.")]
                ///
                /// # Safety
                /// Same contract as the C function.
                #[inline]
                #[allow(clippy::too_many_arguments, clippy::missing_safety_doc)]
                pub unsafe fn next($($arg: $ty),*) -> $ret {
                    match SYM.get() {
                        Some(p) => {
                            // SAFETY: p is the address dlsym returned for this
                            // very name, whose C prototype is the one spelled
                            // out in this hook definition.
                            let f: unsafe extern "C" fn($($ty),*) -> $ret =
                                unsafe { ::core::mem::transmute(p) };
                            // SAFETY: forwarding the caller's arguments
                            // unchanged, under the caller's contract.
                            unsafe { f($($arg),*) }
                        }
                        // SAFETY: the fallback is the system call libc's
                        // function wraps, with the same arguments.
                        #[allow(unused_unsafe)]
                        None => unsafe { $fallback },
                    }
                }
            }

            $(#[$meta])*
            ///
            /// # Safety
            /// Called by C code with the C function's contract.
            #[no_mangle]
            #[allow(non_snake_case, clippy::too_many_arguments, clippy::missing_safety_doc)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                let bomb = $crate::interpose::AbortOnUnwind(stringify!($name));
                // A closure so that `return` in a body cannot skip the
                // `forget` below.
                #[allow(clippy::redundant_closure_call, unused_unsafe)]
                let ret = (|| -> $ret { $body })();
                ::core::mem::forget(bomb);
                ret
            }
        )*

        /// Resolves every symbol of this module now (called by the
        /// constructor).
        pub fn resolve_all() {
            $( let _ = $name::SYM.get(); )*
        }
    };
}

pub(crate) use hooks;
