//! Scenarios that differ under the shim today, and how (kernel first,
//! then the shim). The suite fails when a scenario missing here differs,
//! and when one listed here matches the kernel again, so the table only
//! shrinks and stays true. An entry marked `sometimes` is a difference
//! that shows in some runs only (a race in the shim): the suite accepts
//! either verdict for it, so it cannot tell when it is fixed; keep those
//! few and remove one as soon as its fix is in.

/// A known difference.
pub struct Known {
    pub name: &'static str,
    /// What differs, in one line (the kernel's answer vs the shim's).
    pub diff: &'static str,
    /// The difference shows in some runs only.
    pub sometimes: bool,
}

const fn k(name: &'static str, diff: &'static str) -> Known {
    Known {
        name,
        diff,
        sometimes: false,
    }
}

const fn sometimes(name: &'static str, diff: &'static str) -> Known {
    Known {
        name,
        diff,
        sometimes: true,
    }
}

pub const KNOWN: &[Known] = &[
    // Sends sit in an open batch until the background flush.
    sometimes("data_visible_after_send", "recv(MSG_DONTWAIT) right after the peer's send returned: 3 bytes vs (most runs) EAGAIN: the batch is not flushed yet"),
    // Descriptors the shim holds in the program's low range.
    k("accept_order_fifo", "the third connection's fd: 7 (client) / 8 (server) vs 8 / 9: the shim holds a low descriptor while a handshake is pending"),
    k("fd_numbers_lowest_free", "the third socket and accept: fd 7 / 8 vs 8 / 9: a low descriptor is taken by the shim (a ring memfd on the server side)"),
    // Calls and options.
    sometimes("shutdown_rdwr_wakes_poller", "poll(POLLIN, -1) in another thread woken by this end's shutdown(SHUT_RDWR): POLLIN|POLLHUP vs (some runs) POLLIN"),
    k("zero_length_calls", "recv of 0 bytes on an empty socket: EAGAIN (MSG_DONTWAIT) / blocks until data vs 0 at once"),
    k("tcp_info_established", "TCP_INFO after the peer's shutdown(SHUT_WR): CLOSE_WAIT vs ESTABLISHED (no FIN on the kernel socket)"),
    // The reset that answers a send into a closed peer is not seen.
    k("peer_sigkill_idle", "peer SIGKILLed, then our first send: POLLERR|POLLHUP reported vs never (the next send is EPIPE on both)"),
    k("epipe_sigpipe_caught", "after the peer closed and our first send: POLLERR|POLLHUP reported vs never (the sends and SIGPIPEs agree)"),
    k("epipe_sigpipe_default_kills", "after the peer closed and our first send: POLLERR|POLLHUP reported vs never (the sender dies of SIGPIPE on both)"),
    k("epipe_msg_nosignal", "after the peer closed and our first send: POLLERR|POLLHUP reported vs never (the sends agree)"),
    k("epipe_write_sigpipe", "after the peer closed and our first write: POLLERR|POLLHUP reported vs never (the writes and SIGPIPEs agree)"),
];

/// The known difference of scenario `name`, if any.
pub fn known(name: &str) -> Option<&'static Known> {
    KNOWN.iter().find(|k| k.name == name)
}

#[cfg(test)]
mod tests {
    use super::KNOWN;
    use crate::scenario::all;

    #[test]
    fn every_entry_names_a_scenario_once() {
        let names: Vec<&str> = all().iter().map(|s| s.name).collect();
        for (i, k) in KNOWN.iter().enumerate() {
            assert!(
                names.contains(&k.name),
                "known.rs lists `{}`, no such scenario",
                k.name
            );
            assert!(
                KNOWN[..i].iter().all(|o| o.name != k.name),
                "known.rs lists `{}` twice",
                k.name
            );
            assert!(
                !k.diff.is_empty() && !k.diff.contains('\n'),
                "`{}`: one line",
                k.name
            );
        }
    }
}
