//! Descriptors a spawned child gets whatever their FD_CLOEXEC: the sources
//! of `posix_spawn_file_actions_adddup2` entries (a dup2 in the child
//! clears the flag on the copy). They are noted per file-actions object,
//! for ring connections only, until the object is destroyed or set up
//! again, so that `posix_spawn` can leave their rings first.

use libc::c_int;

use crate::fdtable;
use crate::plock::PLock;

/// (file-actions object's address, dup2 source) pairs.
static DUP2: PLock<Vec<(usize, c_int)>> = PLock::new(Vec::new(), Vec::new);
/// At most this many pairs are kept: a program that never destroys its
/// file-actions objects loses the oldest notes, not memory.
const MAX_NOTES: usize = 256;

/// `posix_spawn_file_actions_adddup2(actions, fd, _)` succeeded.
pub fn note_dup2(actions: usize, fd: c_int) {
    if fdtable::attached(fd).is_none() {
        return;
    }
    let mut notes = DUP2.lock();
    if notes.len() >= MAX_NOTES {
        notes.remove(0);
    }
    notes.push((actions, fd));
}

/// The file-actions object at `actions` is destroyed or set up anew.
pub fn forget(actions: usize) {
    DUP2.lock().retain(|&(a, _)| a != actions);
}

/// The ring descriptors `actions` dup's into a child.
pub fn dup2_sources(actions: usize) -> Vec<c_int> {
    DUP2.lock()
        .iter()
        .filter(|&&(a, _)| a == actions)
        .map(|&(_, fd)| fd)
        .collect()
}
