//! Blocking versus immediate, without timing anything that is logged.
//!
//! A call that may block runs on a thread of its own. The role waits for
//! it up to `GRACE`: a call that returned by then is "immediate", one that
//! did not is "blocked". Either way the role then performs the same
//! release (typically a barrier after which the peer acts), and waits for
//! the call's result up to `AFTER_RELEASE`. The grace is long enough that
//! a loaded 2-core machine never makes an immediate call look blocked; a
//! call that should block pays it once.

use std::sync::mpsc;
use std::time::Duration;

/// How long an immediate call may take to come back.
pub const GRACE: Duration = Duration::from_millis(1500);

/// How long a blocked call may take to return once released.
pub const AFTER_RELEASE: Duration = Duration::from_secs(8);

/// A call running on its own thread, delivering its observation line.
pub struct Probe {
    rx: mpsc::Receiver<String>,
}

impl Probe {
    pub fn start(call: impl FnOnce() -> String + Send + 'static) -> Probe {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(call());
        });
        Probe { rx }
    }

    /// The call's line if it returns within `d`.
    pub fn within(&self, d: Duration) -> Option<String> {
        self.rx.recv_timeout(d).ok()
    }
}
