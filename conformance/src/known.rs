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
    k("data_visible_after_send", "recv(MSG_DONTWAIT) right after the peer's send returned: 3 bytes vs EAGAIN (the batch is not flushed yet)"),
    // Descriptors the shim holds in the program's low range.
    k("accept_order_fifo", "the third connection's fd: 7 (client) / 8 (server) vs 8 / 9: the shim holds a low descriptor while a handshake is pending"),
    k("fd_numbers_lowest_free", "the third socket and accept: fd 7 / 8 vs 8 / 9: a low descriptor is taken by the shim (a ring memfd on the server side)"),
    // Addresses and flags on receives.
    k("sendmsg_recvmsg", "recvmsg on a connected socket: msg_namelen 0 vs 16 (the shim fills in the peer address)"),
    k("recvfrom_connected_no_address", "recvfrom with an address buffer: addrlen 0 (no address) vs the peer's address, addrlen 16"),
    k("msg_trunc_discards", "recv(4, MSG_TRUNC): buffer left untouched vs filled with \"abcd\" (the bytes are copied)"),
    k("msg_errqueue_eagain", "recv(MSG_ERRQUEUE) on a connection with nothing queued: EAGAIN at once vs blocks (the role ends)"),
    k("zero_length_calls", "recv of 0 bytes on an empty socket: EAGAIN (MSG_DONTWAIT) / blocks until data vs 0 at once"),
    k("so_rcvlowat", "SO_RCVLOWAT 10 with 5 bytes there: poll 0 / select empty / recv blocks vs POLLIN / readable / recv returns 5"),
    // poll masks.
    k("poll_fresh_connection", "poll for everything on an idle connection: POLLOUT|POLLWRNORM vs POLLOUT (no POLLWRNORM)"),
    k("poll_rdnorm_wrnorm_only", "poll(POLLRDNORM) / poll(POLLWRNORM) asked alone with data there: reported vs 0"),
    k("poll_rdhup_on_fin", "after the peer's shutdown(SHUT_WR), before reading the EOF: POLLIN|POLLOUT|POLLRDHUP vs POLLIN|POLLOUT"),
    k("poll_rdhup_with_data_pending", "peer sent 4 bytes then shut down, bytes unread: POLLRDHUP reported vs not until they are read"),
    k("epoll_rdhup", "peer shut down, EOF not read yet: epoll_wait EPOLLIN|EPOLLRDHUP vs EPOLLIN"),
    k("poll_hup_after_both_shut", "both ends shut down their sending side: POLLIN|POLLOUT|POLLHUP|POLLRDHUP vs POLLIN|POLLOUT"),
    k("poll_hup_own_shut_rdwr", "after this end's shutdown(SHUT_RDWR): POLLHUP|POLLRDHUP here and POLLRDHUP at the peer vs neither"),
    k("shutdown_rdwr_wakes_poller", "poll(POLLIN, -1) in another thread when this end shuts down SHUT_RDWR: wakes with POLLIN|POLLHUP vs never wakes"),
    // shutdown leaves the kernel socket alone.
    k("tcp_info_established", "TCP_INFO after the peer's shutdown(SHUT_WR): CLOSE_WAIT vs ESTABLISHED (no FIN on the kernel socket)"),
    k("shutdown_rd_then_peer_sends", "after shutdown(SHUT_RD): POLLRDHUP missing, and the peer's later 5 bytes are delivered vs dropped (recv 0)"),
    // A reset is taken for an end of stream.
    k("poll_err_hup_after_reset", "peer reset (SO_LINGER {1,0}): after SO_ERROR, POLLHUP missing; send EPIPE vs accepted (1)"),
    k("epoll_err_hup_after_reset", "peer reset: epoll_wait EPOLLIN|EPOLLERR|EPOLLHUP|EPOLLRDHUP then recv ECONNRESET vs EPOLLIN then recv 0"),
    k("peer_close_unread_data", "peer closed with our bytes unread: POLLERR|POLLHUP|POLLRDHUP, recv ECONNRESET, send EPIPE vs POLLIN|POLLOUT, recv 0, send accepted"),
    k("peer_sigkill_unread_data", "peer SIGKILLed with our bytes unread: POLLERR|POLLHUP, recv ECONNRESET, send EPIPE vs POLLRDHUP only, recv 0, send accepted"),
    k("peer_sigkill_idle", "peer SIGKILLed, then our first send: POLLERR|POLLHUP reported vs never"),
    k("peer_reset_with_our_data_unread", "peer sent 12 bytes then reset: after reading them recv ECONNRESET vs 0"),
    k("peer_reset_while_recv_blocked", "recv blocked when the peer resets: -1 ECONNRESET vs 0"),
    sometimes("peer_reset_while_poll_blocked", "peer reset while poll(POLLIN) is blocked: POLLIN|POLLERR|POLLHUP (sometimes POLLIN only), then recv ECONNRESET vs 0"),
    k("peer_reset_while_send_blocked", "send blocked on a full connection when the peer resets: -1 ECONNRESET vs -1 EPIPE"),
    k("epipe_sigpipe_caught", "second send after the peer closed: -1 EPIPE and SIGPIPE vs accepted (6), the EPIPE comes one send later"),
    k("epipe_sigpipe_default_kills", "second send after the peer closed kills the sender with SIGPIPE vs accepted (6), killed one send later"),
    k("epipe_msg_nosignal", "second send(MSG_NOSIGNAL) after the peer closed: -1 EPIPE vs accepted (6)"),
    k("epipe_write_sigpipe", "second write after the peer closed: -1 EPIPE and SIGPIPE vs accepted (6)"),
    sometimes("peer_close_while_poll_blocked", "poll(POLLIN|POLLRDHUP, -1) blocked when the peer closes: POLLIN|POLLRDHUP vs sometimes POLLIN only"),
    sometimes("peer_close_while_epoll_blocked", "epoll_wait(-1) blocked when the peer closes: EPOLLIN|EPOLLRDHUP vs sometimes EPOLLIN only"),
    sometimes("select_sets_idle_and_ready", "select after reading all the bytes: not readable vs sometimes still readable"),
    // Urgent data is sent inline.
    k("oob_urgent_byte", "abc, urgent !, def: POLLPRI, reads stop at the mark, recv(MSG_OOB) \"!\" then EINVAL vs no POLLPRI, \"abc!def\" in one read, recv(MSG_OOB) blocks"),
    k("oob_select_except", "the urgent byte: select's exceptional set has the fd and recv(MSG_OOB) is \"!\" vs empty set and \"a\" (a normal byte)"),
    k("oob_peek", "recv(MSG_OOB|MSG_PEEK) and recv(MSG_OOB): \"!\" vs \"a\" (normal bytes are read as urgent)"),
    k("oob_epollpri", "the urgent byte: EPOLLPRI reported and recv(MSG_OOB) \"!\" vs nothing and \"a\""),
    k("oob_inline", "SO_OOBINLINE: recv(MSG_OOB) EINVAL and reads stop at the mark (SIOCATMARK 1) vs recv(MSG_OOB) \"a\", no mark"),
    k("oob_sender_view", "send(\"xyz\", MSG_OOB): recv(MSG_OOB) is \"z\" and the stream \"xy\" vs \"x\" and \"yz\""),
    // fork: the ring is claimed by one process.
    k("fork_child_reads_part_parent_rest", "fork: after the child read 100 bytes, the parent's read: the other 100 vs EBADFD"),
    k("fork_parent_reads_part_child_rest", "fork: after the parent read 100 bytes, the child reads the same 100 bytes again (duplicated) vs the next 100"),
    k("fork_child_writes_exits_parent_writes", "fork: after the child wrote and exited, the parent's send: 64 vs EBADFD; the peer gets 64 of 128 bytes"),
    k("fork_alternate_writes", "fork: parent and child write 10 bytes in turn: the peer gets 40 vs 20 (the other process's writes are lost, or the ring is reset as corrupt)"),
    k("fork_alternate_reads", "fork: reads in turn get messages 1, 2, 3 vs 1, 1, 2 (the child re-reads what the parent read)"),
    k("fork_child_reads_parent_writes", "fork: the parent's replies after the child read: sent vs EBADFD; the peer never gets them"),
    k("fork_child_shutdown_wr", "fork: after the parent read 10 bytes, the child's read gets the next 5 vs a stale 5 bytes"),
    k("fork_peer_shutdown_both_see_eof", "fork: after the child read the EOF, the parent's recv 0 and send vs EBADFD (logged once per call: ~800000 lines in 3 s)"),
    k("fork_client_child_writes_parent_reads", "fork on the client: after the child wrote, the parent's read: 20 bytes vs EBADFD"),
    // exec and SCM_RIGHTS: the new holder uses the bare kernel socket.
    k("exec_inherited_reads", "fork+exec: the exec'd image reads nothing (the bytes stay in the ring); the parent then reads the first 50 of them"),
    k("exec_inherited_writes", "fork+exec: the exec'd image's write goes over TCP: the peer's shim resets the connection (ECONNRESET, then EOF)"),
    k("exec_inherited_reads_and_writes", "fork+exec: the exec'd image reads nothing, its reply resets the connection at the peer"),
    k("exec_parent_closes_exec_continues", "fork+exec: the exec'd image's write resets the connection at the peer (ECONNRESET) vs delivered"),
    k("exec_child_exits_parent_continues", "fork+exec: the exec'd image's write resets the connection; the peer sees EOF, then stale bytes"),
    k("exec_in_place_reads_and_writes", "exec in place: the new image reads nothing of the request, its reply resets the connection"),
    k("exec_in_place_writes", "exec in place: the new image's write resets the connection; the peer reads 0 of 40 bytes, ECONNRESET"),
    k("exec_in_place_client", "exec in place on the client: the new image's bytes never reach the server ring, its reads get nothing; ECONNRESET"),
    k("scm_sender_keeps_receiver_reads", "SCM_RIGHTS: the receiver reads nothing (the bytes stay in the ring); the sender then reads the first 50 of them"),
    k("scm_sender_keeps_receiver_writes", "SCM_RIGHTS: the receiver's write resets the connection at the peer (ECONNRESET, then EOF)"),
    k("scm_sender_keeps_both_close", "SCM_RIGHTS: the sender's close ends the stream for the peer (EOF) though the receiver still holds the fd"),
    k("scm_sender_closes_receiver_reads", "SCM_RIGHTS, sender closed its copy: the peer sees EOF at once; the receiver reads nothing"),
    k("scm_sender_closes_receiver_writes", "SCM_RIGHTS, sender closed its copy: the peer sees EOF instead of the receiver's 100 bytes"),
    k("scm_sender_closes_receiver_exits", "SCM_RIGHTS, sender closed its copy: the peer sees EOF instead of the receiver's 10 bytes"),
    k("scm_client_sender_closes", "SCM_RIGHTS on the client, sender closed: the server sees EOF instead of the receiver's bytes; the receiver reads nothing"),
    k("scm_forked_receiver", "SCM_RIGHTS to a forked process: it reads nothing, its write resets the connection at the peer"),
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
