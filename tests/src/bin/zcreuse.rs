//! zcreuse: catches a stale zero-copy registration (the shim's
//! RINGSOCK_ZEROCOPY_MIN). Raw libc, one connection.
//!
//! ```text
//! zcreuse server --host ADDR [--port P] [--size BYTES]   prints "listening PORT"
//! zcreuse client --host ADDR --port P [--size BYTES]
//! ```
//!
//! The client sends blocks of SIZE bytes (default 1 MiB), each filled with
//! its own pattern, from buffers whose pages change between sends while
//! their addresses stay the same:
//! - malloc: a chunk (mmapped by glibc: the mmap threshold is pinned at
//!   128 KiB so it stays so) is sent, freed (glibc unmaps it internally,
//!   where only the shim's free hook sees it) and malloc'd again (usually
//!   the same address, new pages), refilled, sent; four rounds;
//! - mmap: an anonymous mapping is sent, munmapped, mapped again at the
//!   same address (MAP_FIXED_NOREPLACE), refilled, sent;
//! - madvise: a mapping is sent, dropped with MADV_DONTNEED (new zero
//!   pages on the next touch), refilled, sent.
//!
//! A shim that sent from a registration of the old pages would deliver the
//! old pattern. The server checks every byte of every block and prints
//! `block K ok` lines and `ok`; a wrong byte prints `FAIL block K offset O
//! got X want Y` and exits 1. The client prints how many reused blocks
//! really had the same address (`same-address N of M`).

use std::ffi::c_void;

const BLOCKS_MALLOC: u64 = 8; // 4 rounds x (before, after)
const BLOCKS: u64 = BLOCKS_MALLOC + 4;

fn fail(msg: String) -> ! {
    println!("FAIL {msg}");
    std::process::exit(1);
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Byte `i` of block `k`: differs between any two blocks at every offset
/// in practice (a 64-bit mix of both).
fn pattern(k: u64, i: usize) -> u8 {
    let mut x = (k << 40) ^ (i as u64 / 8) ^ 0x9e37_79b9_7f4a_7c15;
    x ^= x >> 31;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 29;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 32;
    (x >> ((i % 8) * 8)) as u8 ^ (k as u8).wrapping_mul(0x3b).wrapping_add(1)
}

fn fill(p: *mut u8, n: usize, k: u64) {
    // SAFETY: p points to n writable bytes (the caller's buffer).
    let s = unsafe { std::slice::from_raw_parts_mut(p, n) };
    for (i, b) in s.iter_mut().enumerate() {
        *b = pattern(k, i);
    }
}

fn send_all(fd: i32, p: *const u8, n: usize) {
    let mut off = 0;
    while off < n {
        // SAFETY: p..p+n is readable (the caller's buffer).
        let r = unsafe { libc::send(fd, p.add(off).cast(), n - off, libc::MSG_NOSIGNAL) };
        if r < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            fail(format!("send: errno {}", errno()));
        }
        off += r as usize;
    }
}

fn sockaddr(host: std::net::Ipv4Addr, port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(host).to_be(),
        },
        sin_zero: [0; 8],
    }
}

