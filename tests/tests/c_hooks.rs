//! The interposed C entry points on plain TCP sockets give exactly the
//! results they give without the shim: fcntl F_GETFL/F_SETFL O_NONBLOCK,
//! ioctl FIONREAD/FIONBIO, dup2 onto an open fd, F_DUPFD_CLOEXEC,
//! getsockopt(SO_ERROR), select/poll/epoll (level and edge), MSG_PEEK,
//! MSG_WAITALL, MSG_DONTWAIT, half-close, and untouched UDP/AF_UNIX.

use std::time::Duration;

use ringsock_integration::{assert_shim_silent, require, Cmd};

fn probe(shimmed: bool) -> String {
    let script = format!(
        "{}/tests/scripts/hooks_probe.py",
        env!("CARGO_MANIFEST_DIR")
    );
    let cmd = if shimmed {
        Cmd::shimmed("python3")
    } else {
        Cmd::plain("python3")
    };
    let (out, err) = cmd.arg(script).run_ok(Duration::from_secs(20));
    if shimmed {
        assert_shim_silent("hooks_probe.py", &err);
    }
    out
}

#[test]
fn c_level_hooks_match_plain_libc() {
    require!("python3");
    let plain = probe(false);
    let shimmed = probe(true);
    assert!(
        plain.contains("done=True"),
        "probe incomplete without the shim:\n{plain}"
    );
    assert_eq!(shimmed, plain, "results differ with the shim");
    // A few values pinned, so that a probe that silently checks nothing
    // cannot pass.
    for line in [
        "fcntl_after_set_nonblock=True",
        "recv_empty_nonblocking=err:EAGAIN",
        "fcntl_after_fionbio_off=False",
        "fionread=10",
        "peek=abcd",
        "after_peek=abcdefghij",
        "waitall=123456789abc",
        "peer_got=via-dup2",
        "dupfd_cloexec=1",
        "so_error=ECONNREFUSED",
        "read_after_half_close=late",
    ] {
        assert!(
            shimmed.lines().any(|l| l == line),
            "missing `{line}` in:\n{shimmed}"
        );
    }
}
