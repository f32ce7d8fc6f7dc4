//! The machinery of interposition: reaching the definition an interposed
//! function has after ours (`Symbol`, `call_next!`, `libc_fns!`), and
//! telling the shim's own calls from the program's (`guard`).
//!
//! Inside `libringsock.so` a call to `connect` binds to our own hook, the
//! preloaded library being first in the symbol scope; the next definition
//! (libc's) is found with `dlsym(RTLD_NEXT)` instead, and where dlsym finds
//! nothing the raw system call it wraps stands in for it.

pub mod caller;
pub mod defer;
pub mod guard;
mod symbol;

pub use symbol::Symbol;

/// The body of a next definition: calls the function at `$sym`'s address
/// with the C prototype given, or evaluates `$fallback` (the system call
/// the function wraps, with the same arguments) when dlsym found nothing.
/// Used inside an `unsafe fn` whose caller holds the C function's contract
/// for the arguments.
macro_rules! call_next {
    ($sym:expr, ($($arg:ident : $ty:ty),*) -> $ret:ty, $fallback:expr) => {{
        let Some(p) = $sym.get() else {
            #[allow(unused_unsafe)]
            // SAFETY: the fallback is the system call the C function wraps,
            // given the same arguments under the same contract.
            return unsafe { $fallback };
        };
        // SAFETY: p is the address dlsym returned for this very name,
        // whose C prototype is the one spelled out here.
        let f: unsafe extern "C" fn($($ty),*) -> $ret = unsafe { ::core::mem::transmute(p) };
        // SAFETY: the caller of the enclosing `unsafe fn` holds the C
        // function's contract for these arguments.
        unsafe { f($($arg),*) }
    }};
}

/// Declares, for each C function of the list, `pub unsafe fn NAME(...)`
/// (libc's definition through `call_next!`, its `Symbol` in a `sym`
/// module), and `resolve_all()`, which resolves every one of them now.
macro_rules! libc_fns {
    ($(
        $(#[$meta:meta])*
        fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty;
            fallback ( $fallback:expr )
    )*) => {
        /// The lazily resolved next definitions.
        #[allow(non_upper_case_globals)]
        mod sym {
            $(
                $(#[$meta])*
                pub(super) static $name: $crate::interpose::Symbol =
                    $crate::interpose::Symbol::new(concat!(stringify!($name), "\0"));
            )*
        }

        $(
            $(#[$meta])*
            #[doc = concat!("libc's `", stringify!($name), "` (the next definition \
                after ours), or its raw-syscall fallback.")]
            ///
            /// # Safety
            /// The C function's contract.
            #[inline]
            #[allow(clippy::too_many_arguments)]
            pub unsafe fn $name($($arg: $ty),*) -> $ret {
                $crate::interpose::call_next!(sym::$name, ($($arg: $ty),*) -> $ret, $fallback)
            }
        )*

        /// Resolves every definition of this list now (the constructor).
        pub fn resolve_all() {
            $( $(#[$meta])* let _ = sym::$name.get(); )*
        }
    };
}

pub(crate) use {call_next, libc_fns};
