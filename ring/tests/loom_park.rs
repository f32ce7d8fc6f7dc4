//! Loom model of `ringsock_ring::sleep::park::WorkerPark`, the shim background
//! thread's sleep: a job posted while the worker decides to sleep either
//! is seen by the worker's look for work or rings its eventfd.
//!
//! The worker takes a ticket, looks for the job, and if it finds none and
//! `may_sleep` says yes, it sleeps; the model then requires the poster to
//! have rung the bell (an eventfd stays readable, so a ring before the
//! sleep counts too). The `should_panic` variant is a poster that looks at
//! `parked` first and bumps only if it is set: it loses the wake-up.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p ringsock-ring --test loom_park --release --no-default-features`

#![cfg(loom)]

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;
use ringsock_ring::sleep::park::WorkerPark;

#[derive(Clone, Copy, PartialEq)]
enum Poster {
    Sound,
    CheckParkedFirst,
}

fn one_post(poster: Poster, worker_rounds: usize) {
    loom::model(move || {
        let park = Arc::new(WorkerPark::new());
        let job = Arc::new(AtomicU64::new(0));
        let bell = Arc::new(AtomicU64::new(0));

        let p = {
            let (park, job, bell) = (park.clone(), job.clone(), bell.clone());
            thread::spawn(move || {
                job.store(1, Ordering::Release);
                let ring = match poster {
                    Poster::Sound => park.request(),
                    Poster::CheckParkedFirst => park.request_if_parked(),
                };
                if ring {
                    bell.store(1, Ordering::Release);
                }
            })
        };

        // The worker loops while `may_sleep` says no (a post came in).
        let mut asleep = false;
        for _ in 0..worker_rounds {
            let t = park.ticket();
            if job.load(Ordering::Acquire) == 1 {
                break;
            }
            if park.may_sleep(t, true) {
                asleep = true;
                break;
            }
            park.woke();
        }
        p.join().unwrap();
        if asleep {
            assert_eq!(
                bell.load(Ordering::Acquire),
                1,
                "lost wake-up: the worker sleeps, the job is posted, nobody rang"
            );
        }
    });
}

#[test]
fn a_posted_job_is_seen_or_rings() {
    one_post(Poster::Sound, 2);
}

#[test]
#[should_panic(expected = "lost wake-up")]
fn checking_parked_before_bumping_loses_a_wakeup() {
    one_post(Poster::CheckParkedFirst, 2);
}
