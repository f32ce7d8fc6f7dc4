//! Asks the daemon for its metrics text over the control socket (what
//! `ringsock-ctl metrics` prints and the HTTP endpoint serves).

use std::path::Path;
use std::time::Duration;

use ringsock_proto::{Client, Error, Msg, ProtoError};

/// How long a metrics request waits on an unresponsive daemon.
pub const TIMEOUT: Duration = Duration::from_secs(3);

/// The exposition text, or why there is none, in one line.
pub fn fetch(socket: &Path, who: &str) -> Result<String, String> {
    let fail = |e: Error| format!("cannot get metrics from {}: {e}", socket.display());
    let mut c = Client::connect(socket, Some(TIMEOUT)).map_err(fail)?;
    c.hello(who).map_err(fail)?;
    match c.call(&Msg::Metrics, &[]) {
        Ok((Msg::MetricsReply { text }, _)) => Ok(text),
        Ok((Msg::Error { code, text }, _)) => Err(format!(
            "daemon on {} refused metrics: {} ({text})",
            socket.display(),
            code.as_str()
        )),
        Ok((other, _)) => Err(fail(Error::Proto(ProtoError::UnknownKind {
            kind: other.kind(),
        }))),
        // A daemon that predates the request drops the session on it.
        Err(Error::Closed) => Err(format!(
            "the daemon on {} closed the session: it predates the Metrics request",
            socket.display()
        )),
        Err(e) => Err(fail(e)),
    }
}

/// `ringsock-ctl metrics`: prints the text; exit 0, or 1 with the reason.
pub fn run(socket: &Path) -> i32 {
    match fetch(socket, "ringsock-ctl metrics") {
        Ok(text) => {
            print!("{text}");
            0
        }
        Err(e) => {
            eprintln!("ringsock-ctl: {e}");
            1
        }
    }
}
