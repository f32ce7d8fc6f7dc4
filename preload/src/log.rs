//! The shim's logger: the `log` crate's facade over a writer that formats
//! into a stack buffer and hands it to the kernel with a raw `write`
//! syscall. It never calls an interposed function (a log line from inside a
//! hook must not re-enter the hooks), never takes a lock and never
//! allocates, so it is usable from any hook, in a forked child and in a
//! signal-ish context.
//!
//! Lines look like `ringsock[1234]: warn: message`. They go to stderr unless
//! RINGSOCK_LOG_FILE names a file, which is opened O_APPEND|O_CLOEXEC and
//! moved to a high fd number, out of the way of programs that expect the
//! lowest free fd. If the program closes the log fd, or reuses its number, the
//! logger stops writing there (see `on_fd_closed`): a log line must never land
//! in somebody's socket.

use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use log::{Level, LevelFilter, Log, Metadata, Record};

use crate::{process, sys};

/// Where log lines go; -1 when nowhere.
static SINK: AtomicI32 = AtomicI32::new(libc::STDERR_FILENO);
/// True while the sink is the program's own stderr (fd 2).
static SINK_IS_STDERR: AtomicBool = AtomicBool::new(true);

/// Lowest fd number for a log file; keeps it above the small numbers that
/// programs and their children use by convention.
const LOG_FD_FLOOR: libc::c_long = 200;
/// A line longer than this is cut, with a marker.
const LINE_MAX: usize = 1024;

struct ShimLogger;

static LOGGER: ShimLogger = ShimLogger;

impl Log for ShimLogger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record<'_>) {
        if self.enabled(record.metadata()) {
            emit(Some(record.level()), *record.args());
        }
    }

    fn flush(&self) {}
}

/// Installs the logger at `level`, writing to `file` (None: stderr).
/// Returns a description of the problem if the file could not be opened; the
/// logger then stays on stderr.
pub fn install(level: LevelFilter, file: Option<&[u8]>) -> Result<(), String> {
    // set_logger fails only if called twice; the second call changes just
    // the level and sink, which is what a re-initialisation wants.
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(level);
    let Some(path) = file else {
        return Ok(());
    };
    let mut cpath = path.to_vec();
    cpath.push(0);
    let fd = sys::open(
        &cpath,
        libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_CLOEXEC,
        0o644,
    )
    .map_err(|e| format!("cannot open: {}", std::io::Error::from_raw_os_error(e)))?;
    let high = sys::fcntl(fd, libc::F_DUPFD_CLOEXEC, LOG_FD_FLOOR).unwrap_or(fd);
    if high != fd {
        sys::close(fd);
    }
    SINK_IS_STDERR.store(false, Ordering::Relaxed);
    SINK.store(high, Ordering::Relaxed);
    Ok(())
}

/// The program closed `fd`: if that was our sink, stop writing to it.
#[inline]
pub fn on_fd_closed(fd: libc::c_int) {
    if SINK.load(Ordering::Relaxed) == fd {
        SINK.store(-1, Ordering::Relaxed);
    }
}

/// The program closed every fd in `lo..=hi` (close_range, closefrom).
pub fn on_range_closed(lo: libc::c_uint, hi: libc::c_uint) {
    let fd = SINK.load(Ordering::Relaxed);
    if fd >= 0 && (lo..=hi).contains(&(fd as libc::c_uint)) {
        SINK.store(-1, Ordering::Relaxed);
    }
}

/// The program made `fd` refer to something new (dup2/dup3 target). For
/// stderr that is the program redirecting its own stderr, which our lines
/// follow; any other sink number now belongs to the program.
#[inline]
pub fn on_fd_replaced(fd: libc::c_int) {
    if fd == libc::STDERR_FILENO && SINK_IS_STDERR.load(Ordering::Relaxed) {
        SINK.store(fd, Ordering::Relaxed);
    } else {
        on_fd_closed(fd);
    }
}

/// Writes one line regardless of the level filter (configuration problems
/// must always be seen).
pub fn always(args: fmt::Arguments<'_>) {
    emit(None, args);
}

