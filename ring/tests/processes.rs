//! Two real processes share a ring through a memfd passed by inheritance:
//! the parent streams 32 MiB with a checksum, the child echoes a digest.

#![cfg(not(loom))]

use ringsock_ring::{EventFd, Receiver, RingConfig, Segment, Sender, ShmTransport, SpinBudget};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::time::Duration;

const TOTAL: usize = 32 << 20;

fn fnv(h: &mut u64, data: &[u8]) {
    for b in data {
        *h = (*h ^ *b as u64).wrapping_mul(0x100000001b3);
    }
}

fn inheritable(fd: i32) -> i32 {
    // SAFETY: dup of a live fd; the copy has no CLOEXEC so the child gets it.
    unsafe { libc::dup(fd) }
}

#[test]
fn two_processes_share_a_ring() {
    let cfg = RingConfig::default();
    let seg = Segment::create(&cfg, 2).unwrap();
    let to_child = EventFd::new().unwrap();
    let to_parent = EventFd::new().unwrap();
    let (seg_fd, bell_c, bell_p) = (
        inheritable(seg.fd().expect("memfd open").as_raw_fd()),
        inheritable(to_child.fd()),
        inheritable(to_parent.fd()),
    );
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "child_role", "--nocapture"])
        .env("RINGBUF_CHILD", format!("{seg_fd},{bell_c},{bell_p}"))
        .spawn()
        .unwrap();
    for fd in [seg_fd, bell_c, bell_p] {
        // SAFETY: closing our inheritable copies.
        unsafe { libc::close(fd) };
    }
    // Ring 0: parent -> child. Ring 1: child -> parent. Each side's
    // receiver rings the other's bell too: a sender that waits for space
    // sleeps on its own bell, and only the head push can wake it (without
    // it the parent slept forever once ring 0 filled up on a busy machine).
    let child_bell = to_child.try_clone().unwrap();
    let mut tx = Sender::new(
        seg.ring(0),
        ShmTransport::new(seg.ring(0), Some(Box::new(to_child))),
        cfg,
    )
    .unwrap();
    let mut rx = Receiver::new(
        seg.ring(1),
        ShmTransport::new(seg.ring(1), Some(Box::new(child_bell))),
        cfg,
    )
    .unwrap();
    let mut spin = SpinBudget::new(Duration::from_micros(20));
    let mut hash = 0xcbf29ce484222325u64;
    let mut chunk = vec![0u8; 10_007];
    let mut sent = 0;
    let mut seed = 1u32;
    while sent < TOTAL {
        let n = chunk.len().min(TOTAL - sent);
        for b in chunk[..n].iter_mut() {
            seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
            *b = (seed >> 24) as u8;
        }
        fnv(&mut hash, &chunk[..n]);
        ringsock_ring::sleep::spin::send_all_blocking(&mut tx, &to_parent, &mut spin, &chunk[..n])
            .unwrap();
        sent += n;
    }
    while tx.close().is_err() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut reply = [0u8; 8];
    let mut got = 0;
    while got < 8 {
        got += ringsock_ring::sleep::spin::recv_blocking(
            &mut rx,
            &to_parent,
            &mut spin,
            &mut reply[got..],
        )
        .unwrap();
    }
    assert_eq!(u64::from_le_bytes(reply), hash, "child saw different bytes");
    assert!(child.wait().unwrap().success());
    assert_eq!(seg.ring(0).ctrl().stats().rx_bytes as usize, TOTAL);
}

/// The child half of `two_processes_share_a_ring`; run only by it.
#[test]
#[ignore]
fn child_role() {
    let Ok(spec) = std::env::var("RINGBUF_CHILD") else {
        return;
    };
    let fds: Vec<i32> = spec.split(',').map(|s| s.parse().unwrap()).collect();
    // SAFETY: the parent passed these fds to us; we own them now.
    let own = |fd| unsafe { OwnedFd::from_raw_fd(fd) };
    let seg = Segment::attach(own(fds[0])).unwrap();
    let my_bell = EventFd::from_owned(own(fds[1]));
    let parent_bell = EventFd::from_owned(own(fds[2]));
    let cfg = RingConfig {
        slots: seg.geometry().0,
        slot_size: seg.geometry().1,
        ..RingConfig::default()
    };
    let space_bell = parent_bell.try_clone().unwrap();
    let mut rx = Receiver::new(
        seg.ring(0),
        ShmTransport::new(seg.ring(0), Some(Box::new(space_bell))),
        cfg,
    )
    .unwrap();
    let mut tx = Sender::new(
        seg.ring(1),
        ShmTransport::new(seg.ring(1), Some(Box::new(parent_bell))),
        cfg,
    )
    .unwrap();
    let mut spin = SpinBudget::new(Duration::from_micros(20));
    let mut hash = 0xcbf29ce484222325u64;
    let mut buf = vec![0u8; 65536];
    loop {
        let n = ringsock_ring::sleep::spin::recv_blocking(&mut rx, &my_bell, &mut spin, &mut buf)
            .unwrap();
        if n == 0 {
            break;
        }
        fnv(&mut hash, &buf[..n]);
    }
    ringsock_ring::sleep::spin::send_all_blocking(
        &mut tx,
        &my_bell,
        &mut spin,
        &hash.to_le_bytes(),
    )
    .unwrap();
}

#[test]
fn attach_refuses_foreign_or_unsealed_fds() {
    // An eventfd is not a sealed memfd.
    let e = EventFd::new().unwrap();
    assert!(Segment::attach(e.into_owned()).is_err());
    // A memfd with garbage in its header.
    // SAFETY: plain syscalls on a fresh fd we own.
    let fd = unsafe {
        let fd = libc::memfd_create(c"junk".as_ptr(), libc::MFD_ALLOW_SEALING);
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, 1 << 20), 0);
        assert_eq!(libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK), 0);
        assert_eq!(libc::pwrite(fd, [0xffu8; 64].as_ptr().cast(), 64, 0), 64);
        OwnedFd::from_raw_fd(fd)
    };
    assert!(Segment::attach(fd).is_err());
}
