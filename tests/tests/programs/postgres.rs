//! PostgreSQL: a private cluster (initdb in a temp dir, the postmaster in
//! the foreground on a free port; as the `postgres` user when the tests run
//! as root), pgbench (-i, then 4 clients x 250 transactions), and psql
//! moving 8 MiB each way (COPY in, a query's rows out), checksummed. The
//! postmaster forks a backend for each connection, which carries on with
//! the ring the postmaster accepted.

use std::path::PathBuf;
use std::time::Duration;

use ringsock_integration::matrix::Matrix;
use ringsock_integration::{
    assert_shim_silent, free_port, require, sha256, wait_port, Cmd, Conn, Ctl, TempDir, Watched,
};

use crate::support::{chown_tree, is_root, user_ids};

const CLIENTS: usize = 4;
const TRANSACTIONS: usize = 250;

/// `program` of the newest PostgreSQL under /usr/lib/postgresql (Debian
/// keeps the server's binaries off PATH), else from PATH.
fn pg_bin(program: &str) -> Option<PathBuf> {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin").join(program))
        .filter(|p| p.exists())
        .collect();
    versions.sort();
    versions
        .pop()
        .or_else(|| ringsock_integration::which(program))
}

/// `program` started by `start`, as `user` (through setpriv) if given.
fn as_user(start: impl Fn(&str) -> Cmd, user: Option<&str>, program: &std::path::Path) -> Cmd {
    match user {
        Some(u) => start("setpriv")
            .args(["--reuid", u, "--regid", u, "--init-groups", "--"])
            .arg(program),
        None => start(program.to_str().expect("utf-8 path")),
    }
}

/// The rows `SELECT` below prints: "i,i*7919 mod 1000003", one a line.
fn rows(n: u64) -> String {
    (1..=n)
        .map(|i| format!("{i},{}\n", i * 7919 % 1_000_003))
        .collect()
}