fn anon(hint: *mut c_void, n: usize, flags: i32) -> *mut u8 {
    // SAFETY: an anonymous private mapping; the hint is only a hint (or
    // MAP_FIXED_NOREPLACE, which fails rather than replace anything).
    let p = unsafe {
        libc::mmap(
            hint,
            n,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return std::ptr::null_mut();
    }
    p.cast()
}

fn client(host: std::net::Ipv4Addr, port: u16, size: usize) {
    // SAFETY: plain socket calls on our own fd.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    let a = sockaddr(host, port);
    // SAFETY: a is a valid sockaddr_in of the given length.
    if unsafe { libc::connect(fd, (&a as *const libc::sockaddr_in).cast(), 16) } != 0 {
        fail(format!("connect: errno {}", errno()));
    }
    // Keep glibc's mmap threshold fixed (it rises after the first free of
    // an mmapped chunk, and the next malloc would come from the heap).
    // SAFETY: a plain tuning call.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024) };
    let mut same = 0;
    let mut k = 0;
    for _ in 0..BLOCKS_MALLOC / 2 {
        // SAFETY: malloc/free pairs on our own chunks.
        let p = unsafe { libc::malloc(size) }.cast::<u8>();
        fill(p, size, k);
        send_all(fd, p, size);
        // SAFETY: as above.
        unsafe { libc::free(p.cast()) };
        // SAFETY: as above.
        let q = unsafe { libc::malloc(size) }.cast::<u8>();
        same += u32::from(p == q);
        fill(q, size, k + 1);
        send_all(fd, q, size);
        // SAFETY: as above.
        unsafe { libc::free(q.cast()) };
        k += 2;
    }
    let p = anon(std::ptr::null_mut(), size, 0);
    fill(p, size, k);
    send_all(fd, p, size);
    // SAFETY: our own mapping.
    unsafe { libc::munmap(p.cast(), size) };
    let mut q = anon(p.cast(), size, libc::MAP_FIXED_NOREPLACE);
    if q.is_null() {
        q = anon(p.cast(), size, 0);
    }
    same += u32::from(p == q);
    fill(q, size, k + 1);
    send_all(fd, q, size);
    // SAFETY: our own mapping.
    unsafe { libc::munmap(q.cast(), size) };
    k += 2;
    let p = anon(std::ptr::null_mut(), size, 0);
    fill(p, size, k);
    send_all(fd, p, size);
    // SAFETY: our own mapping; its pages are dropped, the range stays.
    unsafe { libc::madvise(p.cast(), size, libc::MADV_DONTNEED) };
    fill(p, size, k + 1);
    send_all(fd, p, size);
    same += 1;
    // SAFETY: our own mapping.
    unsafe { libc::munmap(p.cast(), size) };
    // SAFETY: our fd.
    unsafe { libc::shutdown(fd, libc::SHUT_WR) };
    // Wait for the server's verdict (its close).
    let mut b = [0u8; 64];
    // SAFETY: b is writable.
    while unsafe { libc::read(fd, b.as_mut_ptr().cast(), b.len()) } > 0 {}
    println!("same-address {same} of {}", BLOCKS / 2);
    println!("sent {BLOCKS} blocks of {size}");
}

fn server(host: std::net::Ipv4Addr, port: u16, size: usize) {
    // SAFETY: plain socket calls on our own fds.
    let l = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    let one: i32 = 1;
    // SAFETY: as above.
    unsafe {
        libc::setsockopt(
            l,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const i32).cast(),
            4,
        )
    };
    let a = sockaddr(host, port);
    // SAFETY: a is a sockaddr_in, 16 bytes, for our own socket.
    let bound = unsafe { libc::bind(l, (&a as *const libc::sockaddr_in).cast(), 16) } == 0;
    // SAFETY: listen on our own socket.
    if !bound || unsafe { libc::listen(l, 4) } != 0 {
        fail(format!("bind/listen: errno {}", errno()));
    }
    // SAFETY: sockaddr_in is plain data; zeroes are a valid value.
    let mut got: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = 16u32;
    // SAFETY: got/len are valid out-pointers.
    unsafe { libc::getsockname(l, (&mut got as *mut libc::sockaddr_in).cast(), &mut len) };
    println!("listening {}", u16::from_be(got.sin_port));
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // SAFETY: as above.
    let fd = unsafe { libc::accept(l, std::ptr::null_mut(), std::ptr::null_mut()) };
    if fd < 0 {
        fail(format!("accept: errno {}", errno()));
    }
    let mut buf = vec![0u8; 256 * 1024];
    let mut pos: u64 = 0;
    let total = BLOCKS * size as u64;
    loop {
        // SAFETY: buf is writable.
        let r = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if r < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            fail(format!("read: errno {}", errno()));
        }
        if r == 0 {
            break;
        }
        for &b in &buf[..r as usize] {
            if pos >= total {
                fail(format!("more than {total} bytes"));
            }
            let (k, i) = (pos / size as u64, (pos % size as u64) as usize);
            let want = pattern(k, i);
            if b != want {
                let stale = (0..BLOCKS).find(|&j| j != k && pattern(j, i) == b);
                fail(format!(
                    "block {k} offset {i} got {b:02x} want {want:02x} (matches block {stale:?}'s pattern: a stale registration sends old pages)"
                ));
            }
            pos += 1;
            if pos.is_multiple_of(size as u64) {
                println!("block {} ok", pos / size as u64 - 1);
            }
        }
    }
    if pos != total {
        fail(format!("stream ended after {pos} of {total} bytes"));
    }
    println!("ok");
}

fn main() {
    let mut a = std::env::args().skip(1);
    let role = a.next().unwrap_or_default();
    let (mut host, mut port, mut size) = (std::net::Ipv4Addr::LOCALHOST, 0u16, 1usize << 20);
    while let Some(k) = a.next() {
        let v = a.next().unwrap_or_default();
        match k.as_str() {
            "--host" => host = v.parse().expect("--host ADDR"),
            "--port" => port = v.parse().expect("--port P"),
            "--size" => size = v.parse().expect("--size BYTES"),
            _ => fail(format!("unknown option {k}")),
        }
    }
    // A watchdog: a hung transfer fails instead of hanging the suite.
    std::thread::spawn(|| {
        std::thread::sleep(std::time::Duration::from_secs(60));
        println!("FAIL timeout after 60 s");
        std::process::exit(2);
    });
    match role.as_str() {
        "server" => server(host, port, size),
        "client" => client(host, port, size),
        _ => fail("usage: zcreuse server|client --host ADDR [--port P] [--size BYTES]".into()),
    }
}
