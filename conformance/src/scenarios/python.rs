//! python3 asyncio at one end: the role execs python3 with a small script
//! that logs in the same format and passes the same barriers (through the
//! side channel it inherits).

use std::os::unix::process::CommandExt;

use crate::ops;
use crate::role::{payload, Role};
use crate::scenario::{sc, Scenario};

pub fn list() -> Vec<Scenario> {
    vec![
        sc("python_asyncio_echo_server", "a python3 asyncio echo server: 200000 bytes from a raw client come back intact, then EOF", echo_server),
        sc("python_asyncio_client", "a python3 asyncio client: request, reply and EOF against a raw server", asyncio_client),
    ]
}

/// The script: `python3 -c SCRIPT ROLE PORT LOG`. Its lines go to the
/// role's log (one write each, O_APPEND), its barriers over the inherited
/// side channel; it hashes with the same FNV-1a as `obs::fnv`.
const SCRIPT: &str = r#"
import asyncio, os, socket, sys
role, port, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ip = os.environ.get("CONFORM_SERVER_IP", "127.0.0.1")
logfd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
sync = socket.socket(fileno=int(os.environ["CONFORM_SYNC_FD"]))

def note(text):
    os.write(logfd, ("py: " + text + "\n").encode())

def barrier(name, ring=0):
    sync.send(("B\t%s\t%d\t" % (name, ring)).encode())
    if not sync.recv(4096).startswith(b"G\t"):
        sys.exit(91)

def fnv(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "h=%016x" % h

async def serve():
    done = asyncio.Event()
    async def conn(reader, writer):
        barrier("connected", 1)
        got = bytearray()
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                break
            got += chunk
            writer.write(chunk)
            await writer.drain()
        note("echoed %d bytes %s, then EOF" % (len(got), fnv(got)))
        writer.close()
        await writer.wait_closed()
        done.set()
    server = await asyncio.start_server(conn, ip, port)
    note("listening")
    barrier("listening")
    await done.wait()
    server.close()
    await server.wait_closed()

async def client():
    barrier("listening")
    reader, writer = await asyncio.open_connection(ip, port)
    note("connected")
    barrier("connected", 1)
    writer.write(b"hello from asyncio")
    await writer.drain()
    reply = await reader.readexactly(100000)
    note("reply %d bytes %s" % (len(reply), fnv(reply)))
    writer.write_eof()
    rest = await reader.read()
    note("then %d more bytes (EOF)" % len(rest))
    writer.close()
    await writer.wait_closed()

asyncio.run(serve() if role == "server" else client())
note("done")
barrier("end")
"#;

/// Replaces the role process with python3 running the script.
fn exec_python(r: &Role) -> ! {
    let err = std::process::Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .arg(r.side.as_str())
        .arg(r.port.to_string())
        .arg(&r.log_path)
        .exec();
    r.note(format!("exec python3 failed: {err}"));
    std::process::exit(2);
}

fn echo_server(r: &mut Role) {
    const N: usize = 200_000;
    if r.is_server() {
        exec_python(r);
    }
    r.barrier("listening");
    let fd = r.connect();
    r.ring("connected", 1);
    let sender = std::thread::spawn(move || {
        let line = ops::send_all(fd, N, 50, 0).0;
        let shut = ops::shutdown(fd, libc::SHUT_WR).0;
        (line, shut)
    });
    let got = r.recv_to_end(fd, 2 * N);
    let (line, shut) = sender.join().expect("sender thread");
    r.note(line);
    r.note(shut);
    r.note(format!(
        "the echo is what was sent: {}",
        if got == payload(N, 50) { "yes" } else { "no" }
    ));
}

fn asyncio_client(r: &mut Role) {
    if !r.is_server() {
        exec_python(r);
    }
    let fd = r.open();
    r.recv_all(fd, 18);
    r.send_all(fd, 100_000, 51, 0);
    r.await_eof(fd);
    r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
    r.call(ops::send(fd, b"bye", 0));
    r.call(ops::shutdown(fd, libc::SHUT_WR));
}
