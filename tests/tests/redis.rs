//! redis-server under the shim, driven by redis-benchmark and redis-cli
//! (also under the shim), with a daemon (a program-matrix run): replies
//! are right, the connections (the benchmark's 20 clients, a long
//! redis-cli session) are on shared-memory rings at both ends while they
//! run, the server lets go of them, and nothing is left behind.

use std::time::Duration;

use ringsock_integration::matrix::Matrix;
use ringsock_integration::{
    assert_all_shm, assert_shim_silent, free_port, require, wait_port, TempDir,
};

#[test]
fn redis_benchmark_and_cli_readback() {
    require!("redis-server", "redis-benchmark", "redis-cli");
    let mut m = Matrix::new();
    let dir = TempDir::new("redis");
    let port = free_port().to_string();
    let mut server = m.serve(
        m.ctl
            .shimmed("redis-server")
            .args([
                "--port",
                &port,
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(dir.path()),
    );
    wait_port(&mut server, port.parse().unwrap(), Duration::from_secs(10));
    let idle = m.baseline();

    let port_n: u16 = port.parse().unwrap();
    let w = m.run(
        m.ctl.shimmed("redis-benchmark").args([
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-t",
            "set,get",
            "-n",
            "20000",
            "-c",
            "20",
        ]),
        Duration::from_secs(60),
    );
    w.assert_ok("redis-benchmark");
    let (out, err) = (&w.stdout, &w.stderr);
    assert_shim_silent("redis-benchmark", err);
    let links = assert_all_shm("redis-benchmark", &w.conns, port_n, 1);
    println!(
        "redis-benchmark: {} connection(s) seen over shm in {} samples, e.g. {}",
        links.len(),
        w.samples,
        links[0]
    );
    for test in ["SET", "GET"] {
        let section = out
            .split(&format!("====== {test} ======"))
            .nth(1)
            .unwrap_or_else(|| panic!("no {test} section in:\n{out}"));
        let done = section
            .lines()
            .find(|l| l.contains("requests completed in"))
            .unwrap_or_else(|| panic!("no completion line for {test}:\n{section}"));
        let n: u64 = done.split_whitespace().next().unwrap().parse().unwrap();
        assert_eq!(n, 20000, "{test}: {done}");
    }
    assert!(!out.to_lowercase().contains("error"), "{out}");
    println!("{}", w.expect(port_n, "transport=shm,ends>=2"));

    // One connection, kept for a second: -r 20 -i 0.05 repeats INCR on it.
    m.settle(port_n);
    let w = m.run(
        m.ctl
            .shimmed("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port])
            .args(["-r", "20", "-i", "0.05", "INCR", "ringsock:counter"]),
        Duration::from_secs(20),
    );
    w.assert_ok("redis-cli -r 20");
    assert_shim_silent("redis-cli", &w.stderr);
    let counts: Vec<&str> = w.stdout.lines().collect();
    let want: Vec<String> = (1..=20).map(|i| i.to_string()).collect();
    assert_eq!(counts, want, "INCR replies");
    let links = assert_all_shm("redis-cli -r 20", &w.conns, port_n, 1);
    assert_eq!(links.len(), 1, "one connection expected");
    // Named as ps names it, whatever the executable behind the name (on
    // Debian redis-server is a symlink to redis-check-rdb).
    assert_eq!(
        (links[0].server.name.as_str(), links[0].client.name.as_str()),
        ("redis-server", "redis-cli"),
        "{}",
        links[0]
    );
    assert!(
        links[0].client.stat("c2s_bytes") > 0 && links[0].client.stat("s2c_bytes") > 0,
        "ring counters: {:?}",
        links[0].client.stats
    );

    println!("{}", w.expect(port_n, "transport=shm,ends=2"));

    let cli = |args: &[&str]| {
        let (o, e) = m
            .ctl
            .shimmed("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port])
            .args(args)
            .run_ok(Duration::from_secs(10));
        assert_shim_silent("redis-cli", &e);
        o.trim_end().to_string()
    };
    let big = "v".repeat(100_000);
    assert_eq!(cli(&["SET", "ringsock:key", "hello world"]), "OK");
    assert_eq!(cli(&["GET", "ringsock:key"]), "hello world");
    assert_eq!(cli(&["SET", "ringsock:big", &big]), "OK");
    assert_eq!(cli(&["GET", "ringsock:big"]), big);
    // BGSAVE forks a child that inherits every connection and closes what
    // it does not need: the parent's connections must be unaffected.
    assert!(cli(&["BGSAVE"]).contains("Background saving started"));
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while cli(&["INFO", "persistence"]).contains("rdb_bgsave_in_progress:1") {
        assert!(std::time::Instant::now() < end, "BGSAVE did not finish");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(cli(&["INFO", "persistence"]).contains("rdb_last_bgsave_status:ok"));
    assert_eq!(cli(&["GET", "ringsock:key"]), "hello world");
    assert_eq!(cli(&["DBSIZE"]).parse::<u64>().map(|n| n >= 2), Ok(true));

    // Every client is gone: so are the server's ends, rings and sockets.
    println!(
        "{}",
        m.ctl.expect(port_n, "ends=0", Duration::from_secs(10))
    );
    idle.assert_settled("redis-server", Duration::from_secs(10));
    let errs = m.finish("redis", vec![server]);
    assert_shim_silent("redis-server", &errs[0]);
}
