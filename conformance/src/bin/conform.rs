//! conform: the differential conformance suite's command line.
//!
//! ```text
//! conform run [NAMES...] [--jobs N] [--logs]   plain vs shim, judged against known.rs
//!                                              (on two hosts, runner/hosts.rs: reported)
//! conform list [--markdown]                    the scenarios (docs/conformance.md)
//! conform role SIDE NAME --port P --log F --dir D   one role (the runner starts these)
//! conform helper KIND ARGS...                  a process a role execs (fd inheritance)
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ringsock_conformance::known::known;
use ringsock_conformance::role::{Role, Side};
use ringsock_conformance::runner::{default_bin, run, Mode, Place, Verdict};
use ringsock_conformance::{addr, obs::Log, scenario, scenarios, suite, sync::Sync};

#[derive(Parser)]
#[command(about = "ringsock's differential conformance suite (the kernel is the oracle)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Runs scenarios plain and under the shim and compares (all by default).
    Run {
        names: Vec<String>,
        /// Scenarios run at a time.
        #[arg(long, default_value_t = 2)]
        jobs: usize,
        /// Print both runs' logs of each scenario.
        #[arg(long)]
        logs: bool,
    },
    /// Lists the scenarios.
    List {
        /// The docs/conformance.md table.
        #[arg(long)]
        markdown: bool,
    },
    /// Runs one role of one scenario (started by the runner).
    Role {
        side: String,
        name: String,
        #[arg(long)]
        port: u16,
        #[arg(long)]
        log: PathBuf,
        #[arg(long)]
        dir: PathBuf,
    },
    /// A process a role execs (started by a role).
    #[command(hide = true)]
    Helper {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() -> ExitCode {
    match Cli::parse().cmd {
        Cmd::Run { names, jobs, logs } => run_cmd(names, jobs, logs),
        Cmd::List { markdown } => {
            if markdown {
                print!("{}", ringsock_conformance::markdown::table());
            } else {
                for s in scenario::all() {
                    println!("{:40} {}", s.name, s.about);
                }
            }
            ExitCode::SUCCESS
        }
        Cmd::Role {
            side,
            name,
            port,
            log,
            dir,
        } => role(&side, &name, port, log, dir),
        Cmd::Helper { args } => scenarios::helper(&args),
    }
}

fn run_cmd(names: Vec<String>, jobs: usize, logs: bool) -> ExitCode {
    let all: Vec<String> = scenario::all().iter().map(|s| s.name.to_string()).collect();
    let names = if names.is_empty() { all.clone() } else { names };
    if let Some(bad) = names.iter().find(|n| !all.contains(n)) {
        eprintln!("no scenario `{bad}` (conform list)");
        return ExitCode::FAILURE;
    }
    let bin = default_bin();
    let place = Place::from_env();
    if logs {
        for n in &names {
            for mode in [Mode::Plain, Mode::Shim] {
                let r = run(&bin, n, mode, &place);
                println!("=== {n} {}", mode.as_str());
                for l in r.server.iter().chain(&r.client) {
                    println!("{l}");
                }
                for p in &r.problems {
                    println!("PROBLEM {p}");
                }
                print!("{}", r.stderr);
            }
        }
        return ExitCode::SUCCESS;
    }
    // known.rs describes shared-memory rings on one host; between two
    // hosts the differences are reported, and only a broken scenario (its
    // plain run failed) fails the command.
    let hosts = matches!(place, Place::Hosts(_));
    let judge = |o: &suite::Outcome| match (&o.verdict, hosts) {
        (Verdict::Broken(_), _) | (_, false) => o.judge(),
        (_, true) => Ok(()),
    };
    let outcomes = suite::run_all(&bin, &names, jobs, &place, |o| {
        let mark = if judge(o).is_ok() { "ok " } else { "BAD" };
        println!("{mark} {:8} {:5.1}s {}", o.word(), o.secs, o.name);
    });
    for o in &outcomes {
        let report = match &o.verdict {
            Verdict::Differs(r) | Verdict::Broken(r) => r,
            Verdict::Same => continue,
        };
        let tag = match (hosts, known(&o.name)) {
            (true, _) => "two hosts".to_string(),
            (false, Some(k)) => format!("known: {}", k.diff),
            (false, None) => "not in known.rs".to_string(),
        };
        println!("\n--- {} {} ({tag})\n{report}", o.name, o.word());
    }
    let failures: Vec<String> = outcomes
        .iter()
        .filter_map(|o| judge(o).err())
        .map(|e| e.lines().next().unwrap_or_default().to_string())
        .collect();
    println!(
        "\n{} scenarios: {} same, {} differ, {} broken; {} not as known.rs says",
        outcomes.len(),
        outcomes.iter().filter(|o| o.word() == "same").count(),
        outcomes.iter().filter(|o| o.word() == "differs").count(),
        outcomes.iter().filter(|o| o.word() == "broken").count(),
        failures.len()
    );
    for f in &failures {
        println!("  {f}");
    }
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn role(side: &str, name: &str, port: u16, log: PathBuf, dir: PathBuf) -> ExitCode {
    let side = Side::parse(side).expect("side is server or client");
    let sc = scenario::find(name).unwrap_or_else(|| panic!("no scenario `{name}`"));
    // A C program starts with SIGPIPE at its default; Rust ignores it.
    // SAFETY: setting a signal disposition before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    addr::set_server_port(port);
    let mut r = Role {
        log: Log::open(&log, "main"),
        sync: Sync::from_env(),
        side,
        scenario: name.to_string(),
        server_ip: ringsock_conformance::role::server_ip_from_env(),
        port,
        log_path: log,
        dir,
    };
    (sc.body)(&mut r);
    r.barrier("end");
    ExitCode::SUCCESS
}
