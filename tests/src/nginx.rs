//! nginx as the tests run it: everything in a prefix directory of the
//! test's own (pid file, logs, temp paths), in the foreground with its
//! master process.

use std::path::{Path, PathBuf};

use crate::proc::Cmd;

/// Writes `<prefix>/nginx.conf` and returns its path: `main` directives
/// (worker_processes ...), the `events` block's body, and the `http`
/// block's body after the settings every test shares (no access log,
/// temp paths under the prefix).
pub fn conf(prefix: &Path, main: &str, events: &str, http: &str) -> PathBuf {
    let p = prefix.display();
    let text = format!(
        "{main}\n\
         pid {p}/nginx.pid;\n\
         error_log {p}/error.log warn;\n\
         events {{ {events} }}\n\
         http {{\n\
           access_log off;\n\
           client_body_temp_path {p}/body;\n\
           proxy_temp_path {p}/proxy;\n\
           fastcgi_temp_path {p}/fastcgi;\n\
           uwsgi_temp_path {p}/uwsgi;\n\
           scgi_temp_path {p}/scgi;\n\
           {http}\n\
         }}\n"
    );
    let path = prefix.join("nginx.conf");
    std::fs::write(&path, text).expect("writing nginx.conf");
    path
}

/// `base` (a shimmed or plain `nginx` command) told to run `conf` under
/// `prefix` in the foreground.
pub fn args(base: Cmd, prefix: &Path, conf: &Path) -> Cmd {
    base.arg("-p")
        .arg(prefix)
        .arg("-c")
        .arg(conf)
        .args(["-g", "daemon off; master_process on;"])
}

/// Panics with the error log if nginx logged an emergency, an alert or a
/// critical error.
pub fn assert_quiet_log(prefix: &Path) {
    let log = std::fs::read_to_string(prefix.join("error.log")).unwrap_or_default();
    assert!(
        !log.contains("[emerg]") && !log.contains("[alert]") && !log.contains("[crit]"),
        "nginx error.log:\n{log}"
    );
}
