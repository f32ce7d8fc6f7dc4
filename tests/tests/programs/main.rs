//! The real-program matrix: unmodified servers and clients, both ends
//! under the shim with a private daemon (`Matrix`), the bytes checked end
//! to end (checksums), every end seen on a shared-memory ring in
//! `ringsock-ctl status` while the connections are open (the typed reader,
//! and the CLI's own `status --expect` over the samples), and nothing left
//! behind afterwards: no process, no descriptor or ring held by a server
//! once its clients are done, no report or ring with the daemon.
//!
//! One module per program (haproxy, MariaDB, ncat, nginx as a reverse
//! proxy, node, PostgreSQL, socat, sshd). redis, memcached, nginx,
//! python http.server and asyncio, curl, iperf3 and sockperf have test
//! files of their own that make the same checks. A test skips (SKIP
//! printed, passes) only when its program is not installed.
//!
//! Where a program still fails under the shim for a known reason outside
//! the tests, the part that fails is a test of its own marked `#[ignore]`
//! with that reason (`cargo test -- --ignored` runs it); the rest runs.

mod haproxy;
mod mariadb;
mod ncat;
mod nginx_proxy;
mod node;
mod postgres;
mod socat;
mod sshd;
mod support;
