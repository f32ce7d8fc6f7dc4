//! Harness for running real, unmodified programs under `libringsock.so`.
//!
//! * `shim()` finds the shim next to the test binary and (re)builds it with
//!   `cargo build -p ringsock-preload` into the same target directory once
//!   per test process, so the tests always exercise the current source;
//! * `Cmd` spawns a program with LD_PRELOAD set, bounded in time;
//! * `Server` is a background program that is killed (TERM, then KILL) and
//!   reaped when dropped, with its output kept in a temp dir;
//! * `Ctl` runs a private `ringsock-ctl daemon` (stopped on drop) that
//!   `Cmd::shimmed(..).ctl(&ctl)` programs use, and reads its `status
//!   --json` through `status`, the one typed reader of it (`Conn`, `Link`,
//!   `assert_all_shm`); programs without `.ctl` get a control socket path
//!   where no daemon answers (pure TCP);
//! * `netns::Hosts`: two network namespaces joined by a veth pair, for
//!   runs between "hosts" (also used by ringsock-ctl's own tests);
//! * `resources::holdings` and `rings_on_machine` count descriptors, ring
//!   memfds and mappings for leak checks; `leftovers::Tree` and `Baseline`
//!   check that a test's programs left no process and no ring behind;
//! * `seccomp`: filters for helpers that run the shim in a sandbox (a
//!   few calls failing; OpenSSH's pre-authentication allow-list);
//! * `echo::serve`: the echo server of the helper bins;
//! * `matrix::Matrix`: one real-program run as the program matrix checks
//!   it (servers and clients shimmed, watched, nothing left behind);
//! * `free_port`, `wait_port`, `TempDir`, `script`,
//!   `sha256` (sha2) and the `require!`
//!   macro, which skips a test (with a printed reason) only when a program
//!   is not installed.

pub mod args;
pub mod ctl;
pub mod echo;
pub mod http;
pub mod leftovers;
pub mod matrix;
pub mod netns;
pub mod nginx;
pub mod proc;
pub mod prom;
pub mod resources;
pub mod seccomp;
pub mod sha256;
pub mod shim;
pub mod status;
pub mod tmp;

pub use ctl::{Ctl, Watched};
pub use proc::{free_port, no_daemon_sock, run, wait_port, Cmd, Server};
pub use shim::{ctl_bin, shim, which};
pub use status::{assert_all_shm, links, show, Conn, Link};
pub use tmp::TempDir;

/// A file of tests/scripts (python and lua helpers the tests run).
pub fn script(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/scripts")
        .join(name)
}

/// Skips the calling test, with a reason on stdout, if any of the programs
/// is not installed; otherwise evaluates to nothing.
#[macro_export]
macro_rules! require {
    ($($bin:expr),+ $(,)?) => {
        $(
            if $crate::which($bin).is_none() {
                println!("SKIP: `{}` is not installed; install it to run this test", $bin);
                return;
            }
        )+
    };
}

/// The `conn I sent N HASH recv N HASH` lines streamcheck prints, in
/// order (by I), as (`N HASH` sent, `N HASH` received).
pub fn streamcheck_hashes(out: &str) -> Vec<(String, String)> {
    out.lines()
        .filter(|l| l.starts_with("conn "))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (format!("{} {}", w[3], w[4]), format!("{} {}", w[6], w[7]))
        })
        .collect()
}

/// Deterministic pseudo-random bytes (xorshift64*), for payloads whose
/// checksum the test knows in advance.
pub fn payload(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The words after `key` on the first line of a helper's output that
/// starts with it (`key v1 v2 ...`); panics with the output if none does.
pub fn out_field(out: &str, key: &str) -> Vec<String> {
    out.lines()
        .find(|l| l.starts_with(&format!("{key} ")) || *l == key)
        .unwrap_or_else(|| panic!("no `{key}` line in:\n{out}"))
        .split_whitespace()
        .skip(1)
        .map(str::to_string)
        .collect()
}

/// The number after `key` in a helper's output (see `out_field`).
pub fn out_num(out: &str, key: &str) -> u64 {
    out_field(out, key)[0]
        .parse()
        .unwrap_or_else(|_| panic!("`{key}` is not a number in:\n{out}"))
}

/// Panics if the shim complained on `stderr`: in pass-through mode, with
/// the default log level, it must stay silent.
pub fn assert_shim_silent(what: &str, stderr: &str) {
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("ringsock[")).collect();
    assert!(
        lines.is_empty(),
        "{what}: the shim logged:\n{}",
        lines.join("\n")
    );
}
