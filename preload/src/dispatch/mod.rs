//! What the hooks do for ring-attached fds: blocking recv/send semantics
//! (`io`), waiting (`wait`), and readiness across mixed sets (`poll`,
//! `epoll`). Nothing here runs for an fd that is not attached.

pub mod epoll;
mod few;
pub mod io;
pub mod poll;
pub mod wait;
