//! libc's definitions of the interposed functions, for the shim's own use
//! (and the ring layer's): calling `libc::connect` from inside the library
//! would land in our own hook. Each is the `next` function the `hooks!`
//! macro generated, with the raw-syscall fallback.

pub use crate::hooks::epoll::{
    epoll_create1::next as epoll_create1, epoll_ctl::next as epoll_ctl,
    epoll_pwait::next as epoll_pwait, epoll_wait::next as epoll_wait,
};
pub use crate::hooks::fd::{
    close::next as close, dup::next as dup, fcntl::next as fcntl, ioctl::next as ioctl,
};
pub use crate::hooks::io::{
    read::next as read, readv::next as readv, recv::next as recv, recvmsg::next as recvmsg,
    send::next as send, sendmsg::next as sendmsg, write::next as write, writev::next as writev,
};
pub use crate::hooks::poll::{poll::next as poll, ppoll::next as ppoll};
pub use crate::hooks::socket::{
    accept4::next as accept4, bind::next as bind, connect::next as connect,
    getpeername::next as getpeername, getsockname::next as getsockname,
    getsockopt::next as getsockopt, listen::next as listen, setsockopt::next as setsockopt,
    shutdown::next as shutdown, socket::next as socket,
};
