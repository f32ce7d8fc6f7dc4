//! `hooks!`, which defines exported hook functions.
//!
//! For each C function definition in its list, `hooks!` generates
//!
//! * `#[no_mangle] pub unsafe extern "C" fn NAME(...)`: the exported hook,
//!   whose body runs under an `AbortOnUnwind` bomb;
//! * `pub mod NAME { pub unsafe fn next(...) }`: the next definition. With
//!   `fallback(expr)`, it is declared in place (libc's, resolved lazily
//!   through a `Symbol`, or `expr`, the raw system call, when dlsym finds
//!   nothing); without, it is `real::NAME`, one of the functions the shim
//!   calls itself. Modules and functions live in different namespaces, so
//!   `read` (the hook) and `read::next` sit side by side;
//! * `resolve_all()`, which the constructor calls to resolve the next
//!   definitions declared in place.
//!
//! In a process that put itself under a seccomp filter every hook is the
//! next definition and nothing else (`process::sandboxed`).
//!
//! A body written `|next| { ... }` receives `next`, a safe `FnOnce() -> R`
//! that makes the call the program made (the same function, the hook's own
//! arguments) on the next definition: the forwarding call's `unsafe` is
//! argued once, here, for every hook.
//!
//! Variadic C functions (`fcntl`, `ioctl`, `open`) cannot be defined on
//! stable Rust; the hook modules define them with a fixed extra argument and
//! explain why that is sound on the x86-64 and AArch64 Linux ABIs.

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

/// Moved into a hook's forwarding closure, which makes it `FnOnce`: the
/// program's call is forwarded at most once.
pub struct Once;

/// The next definition of one hooked function (see the module docs).
macro_rules! next_definition {
    ($name:ident ($($arg:ident : $ty:ty),*) -> $ret:ty; $fallback:expr) => {
        #[doc = concat!("The next definition of `", stringify!($name), "`.")]
        #[allow(non_snake_case, dead_code)]
        pub mod $name {
            #[allow(unused_imports)]
            use super::*;

            static SYM: $crate::interpose::Symbol =
                $crate::interpose::Symbol::new(concat!(stringify!($name), "\0"));

            #[doc = concat!("Calls libc's `", stringify!($name), "` (the next \
                definition after ours), or its raw-syscall fallback.")]
            ///
            /// # Safety
            /// The C function's contract.
            #[inline]
            #[allow(clippy::too_many_arguments)]
            pub unsafe fn next($($arg: $ty),*) -> $ret {
                $crate::interpose::call_next!(SYM, ($($arg: $ty),*) -> $ret, $fallback)
            }

            pub(crate) fn resolve() {
                let _ = SYM.get();
            }
        }
    };
    ($name:ident ($($arg:ident : $ty:ty),*) -> $ret:ty) => {
        #[doc = concat!("The next definition of `", stringify!($name), "`: `real::",
            stringify!($name), "`.")]
        #[allow(non_snake_case, dead_code)]
        pub mod $name {
            #[allow(unused_imports)]
            use super::*;

            pub use $crate::real::$name as next;

            // The hook's prototype is exactly the one `real` declares.
            const _: unsafe fn($($ty),*) -> $ret = next;

            /// `real::resolve_all` resolves it.
            pub(crate) fn resolve() {}
        }
    };
}

/// See the module documentation.
macro_rules! hooks {
    ($(
        $(#[$meta:meta])*
        fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty;
            $(fallback ( $fallback:expr ))?
            $(| $next:ident |)?
            $body:block
    )*) => {
        $(
            $crate::hooks::define::next_definition!(
                $name ($($arg: $ty),*) -> $ret $(; $fallback)?
            );

            $(#[$meta])*
            ///
            /// # Safety
            /// Called by C code with the C function's contract.
            #[no_mangle]
            #[allow(non_snake_case, clippy::too_many_arguments, clippy::missing_safety_doc)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                if $crate::process::sandboxed() {
                    // SAFETY: the call our C caller made, unchanged, as in
                    // `forward` below: a sandboxed process gets libc's
                    // functions untouched (lifecycle::enter_sandbox).
                    return unsafe { $name::next($($arg),*) };
                }
                let bomb = $crate::hooks::define::AbortOnUnwind(stringify!($name));
                let once = $crate::hooks::define::Once;
                #[allow(unused_variables)]
                let forward = move || -> $ret {
                    let _once = once;
                    // SAFETY: this is the call our C caller made to us: the
                    // same function's next definition, with the arguments it
                    // gave us, unchanged, so the caller's contract for them
                    // is the one the call needs. The body cannot break that
                    // contract in safe code (freeing or unmapping what an
                    // argument points to takes `unsafe`, argued on its own),
                    // and `Once` makes this closure FnOnce: at most one call,
                    // as the caller asked for one.
                    unsafe { $name::next($($arg),*) }
                };
                $( let $next = forward; )?
                // A closure so that `return` in a body cannot skip the
                // `forget` below.
                #[allow(clippy::redundant_closure_call, unused_unsafe)]
                let ret = (|| -> $ret { $body })();
                ::core::mem::forget(bomb);
                // The body's values are dropped: signals it deferred run.
                $crate::interpose::defer::flush();
                ret
            }
        )*

        /// Resolves the next definitions declared in this module now
        /// (called by the constructor).
        pub fn resolve_all() {
            $( $name::resolve(); )*
        }
    };
}