fn emit(level: Option<Level>, args: fmt::Arguments<'_>) {
    let fd = SINK.load(Ordering::Relaxed);
    // A sandboxed process gets no system call of ours.
    if fd < 0 || process::sandboxed() {
        return;
    }
    let mut line = StackLine::new();
    let _ = write!(line, "ringsock[{}]: ", process::pid());
    if let Some(level) = level {
        let _ = write!(line, "{}: ", level_name(level));
    }
    let _ = line.write_fmt(args);
    let bytes = line.finish();
    // A line that would pass the file size limit is dropped rather than
    // raise SIGXFSZ.
    if !sys::within_fsize_limit(fd, bytes.len()) {
        return;
    }
    sys::write_all(fd, bytes);
}

/// Lower-case level names, as RINGSOCK_LOG spells them.
fn level_name(level: Level) -> &'static str {
    match level {
        Level::Error => "error",
        Level::Warn => "warn",
        Level::Info => "info",
        Level::Debug => "debug",
        Level::Trace => "trace",
    }
}

/// A fixed-size line buffer; text beyond its capacity is dropped and the
/// line ends with "...".
pub struct StackLine {
    buf: [u8; LINE_MAX],
    len: usize,
    truncated: bool,
}

impl StackLine {
    pub fn new() -> Self {
        StackLine {
            buf: [0; LINE_MAX],
            len: 0,
            truncated: false,
        }
    }

    /// The finished line, newline-terminated.
    pub fn finish(&mut self) -> &[u8] {
        // Reserve room for "...\n" at the very end.
        let room = LINE_MAX - 4;
        if self.truncated || self.len > room {
            self.len = self.len.min(room);
            self.buf[self.len..self.len + 3].copy_from_slice(b"...");
            self.len += 3;
        }
        self.buf[self.len] = b'\n';
        &self.buf[..self.len + 1]
    }
}

impl Default for StackLine {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Write for StackLine {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // Keep one byte for the newline that `finish` appends.
        let room = LINE_MAX - 1 - self.len;
        let take = s.len().min(room);
        self.buf[self.len..self.len + take].copy_from_slice(&s.as_bytes()[..take]);
        self.len += take;
        if take < s.len() {
            self.truncated = true;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_line_is_newline_terminated() {
        let mut l = StackLine::new();
        write!(l, "ringsock[{}]: hi", 7).unwrap();
        assert_eq!(l.finish(), b"ringsock[7]: hi\n");
    }

    /// A line that would pass RLIMIT_FSIZE is dropped: the write would
    /// kill the process with SIGXFSZ. One that fits is written.
    #[test]
    fn a_line_past_the_file_size_limit_is_dropped() {
        let path = std::env::temp_dir().join(format!("ringsock-fsize-{}", std::process::id()));
        let cpath = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: fork; the child only makes raw system calls and formats
        // into a stack buffer (no allocation, no lock), then _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: plain system calls in the child, on its own copies.
            unsafe {
                let fd = libc::open(
                    cpath.as_ptr(),
                    libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
                    0o600,
                );
                let lim = libc::rlimit {
                    rlim_cur: 40,
                    rlim_max: libc::RLIM_INFINITY,
                };
                libc::setrlimit(libc::RLIMIT_FSIZE, &lim);
                SINK.store(fd, Ordering::Relaxed);
                always(format_args!("short"));
                always(format_args!("{}", "a line longer than what is left"));
                libc::_exit(0);
            }
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        let got = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child died (status {status:#x}, signal {})",
            libc::WTERMSIG(status)
        );
        assert!(
            got.ends_with("]: short\n") && got.lines().count() == 1,
            "{got:?}"
        );
    }

    #[test]
    fn long_line_is_cut_with_marker() {
        let mut l = StackLine::new();
        let long = "x".repeat(5000);
        l.write_str(&long).unwrap();
        let out = l.finish();
        assert_eq!(out.len(), LINE_MAX);
        assert!(out.ends_with(b"...\n"));
    }
}
