//! exitsend: a writer that exits with its socket still open. The kernel
//! delivers what a process wrote before it exits, whether it leaves
//! through `exit` (atexit handlers run) or `_exit` (they do not); under
//! the shim the last small writes may still sit in a batch, and on verbs
//! in WRITEs the dying queue pair has not sent.
//!
//! ```text
//! exitsend server --host ADDR --port P          reads to EOF: "got N fnv X"
//! exitsend client --host ADDR --port P --bytes N --chunk C --how exit|_exit
//!                  [--pause-ms MS]
//! ```
//!
//! The client connects, sleeps MS (so the connection can be seen in
//! status), writes N bytes of a fixed pattern in C-byte writes, prints
//! "sent N fnv X", and exits through `how` without closing the socket.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use ringsock_integration::args::{fail, number, value};

fn fnv(h: &mut u64, bytes: &[u8]) {
    for b in bytes {
        *h ^= u64::from(*b);
        *h = h.wrapping_mul(0x100_0000_01b3);
    }
}

const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let addr = format!(
        "{}:{}",
        value(&args, "--host", None),
        value(&args, "--port", None)
    );
    match args.get(1).map(String::as_str) {
        Some("server") => {
            let l = TcpListener::bind(&addr).unwrap_or_else(|e| fail(&format!("bind {addr}: {e}")));
            println!("listening");
            let (mut s, _) = l.accept().unwrap_or_else(|e| fail(&format!("accept: {e}")));
            let (mut n, mut h) = (0usize, FNV_START);
            let mut buf = vec![0u8; 64 << 10];
            loop {
                match s.read(&mut buf) {
                    Ok(0) => break,
                    Ok(k) => {
                        fnv(&mut h, &buf[..k]);
                        n += k;
                    }
                    Err(e) => fail(&format!("read after {n} bytes: {e}")),
                }
            }
            println!("got {n} fnv {h:016x}");
        }
        Some("client") => {
            let total = number(&args, "--bytes", None) as usize;
            let chunk = (number(&args, "--chunk", None) as usize).max(1);
            let how = value(&args, "--how", None);
            let data = ringsock_integration::payload(total, 7);
            let mut h = FNV_START;
            fnv(&mut h, &data);
            let pause = args
                .iter()
                .position(|a| a == "--pause-ms")
                .map_or(0, |_| number(&args, "--pause-ms", None) as usize);
            let mut s =
                TcpStream::connect(&addr).unwrap_or_else(|e| fail(&format!("connect {addr}: {e}")));
            std::thread::sleep(std::time::Duration::from_millis(pause as u64));
            for c in data.chunks(chunk) {
                if let Err(e) = s.write_all(c) {
                    fail(&format!("send: {e}"));
                }
            }
            println!("sent {total} fnv {h:016x}");
            let _ = std::io::stdout().flush();
            // The socket stays open: no close, no drop.
            std::mem::forget(s);
            match how.as_str() {
                // SAFETY: ends the process; atexit handlers run.
                "exit" => unsafe { libc::exit(0) },
                // SAFETY: ends the process at once.
                "_exit" => unsafe { libc::_exit(0) },
                _ => fail("--how wants exit or _exit"),
            }
        }
        _ => fail("usage: exitsend server|client --host ADDR --port P ..."),
    }
}
