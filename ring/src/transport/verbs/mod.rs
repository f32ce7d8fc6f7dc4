//! The RDMA verbs transport (cargo feature `verbs`, `rdma-sys`). Without
//! the feature only `stats` is here, the header layout the ctl daemon
//! reads without linking rdma-core.
//!
//! Each end of a connection registers one region holding its two ring
//! copies: the *sender copy* of the ring it sends on and the *receiver
//! copy* of the ring it receives on (`[header | out ctrl | out slots | in
//! ctrl | in slots | staging]`, a sealed memfd on huge pages when the
//! system has free ones, else 4 KiB pages). The header page
//! (`stats::VerbsHeader`: layout and counters) is not
//! registered; `share_fd` hands the memfd to the ctl daemon, which reads
//! the counters for `status`. One RC queue pair per connection end carries
//! both rings:
//!
//! - `write_slots` is an RDMA WRITE of the slot range from our sender copy
//!   into the peer's receiver copy (remote address + rkey), its last slot
//!   only as far as the record bytes in it (a 64 B message is a 72 B
//!   WRITE, not a 256 B slot; 64 B without its header, below), inline
//!   when it fits the device's inline size (up to 256 B);
//! - `write_word` is an RDMA WRITE (inline when the device can, else from a
//!   registered staging word) of the control word into the peer's control
//!   block. The RC queue pair executes requests in order, so a tail WRITE
//!   lands after the slot WRITEs before it: RB2's "write twice";
//! - every word write is signaled, slot writes are signaled only every
//!   `sq_depth / 2` requests (to recycle the send queue): word writes are
//!   one per `alpha` slots, so this is selective signaling where it counts;
//!   `write_word` returns `Visibility::AtCompletion`;
//! - `poll_completions` polls the send CQ and reports an end's word writes
//!   only once its *latest* word write completed (a completion covers every
//!   earlier request of the queue). A non-zero report therefore always
//!   means "the last control word this end wrote is in the peer's memory";
//! - `kick_peer` is a zero-length, solicited RDMA WRITE_WITH_IMM. The peer
//!   has receives posted for it; their completions go to a receive CQ with
//!   a completion channel armed for solicited events: the channel fd is the
//!   `Doorbell` (`fd()`, `drain()` = get/ack events, reap, repost, rearm,
//!   look again; `wait()`).
//!
//! Connection setup: `Device::open` or `Device::open_for` (a
//! `DeviceChoice`; by default the first device with an active port, or
//! the one the route to the peer leaves through, and its IPv4-mapped
//! RoCE v2 GID), `VerbsConn::new` (region, MR, CQs, QP; the `PullKnobs`),
//! `local_params()` -> `QpParams` (versioned bytes via `encode`/`decode`,
//! carried out of band), `connect(peer)` (INIT -> RTR -> RTS) -> the
//! `Sender`, `Receiver` and `Doorbell` of this end.
//!
//! # Why no wakeup is lost on verbs
//!
//! The shm argument (docs/design.md, "Readiness and sleeping") is
//! Dekker's: each side stores
//! its word, fences, loads the other's. On verbs the stores are RDMA
//! WRITEs into the *other* side's memory and the loads read our own copy:
//!
//! - receiver (`Receiver::prepare_wait`): R1 WRITE `rx_waiting = 1` into
//!   the sender's copy; R2 spin on `poll_completions` until it reports
//!   (= that WRITE is placed in the sender's memory: an RC WRITE completes
//!   at the requester only after the responder acknowledged it, and the
//!   responder acknowledges after placing the data); R3 fence, load
//!   `local_tail` from its own copy; sleep only if the ring is still empty.
//! - sender (`Sender::poll` or `await_completion` -> `tail_visible`): S1
//!   WRITE the tail into the receiver's copy (after the slot WRITEs); S2 a
//!   completion report (= that tail, or a later one, is placed); S3 fence,
//!   load `rx_waiting` from its own copy; if set, clear it and kick.
//!
//! Let W be when the flag lands and T when the tail lands. If both loads
//! missed, R3 < T (the receiver did not see the tail) and S3 < W (the
//! sender did not see the flag); with W < R2 < R3 and T < S2 < S3 that
//! gives W < R3 < T < S3 < W, impossible. So the receiver sees the data
//! or the sender kicks. A kick cannot be lost either: it is a completion
//! on the receive CQ, and `Doorbell::drain` arms the CQ *before* its last
//! poll, so a kick either is reaped by that poll or raises an event that
//! makes the fd readable for the `ppoll` that follows. The full-ring case
//! (`tx_waiting` WRITE into the receiver's copy, head push into the
//! sender's copy, `Receiver::head_visible`) is the mirror image.
//!
//! The sender clears `rx_waiting` in its own copy while the receiver may
//! WRITE it: the receiver writes a flag only in `prepare_wait`, and one
//! that lands after the clear is a flag for a *later* sleep, which the
//! argument above covers for the next tail. The flag carries the tail the
//! receiver had seen, plus one (`crate::sleep::flags`): a check kicks only a
//! receiver that has not seen the tail in question, so a flag written for
//! the *next* sleep (after the receiver consumed this tail) costs no
//! spurious wakeup.
//!
//! Early kick: a sender that already sees the flag when it posts a tail
//! (the receiver went to sleep earlier, the usual case in a
//! request/response exchange) clears it and sends the tail as a solicited
//! WRITE_WITH_IMM (`Transport::write_word_kicking`), which rings the
//! doorbell once the tail is placed: the receiver wakes one network trip
//! and one completion poll earlier, and the check at the completion is
//! skipped for that tail (a receiver arming before the ring arrives is
//! woken by it, one arming after it sees the tail; loom:
//! `tests/loom_early_kick.rs`). The head push and `tx_waiting` do the
//! same in the other direction.
//!
//! Standing flags: R1 and R2 cost a WRITE and a network round trip
//! before every sleep, and the clear on waking another WRITE. A receiver
//! whose peer advertises `FEATURE_STANDING_WAITS` (in `QpParams`)
//! announces a *standing* flag instead (`crate::sleep::flags`): the sender
//! rings the doorbell with every tail it publishes (the early kick above,
//! or at the completion for a tail posted before the flag landed) and
//! leaves the flag set; the receiver does R1/R2 once and then sleeps
//! again and again with only R3 (the flag placed before an earlier R3 is
//! still there, so the argument above holds for each later tail). Every
//! ring takes one of the receiver's posted receives, so the sender rings a
//! standing flag `STANDING_KICKS` times at most: the last ring clears it
//! and carries `IMM_ENDS_STANDING | epoch` in its immediate. The doorbell
//! records that epoch when it reaps the ring (`Doorbell::drain`, before
//! the receiver's `prepare_wait`), and the receiver announces again
//! before its next sleep; a receiver that drained before the ending ring
//! arrived is woken by it (loom: `tests/loom_standing.rs`). In a
//! request/response exchange that leaves one announcement per 16
//! messages instead of two WRITEs and a round trip per message.
//!
//! Tail in the ring: with the early kick a small message still took two
//! packets, the slot WRITE and the tail's WRITE_WITH_IMM. Where the peer
//! advertises `FEATURE_TAIL_IN_IMM` the sender holds a slot write of at
//! most 16 KiB back (any other request posts it first, so the queue
//! pair's order is kept); a tail write that rings the doorbell
//! (`Ring::Plain`) then turns it into one WRITE_WITH_IMM whose immediate
//! carries `IMM_CARRIES_TAIL` and the tail's low 30 bits, and writes no
//! tail word. The receiver's end raises its copy's `local_tail` to that
//! tail when it reaps the ring (`tail_hint`): in the doorbell's
//! drain, and in `fetch_tail` before every look at the tail, since a
//! receiver that is spinning sees such a tail only through its ring. The
//! wakeup argument is the early kick's: the ring, and with it the tail,
//! is reaped before R3 by the drain that precedes `prepare_wait`. A drain
//! that finds events whose completions `fetch_tail` already reaped still
//! counts as rung, so a waiter for the other direction sharing the
//! doorbell is not left asleep (loom: `tests/loom_tail_hint.rs`).
//!
//! Every tail in the immediate: otherwise a small message to a receiver that
//! is not asleep costs two WRITEs (slots, then the tail word), each
//! acknowledged: four packets each way against rsocket's two. An end that
//! keeps a posted receive for every slot of its incoming ring, on top of the
//! doorbell's 64, advertises `FEATURE_TAIL_CREDITS`, and its peer's sender
//! then carries every held batch's tail in the immediate of its slot WRITE,
//! unsolicited (no doorbell event; the check at its completion rings a
//! sleeper as it does for the word). Why the receives cannot run out: each
//! such immediate advances the tail by at least one slot; `fetch_tail` reaps,
//! loads the tail word and, if it moved, reaps again, so the receiver has
//! reaped every immediate up to the tail it knows, and its head never passes
//! that tail; the immediates not yet reaped therefore carry tails between the
//! receiver's head and the sender's tail, at most the ring's slots apart.
//! Kicks and the other direction's rings keep their 64. A device whose queue
//! limits cannot hold that many receives leaves the bit out and gets tail
//! words.
//!
//! Headerless records: with the tail in every small batch's immediate, a
//! 4 KiB message is still its 8-byte record header plus 4,096 bytes of
//! payload, one packet over four at rxe's 1,024 B MTU (two over one at a
//! real NIC's 4,096), where rsocket sends the payload alone. Where the
//! peer advertises `FEATURE_HEADERLESS` (it has `FEATURE_TAIL_CREDITS`
//! and a ring of at most `headerless::MAX_RING_SLOTS` slots), a held
//! batch that is exactly one record, ending at the tail it carries, goes
//! out as its payload alone; the immediate (`IMM_HEADERLESS`) carries the
//! payload length and the tail's low bits (`headerless`). Whoever
//! reaps it (`poll_recv`, under the `rq` lock) writes the header into the
//! receiver copy, then raises `local_tail` over the record (release), so
//! a receiver that loads that tail finds header and payload. Two rules
//! keep every other path right:
//!
//! - Before any tail *word* (a batch over 16 KiB, zero-copy records, a
//!   tail that found no held batch, pull mode's switches), the sender
//!   re-sends the 8-byte headers of the headerless records whose end the
//!   receiver's pushed head has not reached (`Shared::resend_headers`):
//!   RC order places them before the word, so a receiver that learns a
//!   tail from the word before it reaped those immediates (verbs does not
//!   promise when a completion becomes visible against a later WRITE's
//!   data) still finds every header. The list is bounded
//!   (`HEADERLESS_KEPT`): while it is full, records keep their header. A
//!   tail in a later immediate needs nothing: the receive CQ is reaped in
//!   order.
//! - The receiver learns every tail under the `rq` lock (`fetch_tail`,
//!   pull mode's fetch included), and a reaper writes a header only while
//!   it holds that lock and the copy's tail is still below the record. So
//!   a header is never written after the receiver read past its record
//!   (which needs a tail at or past the record's end, loaded under the
//!   lock, after which the copy's tail never goes below it), hence never
//!   over a slot the sender reused for its next lap. A reaper that finds
//!   the tail already past the record writes nothing; one that loses the
//!   raise to a tail word (behind the same header, re-sent) has written
//!   the same bytes.
//!
//! Loom: `tests/loom_headerless.rs` (its should_panic variants drop the
//! re-send, or load the tail outside the lock, and each loses). A field
//! no honest sender produces (a record before the copy's tail, past the
//! ring's end or more than a ring ahead) fails the connection as corrupt.
//!
//! Completion waits (R2, settle) spin a few microseconds, then yield the
//! CPU each turn (`crate::sleep::backoff`): with Soft-RoCE the acknowledgement
//! they wait for is produced by softirq work on this machine's CPUs,
//! which a pure spin can hold off.
//!
//! What verbs need beyond shm:
//!
//! 1. S2 happens only when somebody polls. A process that published data
//!    (or pushed a head) and is about to block must first poll both ends
//!    until `VerbsTransport::words_pending()` is false (`settle`): on shm
//!    the check runs inside the store, here it runs at the completion.
//! 2. Two protocol changes, both on the `AtCompletion` path only (shm and
//!    the loom models never take it): `Sender::await_completion` (in
//!    `prepare_wait`) consumes a report that may cover an outstanding tail
//!    write, so it now runs the `tail_visible` check for it; likewise
//!    `Receiver::prepare_wait` runs `head_visible` after its flag WRITE
//!    completed, since that report covers the head push it made just
//!    before. Without them the report is swallowed and the peer that
//!    sleeps for that tail (or head) is never rung.
//! 3. Placement of an 8-byte word must not tear (the reader loads
//!    `local_tail`/`local_head` while the WRITE lands). RDMA NICs place an
//!    aligned 8-byte WRITE with one PCIe write. Soft-RoCE copies with the
//!    kernel's `memcpy`, which on a CPU with ERMS is `rep movsb`, byte by
//!    byte under qemu TCG: the harness (`scripts/softroce-vm`) gives the
//!    guest a CPU without ERMS/FSRM so the copy is one 8-byte store. A
//!    transport-level read hook with a checked encoding of peer-written
//!    words would remove the assumption; not done yet.
//!
//! # Pull mode (remote fetching)
//!
//! Per ring direction the sender may switch from *push* (the above) to
//! *pull*, RFP's remote-fetching paradigm (`pull`: `PullKnobs`, given to
//! `VerbsConn::new`, say push (default), pull or adaptive, and the
//! adaptive thresholds; `verbscheck` reads them from `RINGSOCK_VERBS_MODE`
//! and `RINGSOCK_PULL_*`): the sender posts
//! nothing for its data; it publishes by storing the tail into `pub_tail`
//! in its *own* copy (`pull::PUB_TAIL`, a word of the control page past
//! `RingControl`), and the receiver, in `Transport::fetch_tail` (called
//! by `Receiver::refresh_tail`, so every read, readiness check and
//! `prepare_wait` fetches), READs that word into a scratch word of its
//! own copy, then READs the new slots `[from, tail)` into its receiver
//! copy, waits for both, and validates tail and records exactly as in
//! push. The memory region and the queue pair allow REMOTE_READ for
//! this: the peer can READ what its rkey could already WRITE, our two
//! ring copies and the staging words (bytes it sent us or we send it,
//! our head/tail mirrors and ring counters); the header page with the
//! verbs counters stays outside the registration.
//!
//! Adaptive mode measures the responder's load as this process's rate of
//! publishes (all verbs rings, per `PullKnobs::window`), not its
//! rate of posted work requests: a sender in pull posts almost none, so
//! that rate would drop at the switch and flip it straight back. Above
//! HIGH a sender switches to pull, at or below LOW back to push, never
//! twice within DWELL. Only the sender decides; the receiver follows.
//!
//! Switching (the sender's `write_word(LocalTail)`, `conn::pull_io`):
//!
//! - PUSH -> PULL at a publish of tail T: every slot before T is already
//!   WRITTEN (`Sender::transmit` sends slots before the tail). Store T in
//!   `pub_tail`, WRITE the tail T, then the mode word (`pull::mode_word`:
//!   switch sequence << 1 | pull) into the receiver's copy; push nothing
//!   more. RC order: a receiver that sees the word has every pushed slot
//!   and a `local_tail` >= T; it READs from `max(its tail, local_tail)`,
//!   so it never READs over what was pushed (nor over a zero-copy record,
//!   whose payload is not in our copy: in pull mode `write_external`
//!   copies the payload into our copy instead).
//! - PULL -> PUSH at a publish of T: `pub_tail` freezes at its last value
//!   F (the receiver's READs cannot reach past it any more); WRITE again
//!   the slots the receiver may not have fetched, `[start, esc)` with
//!   start = its pushed head (clamped into one ring, never before the
//!   switch to pull), then the tail T, then the push mode word. Until
//!   the receiver sees that word it keeps READing (up to F) and also takes
//!   `local_tail` from its copy. A catch-up WRITE and a READ of the same
//!   slot place the same bytes: the sender rewrites a slot only after the
//!   receiver released it, and every slot in `[head, esc)` belongs to one
//!   absolute position. Before it unfreezes (a later switch to pull) the
//!   sender waits for the switch-back's mode word to complete, so no late
//!   catch-up WRITE can land over a slot READ after the unfreeze.
//! - The receiver never writes `local_tail`: the fetched tail is returned
//!   to `refresh_tail`, so a stale push and a READ never race on it, and
//!   the tail it uses is monotonic by the rules above (the Receiver still
//!   rejects a regression as corruption).
//!
//! No lost wakeup in pull (Dekker on the *sender's* memory): receiver R1
//! WRITE `rx_waiting` into the sender's copy; R2 wait for its completion
//! (= placed); R3 fence and READ `pub_tail` (the sender's NIC loads it
//! after the flag is in place), sleep only if nothing new. Sender S1
//! store `pub_tail` (SeqCst), S2 fence, S3 load `rx_waiting`, kick if set
//! (`Sender::tail_visible`, run at once: the tail write returns
//! `Visibility::Now`). If both missed: R3 < S1 (READ did not see the
//! tail) and S3 < W (load did not see the flag), with W < R2 < R3 and
//! S1 < S2 < S3: W < R3 < S1 < S3 < W, impossible (loom:
//! `tests/loom_pull.rs`, which fails without the fence or without R2).
//! Across a switch the receiver may still look at the other place: a
//! receiver that has not seen the pull word reads its local copy; the
//! switch returns `AtCompletion`, so the sender runs its check when the
//! mode word has landed (the push argument with the word in place of the
//! tail), and a publish while a mode word is unreported also answers
//! `AtCompletion`. A receiver that has not seen the push word READs
//! `pub_tail` (frozen, but covering all before the switch) and loads
//! `local_tail`; everything after the switch is pushed with the push
//! argument.
//!
//! Going away: in pull the unread data is in the *sender's* memory. A
//! sender that will drop the connection before the receiver fetched
//! everything calls `VerbsTransport::leave_pull` (the shim's close does):
//! a switch back to push with its catch-up; no publish stands behind it
//! to run `tail_visible`, so the transport runs that wakeup check itself
//! when the switch's words are reported (`poll_completions`: the caller
//! settles before it drops the connection). A READ that was on its way
//! when the sender's queue pair went away fails; the receiver then finds
//! the push word in its copy and reads on from there. A READ is waited
//! for at most 10 s: a peer whose queue pair is gone never answers (rxe
//! raises no error), and past that the connection is failed.
//!
//! Counters (`pull::PullCounters`, in the header page; `Connected::
//! pull_stats`): switches each way at both ends, tail and slot READs,
//! bytes READ, catch-up WRITEs. `ringsock-ctl status` shows them after the
//! verbs counters (`tx_to_pull` ... `catchup_writes`, offsets in
//! `stats::offsets::PULL_*`); a ring in pull also shows there as
//! slot_writes/slot_bytes that stop growing while bytes flow.
//!
//! One thread waits on a `Doorbell` at a time (as with an eventfd that is
//! drained). A hostile peer can only write into our region where its rkey
//! allows, i.e. our two ring copies: the receiver validates everything it
//! reads there exactly as on shm.