fn cluster(strict: bool) {
    let (Some(initdb), Some(postgres), Some(pgbench), Some(psql)) = (
        pg_bin("initdb"),
        pg_bin("postgres"),
        pg_bin("pgbench"),
        pg_bin("psql"),
    ) else {
        println!("SKIP: PostgreSQL (initdb, postgres, pgbench, psql) is not installed");
        return;
    };
    require!("setpriv");
    let user = is_root().then_some("postgres");
    if let Some(u) = user {
        if user_ids(u).is_none() {
            println!("SKIP: running as root and there is no `{u}` user to run PostgreSQL as");
            return;
        }
    }
    let mut m = Matrix::new();
    let dir = TempDir::new("postgres");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    if let Some((uid, gid)) = user.and_then(user_ids) {
        chown_tree(&data, uid, gid);
    }
    as_user(Cmd::plain, user, &initdb)
        .arg("-D")
        .arg(&data)
        .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
        .run_ok(Duration::from_secs(120));
    let port = free_port();
    let mut server = m.serve(
        as_user(|p| m.ctl.shimmed(p), user, &postgres)
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-k", ""])
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"]),
    );
    wait_port(&mut server, port, Duration::from_secs(60));
    // Listening is not ready: the server refuses connections ("the
    // database system is starting up") until its start-up finished.
    let ready_by = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let ok = std::process::Command::new(&psql)
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres"])
            .args(["-X", "-q", "-d", "postgres", "-c", "select 1"])
            .env_remove("LD_PRELOAD")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            break;
        }
        server.assert_running();
        assert!(
            std::time::Instant::now() < ready_by,
            "postgres did not accept connections within 120 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let psql_cmd = |ctl: &Ctl| {
        ctl.shimmed(psql.to_str().unwrap())
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres"])
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", "postgres"])
    };
    let bench = |ctl: &Ctl| {
        ctl.shimmed(pgbench.to_str().unwrap()).args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "postgres",
        ])
    };
    let w = m.run(
        bench(&m.ctl).args(["-i", "-s", "1", "postgres"]),
        Duration::from_secs(120),
    );
    w.assert_ok("pgbench -i");
    let idle = m.baseline();

    let w = m.run(
        bench(&m.ctl).args([
            "-c",
            &CLIENTS.to_string(),
            "-j",
            "2",
            "-t",
            &TRANSACTIONS.to_string(),
            "postgres",
        ]),
        Duration::from_secs(180),
    );
    w.assert_ok("pgbench");
    assert_shim_silent("pgbench", &w.stderr);
    let want = format!(
        "number of transactions actually processed: {}/{}",
        CLIENTS * TRANSACTIONS,
        CLIENTS * TRANSACTIONS
    );
    assert!(w.stdout.contains(&want), "{}", w.stdout);
    assert!(
        w.stdout.contains("number of failed transactions: 0 "),
        "{}",
        w.stdout
    );
    on_rings("pgbench", &w, port, CLIENTS, strict);

    // 8 MiB in: COPY from psql's stdin, then the server's checksum of it.
    let upload: String = (0..200_000u64)
        .map(|i| format!("{i:08} {}\n", "ringsock".repeat(4)))
        .collect();
    let input = dir.write("up.txt", upload.as_bytes());
    let w = m.run(
        psql_cmd(&m.ctl)
            .stdin_from(&input)
            .args(["-c", "CREATE TABLE up (n serial PRIMARY KEY, line text)"])
            .args(["-c", "COPY up (line) FROM STDIN"]),
        Duration::from_secs(120),
    );
    w.assert_ok("psql COPY FROM STDIN");
    let w = m.run(
        psql_cmd(&m.ctl).args([
            "-At",
            "-c",
            "SELECT encode(sha256(convert_to(string_agg(line || E'\\n', '' ORDER BY n), 'UTF8')), 'hex') FROM up",
        ]),
        Duration::from_secs(60),
    );
    w.assert_ok("psql sha256");
    assert_eq!(
        w.stdout.trim(),
        sha256::hex(upload.as_bytes()),
        "COPY'd bytes"
    );
    // About 2.6 MiB of rows out (csv-like, as psql -At prints them).
    let n = 200_000;
    let w = m.run(
        psql_cmd(&m.ctl).args([
            "-At",
            "-F",
            ",",
            "-c",
            &format!("SELECT i, i * 7919 % 1000003 FROM generate_series(1, {n}) i ORDER BY i"),
        ]),
        Duration::from_secs(60),
    );
    w.assert_ok("psql SELECT");
    assert_shim_silent("psql", &w.stderr);
    sha256::assert_same("rows", w.stdout.as_bytes(), rows(n).as_bytes());
    on_rings("psql", &w, port, 1, strict);

    idle.assert_settled("postgres", Duration::from_secs(15));
    let errs = m.finish("postgres", vec![server]);
    assert_shim_silent("postgres", &errs[0]);
}

/// The clients' ends to `port` were on rings (a client end is on shm only
/// once the server took the ring); with `strict`, both ends of `min`
/// connections, as status showed them.
fn on_rings(what: &str, w: &Watched, port: u16, min: usize, strict: bool) {
    let clients: Vec<&Conn> = w.conns.iter().filter(|c| c.peer.port() == port).collect();
    assert!(
        clients.len() >= min && clients.iter().all(|c| c.is_shm()),
        "{what}: client ends (want {min}, all shm):\n{}",
        ringsock_integration::show(&w.conns)
    );
    println!(
        "{what}: {} client end(s), all shm, e.g. {}",
        clients.len(),
        clients[0]
    );
    if strict {
        w.assert_on_rings(what, port, min);
    } else {
        println!("{}", w.expect(port, "transport=shm"));
    }
}

#[test]
fn postgres_pgbench_and_psql_over_rings() {
    cluster(false);
}

/// The forked backend uses the ring the postmaster accepted; the
/// postmaster closes its copy before its own report goes out, so the
/// backend reports the connection it took over, and status shows it.
#[test]
fn postgres_backends_show_in_status() {
    cluster(true);
}
