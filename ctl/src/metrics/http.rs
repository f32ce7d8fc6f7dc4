//! `GET /metrics` over plain HTTP/1.1, on a thread of its own: each
//! request is answered by asking the daemon over its control socket, like
//! any other client, so the event loop never waits on an HTTP client.
//!
//! One connection at a time, one request per connection (`Connection:
//! close`). A client gets [`REQUEST_DEADLINE`] in all to send its request
//! head, of at most [`MAX_REQUEST`] bytes, and as long to take the answer:
//! a silent or slow client delays the next scrape by that much at most.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use log::{debug, warn};

use super::fetch;

/// Time a client has to send its request head (and to read the answer).
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(2);
/// Largest request head read; a longer one is answered 431.
pub const MAX_REQUEST: usize = 8192;
/// Most headers parsed.
const MAX_HEADERS: usize = 32;
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Parses `ADDR:PORT` (IPv6 in brackets).
pub fn parse_listen(s: &str) -> Option<SocketAddr> {
    s.trim().parse().ok()
}

/// Serves `listener` until the process exits, asking the daemon on
/// `socket` for each scrape.
pub fn spawn(listener: TcpListener, socket: PathBuf) -> io::Result<thread::JoinHandle<()>> {
    thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || serve(&listener, &socket))
}

fn serve(listener: &TcpListener, socket: &std::path::Path) {
    loop {
        match listener.accept() {
            Ok((stream, peer)) => {
                if let Err(e) = answer(stream, socket) {
                    debug!("metrics client {peer}: {e}");
                }
            }
            Err(e) => {
                // EMFILE and the like: wait rather than spin on a listener
                // that stays readable.
                warn!("metrics listener: accept failed: {e}");
                thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

/// What a request head asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    Metrics,
    /// A well-formed request for anything else: (status, reason).
    Other(u16, &'static str),
}

/// Reads one request head within the deadline and the size bound.
fn read_head(stream: &mut TcpStream) -> Result<Vec<u8>, (u16, &'static str)> {
    let deadline = Instant::now() + REQUEST_DEADLINE;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        if buf.windows(4).any(|w| w == b"\r\n\r\n") {
            return Ok(buf);
        }
        if buf.len() >= MAX_REQUEST {
            return Err((431, "Request Header Fields Too Large"));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return Err((408, "Request Timeout"));
        }
        let want = chunk.len().min(MAX_REQUEST - buf.len());
        match stream.read(&mut chunk[..want]) {
            Ok(0) => return Err((400, "Bad Request")),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Err((408, "Request Timeout")),
        }
    }
}

/// Classifies a complete request head.
pub fn route(head: &[u8]) -> Request {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Request::Other(400, "Bad Request"),
    }
    let path = req.path.unwrap_or("");
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    match (req.method, path) {
        (Some("GET"), "/metrics") => Request::Metrics,
        (Some("GET"), _) => Request::Other(404, "Not Found"),
        _ => Request::Other(405, "Method Not Allowed"),
    }
}

fn answer(mut stream: TcpStream, socket: &std::path::Path) -> io::Result<()> {
    stream.set_write_timeout(Some(REQUEST_DEADLINE))?;
    let request = match read_head(&mut stream) {
        Ok(head) => route(&head),
        Err((code, why)) => Request::Other(code, why),
    };
    let (code, reason, body) = match request {
        Request::Metrics => match fetch::fetch(socket, "ringsock-ctl metrics-http") {
            Ok(text) => (200, "OK", text),
            Err(e) => (503, "Service Unavailable", format!("{e}\n")),
        },
        Request::Other(code, why) => (code, why, format!("{why}\n")),
    };
    let ctype = if code == 200 {
        CONTENT_TYPE
    } else {
        "text/plain; charset=utf-8"
    };
    let allow = if code == 405 { "Allow: GET\r\n" } else { "" };
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(
            route(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Request::Metrics
        );
        assert_eq!(
            route(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Request::Metrics
        );
        assert_eq!(
            route(b"GET / HTTP/1.1\r\n\r\n"),
            Request::Other(404, "Not Found")
        );
        assert_eq!(
            route(b"POST /metrics HTTP/1.1\r\n\r\n"),
            Request::Other(405, "Method Not Allowed")
        );
        assert_eq!(
            route(b"\x00\xffgarbage\r\n\r\n"),
            Request::Other(400, "Bad Request")
        );
        assert_eq!(
            parse_listen("127.0.0.1:9477"),
            Some("127.0.0.1:9477".parse().unwrap())
        );
        assert_eq!(parse_listen("[::1]:80"), Some("[::1]:80".parse().unwrap()));
        assert_eq!(parse_listen("localhost"), None);
    }
}
