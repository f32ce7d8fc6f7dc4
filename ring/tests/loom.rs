//! Loom models of the shared-memory ring: the real `Sender`/`Receiver`
//! code over loom atomics, loom cells for the slots (a slot read not
//! ordered after its write is reported) and a condvar doorbell (a lost
//! wakeup is reported as a deadlock).
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p ringsock-ring --test loom --release --no-default-features`

#![cfg(loom)]

mod loom_support;

use loom::thread;
use loom_support::model;
use ringsock_ring::sleep::notify::modeled::Bell;
use ringsock_ring::{heap_pair, RingConfig, RingError};

fn cfg(slots: u32) -> RingConfig {
    RingConfig {
        slots,
        slot_size: 64,
        alpha: 1,
        beta: 1,
        gamma: 1,
        max_record_slots: 1,
        coalesce: false,
        elastic: false,
        sync_ahead: true,
    }
}

/// Reads `want` bytes, sleeping on `bell` whenever the ring is empty.
fn read_all(
    rx: &mut ringsock_ring::Receiver<ringsock_ring::ShmTransport>,
    bell: &Bell,
    want: usize,
) -> Vec<u8> {
    let mut out = vec![0u8; want];
    let mut got = 0;
    while got < want {
        match rx.read(&mut out[got..]) {
            Ok(0) => panic!("unexpected end of stream"),
            Ok(n) => got += n,
            Err(RingError::WouldBlock) => {
                if rx.prepare_wait().unwrap() {
                    bell.wait();
                    rx.finish_wait(true).unwrap();
                }
            }
            Err(e) => panic!("{e}"),
        }
    }
    out
}

/// Published slot bytes are visible to the receiver (no data race on the
/// slots), and a receiver that goes to sleep is always woken.
#[test]
fn data_is_published_and_sleeping_receiver_wakes() {
    model(|| {
        let bell = Bell::default();
        let (mut tx, mut rx) = heap_pair(cfg(4), Some(Box::new(bell.clone())), None).unwrap();
        let writer = thread::spawn(move || {
            tx.write(b"ab").unwrap();
            tx.flush().unwrap();
            tx.write(b"c").unwrap();
            tx.flush().unwrap();
        });
        assert_eq!(read_all(&mut rx, &bell, 3), b"abc");
        writer.join().unwrap();
    });
}

/// A quiet publish makes the bytes readable at once and may leave the
/// check for a sleeping receiver to the next flush: a receiver that reads
/// finds them, one that goes to sleep meanwhile is woken by that flush.
#[test]
fn quiet_publish_then_flush_wakes_a_sleeper() {
    model(|| {
        let bell = Bell::default();
        // Tails every 2 slots: the one-slot records wait for `publish`.
        let c = RingConfig { alpha: 2, ..cfg(4) };
        let (mut tx, mut rx) = heap_pair(c, Some(Box::new(bell.clone())), None).unwrap();
        let writer = thread::spawn(move || {
            tx.write(b"ab").unwrap();
            tx.publish().unwrap();
            tx.write(b"c").unwrap();
            tx.publish().unwrap();
            tx.flush().unwrap();
            assert!(!tx.has_unflushed());
        });
        assert_eq!(read_all(&mut rx, &bell, 3), b"abc");
        writer.join().unwrap();
    });
}

/// A receiver already asleep when a quiet publish comes is woken by that
/// publish, with no flush after it (the sender holds on to its end).
#[test]
fn quiet_publish_wakes_a_receiver_long_asleep() {
    model(|| {
        let bell = Bell::default();
        // Tails every 2 slots: the one-slot record waits for `publish`.
        let c = RingConfig { alpha: 2, ..cfg(4) };
        let (mut tx, mut rx) = heap_pair(c, Some(Box::new(bell.clone())), None).unwrap();
        let armed = std::sync::Arc::new(loom::sync::atomic::AtomicBool::new(false));
        let seen = armed.clone();
        let writer = thread::spawn(move || {
            while !seen.load(loom::sync::atomic::Ordering::Acquire) {
                thread::yield_now();
            }
            tx.write(b"ab").unwrap();
            tx.publish().unwrap();
            tx
        });
        let mut out = [0u8; 2];
        assert!(matches!(rx.read(&mut out), Err(RingError::WouldBlock)));
        assert!(rx.prepare_wait().unwrap(), "nothing was sent yet");
        armed.store(true, loom::sync::atomic::Ordering::Release);
        bell.wait();
        rx.finish_wait(true).unwrap();
        assert_eq!(rx.read(&mut out).unwrap(), 2);
        assert_eq!(&out, b"ab");
        drop(writer.join().unwrap());
    });
}

/// 5 one-slot records into a 4-slot ring (the last must wait for space),
/// each side sleeping on its own bell whenever it cannot go on; every
/// byte must arrive in order and no side may sleep for good.
fn five_records_through_four_slots(cfg: RingConfig) {
    let rx_bell = Bell::default();
    let tx_bell = Bell::default();
    let (mut tx, mut rx) = heap_pair(
        cfg,
        Some(Box::new(rx_bell.clone())),
        Some(Box::new(tx_bell.clone())),
    )
    .unwrap();
    let writer = thread::spawn(move || {
        for i in 0..5u8 {
            loop {
                match tx.write(&[i; 50]) {
                    Ok(50) => break,
                    Ok(n) => panic!("short write {n}"),
                    Err(RingError::WouldBlock) => {
                        if tx.prepare_wait().unwrap() {
                            tx_bell.wait();
                            tx.finish_wait(true).unwrap();
                        }
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
        tx.flush().unwrap();
    });
    let got = read_all(&mut rx, &rx_bell, 250);
    for (i, chunk) in got.chunks(50).enumerate() {
        assert!(chunk.iter().all(|b| *b == i as u8));
    }
    writer.join().unwrap();
}

/// A sender that sleeps on a full ring is always woken by the receiver's
/// head push, and every byte arrives in order.
#[test]
fn sender_sleeping_on_full_ring_wakes() {
    model(|| five_records_through_four_slots(cfg(4)));
}

/// With lazy head pushes (gamma 2 of 4 slots) the receiver may sleep
/// with a consumed slot not handed back (`Receiver::prepare_wait` pushes
/// by the lazy rule only): the sender still has room then, and the tail
/// that fills the ring wakes the receiver, which pushes. No side sleeps
/// for good and every byte arrives in order.
#[test]
fn lazy_head_push_never_strands_a_full_sender() {
    model(|| five_records_through_four_slots(RingConfig { gamma: 2, ..cfg(4) }));
}

/// End of stream after data: the mark is seen only after every byte.
#[test]
fn end_of_stream_follows_data() {
    model(|| {
        let bell = Bell::default();
        let (mut tx, mut rx) = heap_pair(cfg(4), Some(Box::new(bell.clone())), None).unwrap();
        let writer = thread::spawn(move || {
            tx.write(b"xy").unwrap();
            tx.close().unwrap();
        });
        assert_eq!(read_all(&mut rx, &bell, 2), b"xy");
        let mut buf = [0u8; 4];
        loop {
            match rx.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => panic!("{n} bytes after end of stream"),
                Err(RingError::WouldBlock) => {
                    if rx.prepare_wait().unwrap() {
                        bell.wait();
                        rx.finish_wait(true).unwrap();
                    }
                }
                Err(e) => panic!("{e}"),
            }
        }
        writer.join().unwrap();
    });
}

/// A doorbell that counts its rings, so that a sleeper can tell a ring
/// that came after it armed from none at all.
#[derive(Clone, Default)]
struct CountingBell(std::sync::Arc<loom::sync::atomic::AtomicU64>);

impl ringsock_ring::Notify for CountingBell {
    fn notify(&self) -> Result<(), RingError> {
        self.0.fetch_add(1, loom::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

/// A reader that needs 4 bytes peeks (consuming nothing) while the
/// writer sends them as two records of 2, sleeping whenever fewer are
/// there: with `announce_beyond` through `prepare_wait_for`, without it as
/// a plain `prepare_wait` (which announces nothing while the ring holds
/// bytes) followed by a sleep all the same. A sleep ends at a ring that
/// came after it armed; one still waiting once the writer is done, with
/// no such ring, is a lost wakeup.
fn peek_for_more_than_is_there(announce_beyond: bool) {
    use loom::sync::atomic::{AtomicBool, Ordering};
    model(move || {
        let bell = CountingBell::default();
        let (mut tx, mut rx) = heap_pair(cfg(4), Some(Box::new(bell.clone())), None).unwrap();
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let writer = {
            let done = done.clone();
            thread::spawn(move || {
                tx.write(b"ab").unwrap();
                tx.flush().unwrap();
                tx.write(b"cd").unwrap();
                tx.flush().unwrap();
                done.store(true, Ordering::SeqCst);
            })
        };
        let mut out = [0u8; 4];
        loop {
            match rx.peek(&mut out) {
                Ok(4) => break,
                Ok(_) | Err(RingError::WouldBlock) => {
                    let armed_at = bell.0.load(Ordering::SeqCst);
                    let sleep = if announce_beyond {
                        rx.prepare_wait_for(4).unwrap()
                    } else {
                        rx.prepare_wait().unwrap();
                        true
                    };
                    if !sleep {
                        continue;
                    }
                    loop {
                        // The writer's last flush comes before `done`: a
                        // ring owed to this sleep shows once `done` does.
                        let finished = done.load(Ordering::SeqCst);
                        if bell.0.load(Ordering::SeqCst) != armed_at {
                            break;
                        }
                        assert!(!finished, "lost wakeup");
                        thread::yield_now();
                    }
                    rx.finish_wait(true).unwrap();
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(&out, b"abcd");
        assert_eq!(rx.available().unwrap(), 4, "a peek consumes nothing");
        writer.join().unwrap();
    });
}

/// A reader that needs more bytes than the ring holds (MSG_PEEK with
/// MSG_WAITALL, SO_RCVLOWAT) sleeps with bytes in the ring, and the next
/// tail wakes it: its flag names the tail it saw, not an empty ring.
#[test]
fn reader_needing_more_than_the_ring_holds_wakes() {
    peek_for_more_than_is_there(true);
}

/// Without that announcement such a sleeper is never woken.
#[test]
#[should_panic(expected = "lost wakeup")]
fn sleeping_on_a_nonempty_ring_without_a_flag_loses_the_wakeup() {
    peek_for_more_than_is_there(false);
}
