//! Children that share the parent's memory (vfork, clone(CLONE_VM) with
//! and without CLONE_VFORK, posix_spawn's internal clone) close and
//! replace their copies of a ring connection's descriptors; the parent's
//! ring connection must not notice: every byte arrives, both ways, on the
//! ring (TCP_INFO shows no payload on the kernel socket). Each way runs in a process of its own (a clone marks the process
//! for good), and once after another, to cover the vfork mark being
//! cleared in the parent.

use std::time::Duration;

use ringsock_integration::{assert_shim_silent, Ctl};

const KIDS: &str = env!("CARGO_BIN_EXE_sharedkids");

fn run(ctl: &Ctl, methods: &[&str]) {
    let (out, err) = ctl
        .shimmed(KIDS)
        .args(methods.iter().copied())
        .run_ok(Duration::from_secs(120));
    assert_shim_silent("sharedkids", &err);
    assert!(
        out.lines().any(|l| l == "ring before=true on_ring=true"),
        "the connection never got a ring:\n{out}"
    );
    for m in methods {
        assert!(
            out.lines()
                .any(|l| l == format!("ok {m} ring=true on_ring=true")),
            "{m}: the parent's connection lost its ring or its bytes:\n{out}\n{err}"
        );
    }
    assert!(out.lines().any(|l| l == "done"), "{out}");
}

#[test]
fn vfork_child_leaves_the_parents_rings_alone() {
    let ctl = Ctl::start();
    run(&ctl, &["vfork"]);
    run(&ctl, &["vfork", "vfork", "spawn"]);
}

#[test]
fn clone_vm_children_leave_the_parents_rings_alone() {
    let ctl = Ctl::start();
    run(&ctl, &["clone-vfork"]);
    run(&ctl, &["clone-vm"]);
}

#[test]
fn posix_spawn_child_leaves_the_parents_rings_alone() {
    let ctl = Ctl::start();
    run(&ctl, &["spawn", "spawn"]);
}
