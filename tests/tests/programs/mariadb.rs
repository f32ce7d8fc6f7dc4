//! MariaDB: a private server (mariadb-install-db into a temp dir, mariadbd
//! in the foreground on a free port), mysqlslap (4 clients, mixed
//! auto-generated load), and the mariadb client moving 8 MiB in (INSERTs)
//! and 200,000 rows out, both checksummed. Every connection on a ring at
//! both ends; once the clients are gone the server holds what it held
//! before them.

use std::time::Duration;

use ringsock_integration::matrix::Matrix;
use ringsock_integration::{
    assert_shim_silent, free_port, require, sha256, wait_port, Cmd, TempDir,
};

use crate::support::{daemon_bin, is_root};

/// The rows the SELECT below prints: "i<TAB>i*7919 mod 1000003".
fn rows(n: u64) -> String {
    (1..=n)
        .map(|i| format!("{i}\t{}\n", i * 7919 % 1_000_003))
        .collect()
}

#[test]
fn mariadb_mysqlslap_and_client_over_rings() {
    require!("mariadb-install-db", "mysqlslap", "mariadb");
    let Some(mariadbd) = daemon_bin("mariadbd") else {
        println!("SKIP: `mariadbd` is not installed; install mariadb-server to run this test");
        return;
    };
    let mut m = Matrix::new();
    let dir = TempDir::new("mariadb");
    let data = dir.path().join("data");
    // mariadbd refuses root unless told to run as it.
    let user: &[&str] = if is_root() { &["--user=root"] } else { &[] };
    Cmd::plain("mariadb-install-db")
        .args(["--no-defaults", "--auth-root-authentication-method=normal"])
        .args(["--skip-test-db"])
        .arg(format!("--datadir={}", data.display()))
        .args(user)
        .run_ok(Duration::from_secs(180));
    let port = free_port();
    let p = dir.path().display();
    let mut server = m.serve(
        m.ctl
            .shimmed(&mariadbd)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .args(user)
            .arg(format!("--port={port}"))
            .arg(format!("--socket={p}/mysqld.sock"))
            .arg(format!("--pid-file={p}/mysqld.pid"))
            .args([
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
                "--skip-log-bin",
            ])
            .args(["--innodb-buffer-pool-size=32M", "--max-allowed-packet=64M"]),
    );
    wait_port(&mut server, port, Duration::from_secs(60));
    let client = |m: &Matrix, program: &str| {
        m.ctl
            .shimmed(program)
            .args(["--host=127.0.0.1", &format!("--port={port}"), "--user=root"])
    };
    // A first query: the server's one-time descriptors (its daemon
    // session, the shim's thread) belong to its idle state.
    let w = m.run(
        client(&m, "mariadb").args(["-e", "SELECT 1"]),
        Duration::from_secs(30),
    );
    w.assert_ok("mariadb SELECT 1");
    let idle = m.baseline();

    let w = m.run(
        client(&m, "mysqlslap").args([
            "--concurrency=4",
            "--iterations=3",
            "--number-of-queries=4000",
            "--auto-generate-sql",
            "--auto-generate-sql-load-type=mixed",
        ]),
        Duration::from_secs(180),
    );
    w.assert_ok("mysqlslap");
    assert_shim_silent("mysqlslap", &w.stderr);
    assert!(
        w.stdout.contains("Number of clients running queries: 4"),
        "{}",
        w.stdout
    );
    w.assert_on_rings("mysqlslap", port, 4);

    // 8 MiB in, as INSERTs of about 1 MiB each, and the server's checksum.
    let lines: Vec<String> = (0..200_000u64)
        .map(|i| format!("{i:08} {}", "ringsock".repeat(4)))
        .collect();
    let mut sql = String::from(
        "CREATE DATABASE rs; USE rs; CREATE TABLE up (n INT PRIMARY KEY, line TEXT);\n",
    );
    for (k, chunk) in lines.chunks(25_000).enumerate() {
        let values: Vec<String> = chunk
            .iter()
            .enumerate()
            .map(|(i, l)| format!("({},'{l}')", k * 25_000 + i))
            .collect();
        sql.push_str(&format!("INSERT INTO up VALUES {};\n", values.join(",")));
    }
    let script = dir.write("up.sql", sql.as_bytes());
    let w = m.run(
        client(&m, "mariadb").stdin_from(&script),
        Duration::from_secs(120),
    );
    w.assert_ok("mariadb < up.sql");
    let w = m.run(
        client(&m, "mariadb").args([
            "-N",
            "-B",
            "-e",
            "SET SESSION group_concat_max_len = 67108864; \
             SELECT SHA2(GROUP_CONCAT(line ORDER BY n SEPARATOR ''), 256) FROM rs.up",
        ]),
        Duration::from_secs(60),
    );
    w.assert_ok("mariadb SHA2");
    assert_eq!(
        w.stdout.trim(),
        sha256::hex(lines.concat().as_bytes()),
        "inserted bytes"
    );

    // 200,000 rows out.
    let n = 200_000;
    let w = m.run(
        client(&m, "mariadb").args([
            "-N",
            "-B",
            "-e",
            &format!("SELECT seq, seq * 7919 % 1000003 FROM rs.seq_1_to_{n}"),
        ]),
        Duration::from_secs(60),
    );
    w.assert_ok("mariadb SELECT");
    assert_shim_silent("mariadb", &w.stderr);
    sha256::assert_same("rows", w.stdout.as_bytes(), rows(n).as_bytes());

    idle.assert_settled("mariadbd", Duration::from_secs(15));
    let errs = m.finish("mariadb", vec![server]);
    assert_shim_silent("mariadbd", &errs[0]);
}
