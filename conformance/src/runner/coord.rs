//! The runner's side of the barriers: it pairs the two roles' arrivals,
//! runs the ring check a barrier asks for (shim mode), answers both, and
//! notices roles that end, desynchronise or run past the deadline.

use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use crate::role::Side;
use crate::runner::spawn::kill_group;
use crate::sync::{encode_go, Arrive};

/// One role as the runner sees it.
pub struct End {
    pub side: Side,
    pub chan: OwnedFd,
    pub child: Child,
    /// The barrier it waits at, if any.
    at: Option<Arrive>,
    /// The last barrier it passed.
    passed: String,
    /// Every process of the role closed its channel.
    eof: bool,
    pub status: Option<ExitStatus>,
    pub killed: bool,
}

impl End {
    pub fn new(side: Side, chan: OwnedFd, child: Child) -> End {
        End {
            side,
            chan,
            child,
            at: None,
            passed: "(none)".into(),
            eof: false,
            status: None,
            killed: false,
        }
    }

    /// Gone for good: no process can reach another barrier.
    fn done(&self) -> bool {
        self.eof && self.status.is_some()
    }

    fn reap(&mut self) {
        if self.status.is_none() {
            if let Ok(Some(s)) = self.child.try_wait() {
                self.status = Some(s);
            }
        }
    }

    fn read(&mut self, problems: &mut Vec<String>) {
        let mut buf = [0u8; 4096];
        // SAFETY: receiving into our own buffer from our channel end.
        let n = unsafe {
            libc::recv(
                self.chan.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n == 0 {
            self.eof = true;
            return;
        }
        if n < 0 {
            return;
        }
        let text = String::from_utf8_lossy(&buf[..n as usize]).into_owned();
        match Arrive::decode(&text) {
            Some(a) if self.at.is_none() => self.at = Some(a),
            Some(a) => problems.push(format!(
                "protocol: {} arrived at `{}` while waiting at `{}`",
                self.side.as_str(),
                a.name,
                self.at.as_ref().map_or("", |x| x.name.as_str())
            )),
            None => problems.push(format!("protocol: {} sent {text:?}", self.side.as_str())),
        }
    }

    fn go(&mut self, payload: &str) {
        let msg = encode_go(payload);
        // SAFETY: sending our own buffer on our channel end; a role that
        // died meanwhile makes this fail, which changes nothing.
        unsafe {
            libc::send(
                self.chan.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
        if let Some(a) = self.at.take() {
            self.passed = a.name;
        }
    }

    fn kill(&mut self) {
        kill_group(self.child.id());
        self.killed = true;
        self.status = self.child.wait().ok();
    }

    fn state(&self) -> String {
        match (&self.at, self.status) {
            (_, Some(s)) => format!("{} ended ({s})", self.side.as_str()),
            (Some(a), None) => format!("{} waiting at barrier `{}`", self.side.as_str(), a.name),
            (None, None) => format!(
                "{} running after barrier `{}`",
                self.side.as_str(),
                self.passed
            ),
        }
    }
}

/// Runs the barrier protocol until both roles are done or `deadline`
/// passes (then both are killed and a hang is reported). `ring(name, n)`
/// is called at each barrier that asks for a ring check and returns a
/// problem if the check fails.
pub fn coordinate(
    ends: &mut [End; 2],
    deadline: Instant,
    mut ring: impl FnMut(&str, u32) -> Option<String>,
) -> Vec<String> {
    let mut problems = Vec::new();
    loop {
        for e in ends.iter_mut() {
            e.reap();
        }
        if ends.iter().all(End::done) {
            return problems;
        }
        if Instant::now() >= deadline || !problems.is_empty() {
            if problems.is_empty() {
                problems.push(format!(
                    "hang: killed at the deadline: {}; {}",
                    ends[0].state(),
                    ends[1].state()
                ));
            }
            for e in ends.iter_mut().filter(|e| e.status.is_none()) {
                e.kill();
            }
            return problems;
        }
        wait_readable(ends);
        for e in ends.iter_mut().filter(|e| !e.eof) {
            e.read(&mut problems);
        }
        let [s, c] = ends;
        match (&s.at, &c.at) {
            (Some(a), Some(b)) if a.name != b.name => problems.push(format!(
                "desync: server at barrier `{}`, client at `{}`",
                a.name, b.name
            )),
            (Some(a), Some(b)) => {
                let (name, n) = (a.name.clone(), a.ring.max(b.ring));
                let (pa, pb) = (a.payload.clone(), b.payload.clone());
                if n > 0 {
                    problems.extend(ring(&name, n));
                }
                s.go(&pb);
                c.go(&pa);
            }
            (Some(a), None) if c.done() => {
                if a.ring > 0 {
                    problems.extend(ring(&a.name.clone(), a.ring));
                }
                s.go("");
            }
            (None, Some(b)) if s.done() => {
                if b.ring > 0 {
                    problems.extend(ring(&b.name.clone(), b.ring));
                }
                c.go("");
            }
            _ => {}
        }
    }
}

/// Sleeps until a channel has something (or 20 ms pass).
fn wait_readable(ends: &[End; 2]) {
    let mut fds: Vec<libc::pollfd> = ends
        .iter()
        .filter(|e| !e.eof)
        .map(|e| libc::pollfd {
            fd: e.chan.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    if fds.is_empty() {
        std::thread::sleep(Duration::from_millis(5));
        return;
    }
    // SAFETY: fds is a live array of the length given.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 20) };
}