#[cfg(all(feature = "verbs", not(loom)))]
mod conn;
#[cfg(all(feature = "verbs", not(loom)))]
mod device;
#[cfg(all(feature = "verbs", not(loom)))]
mod fdplace;
#[cfg(all(feature = "verbs", not(loom)))]
mod ibv;
model_visible! {
    #[cfg(any(feature = "verbs", test, loom, fuzzing))]
    mod headerless;
}
#[cfg(all(feature = "verbs", not(loom)))]
mod params;
#[cfg(all(feature = "verbs", not(loom)))]
mod pull;
#[cfg(all(feature = "verbs", not(loom)))]
pub mod regcache;
pub mod stats;
model_visible! {
    #[cfg(any(feature = "verbs", test, loom, fuzzing))]
    mod tail_hint;
}

#[cfg(all(feature = "verbs", not(loom)))]
pub use conn::{Connected, Doorbell, VerbsConn, VerbsTransport};
#[cfg(all(feature = "verbs", not(loom)))]
pub use device::{netdev_of, route_source, Device, DeviceChoice, DeviceRoute};
#[cfg(all(feature = "verbs", not(loom)))]
pub use fdplace::{set_fd_placement, Placement};
#[cfg(all(feature = "verbs", not(loom)))]
pub use params::{
    QpParams, RingDesc, FEATURE_HEADERLESS, FEATURE_STANDING_WAITS, FEATURE_TAIL_CREDITS,
    FEATURE_TAIL_IN_IMM, PARAMS_LEN, PARAMS_MAGIC, PARAMS_VERSION,
};
#[cfg(all(feature = "verbs", not(loom)))]
pub use pull::{ModeKnob, PullKnobs, PullStats};
pub use stats::VerbsCounters;

