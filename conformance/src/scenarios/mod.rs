//! The scenarios, by theme. Each module's `list()` names its scenarios;
//! `helper` runs the processes that roles exec (a descriptor inherited
//! across exec, a receiver of SCM_RIGHTS).

pub mod basics;
pub mod calls;
pub mod death;
pub mod epoll;
pub mod fds;
pub mod oob;
pub mod options;
pub mod python;
pub mod readiness;
pub mod share;
pub mod spawn;

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::obs::Log;
use crate::role::{Role, Side};
use crate::sync::Sync;

impl Role {
    /// Replaces this process with `conform helper KIND ...`: the same
    /// role, its lines tagged `tag`, with `extra` arguments. Descriptors
    /// without close-on-exec (the side channel, the scenario's sockets)
    /// stay open across the exec.
    pub fn exec_helper(&self, kind: &str, tag: &str, extra: &[String]) -> ! {
        let err = std::process::Command::new(self.exe())
            .arg("helper")
            .arg(kind)
            .arg(self.side.as_str())
            .arg(&self.scenario)
            .arg(self.port.to_string())
            .arg(&self.log_path)
            .arg(&self.dir)
            .arg(tag)
            .args(extra)
            .exec();
        self.note(format!("exec failed: {err}"));
        std::process::exit(2);
    }
}

/// `conform helper KIND SIDE SCENARIO PORT LOG DIR TAG [EXTRA...]`.
pub fn helper(args: &[String]) -> ExitCode {
    let [kind, side, scenario, port, log, dir, tag, extra @ ..] = args else {
        eprintln!("conform helper: missing arguments: {args:?}");
        return ExitCode::FAILURE;
    };
    let port: u16 = port.parse().expect("port");
    crate::addr::set_server_port(port);
    let log_path = PathBuf::from(log);
    let mut r = Role {
        log: Log::open(&log_path, tag),
        sync: Sync::from_env(),
        side: Side::parse(side).expect("side"),
        scenario: scenario.clone(),
        server_ip: crate::role::server_ip_from_env(),
        port,
        log_path,
        dir: PathBuf::from(dir),
    };
    let code = match kind.as_str() {
        "share" => share::helper(&mut r, extra),
        other => {
            r.note(format!("no helper `{other}`"));
            2
        }
    };
    ExitCode::from(code)
}

/// The descriptor argument `--fd N` style helpers take, as a number.
pub fn fd_arg(extra: &[String], i: usize) -> i32 {
    extra
        .get(i)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("helper argument {i} is not a descriptor: {extra:?}"))
}
