//! Asks the daemon for every page of the connection listing.

use std::path::Path;
use std::time::Duration;

use ringsock_proto::{Client, Error, Msg, StatusEntry};

/// How long status waits on an unresponsive daemon.
const TIMEOUT: Duration = Duration::from_secs(3);

/// Every entry, page after page, with every counter and the process names
/// (`StatusNamed`); from a daemon that predates it (it closes the session
/// on the unknown kind) without names (`StatusAll`), and from one older
/// still with at most `MAX_RING_STATS_V1` counters per entry (`Status`).
pub fn fetch(socket: &Path) -> Result<Vec<StatusEntry>, Error> {
    let mut asked = [Request::Named, Request::All, Request::V1]
        .into_iter()
        .peekable();
    loop {
        let req = asked
            .next()
            .expect("the list ends with a request that is answered");
        match fetch_pages(socket, req) {
            Err(Fetch::Refused(_)) if asked.peek().is_some() => {}
            r => return r.map_err(Fetch::into_error),
        }
    }
}

/// The listing requests, newest first.
#[derive(Clone, Copy)]
enum Request {
    Named,
    All,
    V1,
}

/// Why a listing failed: `Refused` when the daemon hung up on the very
/// first listing request (after a good `Hello`), which is what a daemon
/// that does not know that request kind does.
enum Fetch {
    Refused(Error),
    Other(Error),
}

impl Fetch {
    fn into_error(self) -> Error {
        match self {
            Fetch::Refused(e) | Fetch::Other(e) => e,
        }
    }
}

fn fetch_pages(socket: &Path, request: Request) -> Result<Vec<StatusEntry>, Fetch> {
    let mut c = Client::connect(socket, Some(TIMEOUT)).map_err(Fetch::Other)?;
    c.hello("ringsock-ctl status").map_err(Fetch::Other)?;
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let req = match request {
            Request::Named => Msg::StatusNamed { after },
            Request::All => Msg::StatusAll { after },
            Request::V1 => Msg::Status { after },
        };
        let reply = match c.call(&req, &[]) {
            Ok((m, _)) => m,
            Err(e) if after.is_none() && hung_up(&e) => return Err(Fetch::Refused(e)),
            Err(e) => return Err(Fetch::Other(e)),
        };
        match reply {
            Msg::StatusReply { entries, next } | Msg::StatusNamedReply { entries, next } => {
                all.extend(entries);
                match next {
                    Some(n) if Some(n) != after => after = Some(n),
                    _ => return Ok(all),
                }
            }
            other => {
                return Err(Fetch::Other(Error::Proto(
                    ringsock_proto::ProtoError::UnknownKind { kind: other.kind() },
                )))
            }
        }
    }
}

/// The daemon closed the session (not a timeout: an unresponsive daemon
/// is not asked twice).
fn hung_up(e: &Error) -> bool {
    match e {
        Error::Closed => true,
        Error::Io(e) => matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        ),
        Error::Proto(_) => false,
    }
}
