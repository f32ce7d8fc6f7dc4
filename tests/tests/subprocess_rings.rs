//! python's subprocess runs its child with vfork, closes the numbers
//! above 2 there and execs: the exec hook in that child must not take the
//! parent's ring connections off their rings for numbers the new image
//! never gets (closed or CLOEXEC there), and must for one it does get
//! (pass_fds, dup2'd onto the child's stdin and stdout, by posix_spawn's
//! file actions, or inherited by system()'s or popen()'s shell). Whether
//! a step ran on the ring is read from TCP_INFO: the kernel socket
//! carries none of the echo's bytes while it does
//! (tests/scripts/subprocess_rings.py).

use std::time::Duration;

use ringsock_integration::{assert_shim_silent, require, Ctl};

mod common;
use common::{field, script};

#[test]
fn subprocess_children_leave_the_rings_they_do_not_get() {
    require!("python3");
    let ctl = Ctl::start();
    let (out, err) = ctl
        .shimmed("python3")
        .arg(script("subprocess_rings.py"))
        // Every connection on a ring, however short (the policy is not
        // what this tests).
        .env("RINGSOCK_SHORT_MS", "0")
        .spawn()
        .wait_ok(Duration::from_secs(60));
    assert_shim_silent("subprocess_rings.py", &err);
    for step in ["first", "close_fds", "pipes", "cloexec"] {
        assert_eq!(
            field(&out, step),
            ["kernel", "0", "intact", "True"],
            "{step}:\n{out}"
        );
    }
    // The passed number reached the exec'd image: the connection left its
    // ring for the kernel socket, which then carried the echo.
    let passed = field(&out, "passed");
    assert_eq!(passed[2..], ["intact", "True"], "{out}");
    assert!(passed[1].parse::<u64>().unwrap() >= 64 << 10, "{out}");
    // Given as stdin and stdout (dup2 onto 0 and 1 in the vfork child),
    // the connection leaves its ring and the child talks on it.
    for step in ["stdin_close_fds", "stdin_keep_fds"] {
        let before = format!("{step}_before");
        assert_eq!(
            field(&out, &before),
            ["kernel", "0", "intact", "True"],
            "{out}"
        );
        assert_eq!(field(&out, step), ["got:hello"], "{out}");
    }
    // posix_spawn: a dup2 file action passes the connection, a close
    // action of its only inherited number keeps it from the child.
    assert_eq!(
        field(&out, "spawn_dup2_before"),
        ["kernel", "0", "intact", "True"],
        "{out}"
    );
    assert_eq!(field(&out, "spawn_dup2"), ["got:hello"], "{out}");
    assert_eq!(
        field(&out, "spawn_closed"),
        ["kernel", "0", "intact", "True"],
        "{out}"
    );
    // system(3)'s shell, spawned inside glibc, inherits the connection.
    assert_eq!(
        field(&out, "system_before"),
        ["kernel", "0", "intact", "True"],
        "{out}"
    );
    assert_eq!(field(&out, "system"), ["got:hello"], "{out}");
    assert_eq!(
        field(&out, "popen_before"),
        ["kernel", "0", "intact", "True"],
        "{out}"
    );
    assert_eq!(field(&out, "popen"), ["got:hello"], "{out}");
}