/// Polls both ends until neither has an unreported control-word write:
/// every tail and head this process published has reached the peer and
/// the matching sleeping-flag check ran. Call before blocking. Bounded:
/// `Unanswered` once a word went unreported for `REQUEST_LIMIT`.
#[cfg(all(feature = "verbs", not(loom)))]
pub fn settle(
    tx: &mut crate::Sender<VerbsTransport>,
    rx: &mut crate::Receiver<VerbsTransport>,
) -> Result<(), crate::RingError> {
    let limit = crate::sleep::backoff::REQUEST_LIMIT;
    let mut wait = crate::sleep::backoff::CompletionWait::new();
    loop {
        tx.poll()?;
        rx.poll()?;
        if !tx.transport_mut().words_pending() && !rx.transport_mut().words_pending() {
            return Ok(());
        }
        if !wait.relax_within(limit) {
            return Err(crate::VerbsError::Unanswered {
                op: "WRITE",
                secs: limit.as_secs(),
            }
            .into());
        }
    }
}

/// The errno the last failed library call left.
#[cfg(all(feature = "verbs", not(loom)))]
fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A failed verbs call: its name and errno. Calls that return an error
/// code return errno itself (some providers its negation).
#[cfg(all(feature = "verbs", not(loom)))]
fn call_failed(op: &'static str, errno: i32) -> crate::RingError {
    crate::VerbsError::Call {
        op,
        errno: errno.saturating_abs(),
    }
    .into()
}