/// `hooks!` for hooks that must tell the program's calls from the shim's
/// own (`interpose::caller`). Each entry names, after its prototype, the
/// function that does the work (`as NAME`) and the argument register just
/// past the prototype's on x86-64 and on AArch64; the exported symbol is a
/// naked stub that puts its return address there and jumps to `NAME`. The
/// body gets `$program`, a closure saying whether the program made the
/// call (a few loads; called only where it matters). syscall(2) calls
/// `NAME` directly with `caller::PROGRAM`.
macro_rules! caller_hooks {
    ($(
        $(#[$meta:meta])*
        fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty
            as $from:ident; ret($x86:ident, $a64:ident);
            $(fallback ( $fallback:expr ))?
            | $next:ident, $program:ident |
            $body:block
    )*) => {
        $(
            $crate::hooks::define::next_definition!(
                $name ($($arg: $ty),*) -> $ret $(; $fallback)?
            );

            $(#[$meta])*
            ///
            /// # Safety
            /// Called by C code with the C function's contract.
            #[cfg(target_arch = "x86_64")]
            #[unsafe(naked)]
            #[no_mangle]
            #[allow(unused_variables, clippy::missing_safety_doc)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                core::arch::naked_asm!(
                    concat!("mov ", stringify!($x86), ", [rsp]"),
                    "jmp {from}",
                    from = sym $from,
                )
            }

            $(#[$meta])*
            ///
            /// # Safety
            /// Called by C code with the C function's contract.
            #[cfg(target_arch = "aarch64")]
            #[unsafe(naked)]
            #[no_mangle]
            #[allow(unused_variables, clippy::missing_safety_doc)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                core::arch::naked_asm!(
                    concat!("mov ", stringify!($a64), ", x30"),
                    "b {from}",
                    from = sym $from,
                )
            }

            #[doc = concat!("The work of `", stringify!($name), "`, called by its stub \
                with the caller's return address.")]
            ///
            /// # Safety
            /// The C function's contract for the arguments.
            #[allow(non_snake_case, clippy::too_many_arguments)]
            pub unsafe extern "C" fn $from($($arg: $ty,)* caller: usize) -> $ret {
                if $crate::process::sandboxed() {
                    // SAFETY: as in `hooks!`: the C caller's call, unchanged.
                    return unsafe { $name::next($($arg),*) };
                }
                let bomb = $crate::hooks::define::AbortOnUnwind(stringify!($name));
                let once = $crate::hooks::define::Once;
                #[allow(unused_variables)]
                let forward = move || -> $ret {
                    let _once = once;
                    // SAFETY: as in `hooks!`: the call our C caller made, to
                    // the next definition, with its arguments unchanged,
                    // at most once.
                    unsafe { $name::next($($arg),*) }
                };
                let $next = forward;
                #[allow(unused_variables)]
                let $program = move || $crate::interpose::caller::is_program(caller);
                #[allow(clippy::redundant_closure_call, unused_unsafe)]
                let ret = (|| -> $ret { $body })();
                ::core::mem::forget(bomb);
                // As in `hooks!`.
                $crate::interpose::defer::flush();
                ret
            }
        )*

        /// Resolves the next definitions these hooks declare in place.
        pub fn resolve_caller_hooks() {
            $( $name::resolve(); )*
        }
    };
}

pub(crate) use {caller_hooks, hooks, next_definition};
