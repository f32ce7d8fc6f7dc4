//! The echo server helper bins share: listens on 127.0.0.1:0, prints
//! `listening PORT`, and echoes every connection (a thread each) until
//! its end of stream; any error ends the process (`seccomp::fail`).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener};

use crate::seccomp::fail;

/// Serves until killed.
pub fn serve() -> ! {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap_or_else(|e| fail(&e.to_string()));
    let port = l.local_addr().map(|a| a.port()).unwrap_or(0);
    println!("listening {port}");
    std::io::stdout().flush().ok();
    for s in l.incoming() {
        let mut s = s.unwrap_or_else(|e| fail(&format!("accept: {e}")));
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            loop {
                let n = s
                    .read(&mut buf)
                    .unwrap_or_else(|e| fail(&format!("read: {e}")));
                if n == 0 {
                    return;
                }
                s.write_all(&buf[..n])
                    .unwrap_or_else(|e| fail(&format!("write: {e}")));
            }
        });
    }
    std::process::exit(0)
}
