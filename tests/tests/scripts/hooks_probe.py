"""Exercises the interposed libc calls directly (ctypes) and through Python's
socket module on plain TCP sockets, printing one deterministic line per
check. The test runs it with and without the shim and expects identical
output."""
import ctypes
import ctypes.util
import errno
import os
import select
import socket
import struct
import threading
import time

libc = ctypes.CDLL(None, use_errno=True)
libc.fcntl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
libc.dup2.argtypes = [ctypes.c_int, ctypes.c_int]
libc.recv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.recv.restype = ctypes.c_ssize_t
libc.write.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
libc.write.restype = ctypes.c_ssize_t
libc.getsockopt.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]

F_GETFL, F_SETFL, F_GETFD, F_DUPFD_CLOEXEC = 3, 4, 1, 1030
FIONREAD, FIONBIO = 0x541B, 0x5421
O_NONBLOCK = os.O_NONBLOCK


def out(name, value):
    print(f"{name}={value}", flush=True)


def pair():
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    c = socket.create_connection(lst.getsockname())
    a, _ = lst.accept()
    lst.close()
    return c, a


def c_recv(fd, n, flags):
    buf = ctypes.create_string_buffer(n)
    r = libc.recv(fd, buf, n, flags)
    if r < 0:
        return f"err:{errno.errorcode[ctypes.get_errno()]}"
    return buf.raw[:r].decode()


c, a = pair()
fd = c.fileno()

# fcntl F_GETFL/F_SETFL O_NONBLOCK through the C entry points
fl = libc.fcntl(fd, F_GETFL, 0)
out("fcntl_initial_nonblock", bool(fl & O_NONBLOCK))
out("fcntl_setfl", libc.fcntl(fd, F_SETFL, fl | O_NONBLOCK))
out("fcntl_after_set_nonblock", bool(libc.fcntl(fd, F_GETFL, 0) & O_NONBLOCK))
out("recv_empty_nonblocking", c_recv(fd, 16, 0))

# ioctl FIONBIO clears it again
off = ctypes.c_int(0)
out("ioctl_fionbio", libc.ioctl(fd, FIONBIO, ctypes.byref(off)))
out("fcntl_after_fionbio_off", bool(libc.fcntl(fd, F_GETFL, 0) & O_NONBLOCK))
out("recv_dontwait", c_recv(fd, 16, socket.MSG_DONTWAIT))

# poll / select / FIONREAD / MSG_PEEK
a.sendall(b"abcdefghij")
p = select.poll()
p.register(fd, select.POLLIN | select.POLLOUT)
out("poll", sorted(ev for _, ev in p.poll(2000)))
r, w, x = select.select([fd], [fd], [fd], 2)
out("select", (len(r), len(w), len(x)))
n = ctypes.c_int(-1)
out("ioctl_fionread_rc", libc.ioctl(fd, FIONREAD, ctypes.byref(n)))
out("fionread", n.value)
out("peek", c_recv(fd, 4, socket.MSG_PEEK))
out("after_peek", c_recv(fd, 64, 0))


# MSG_WAITALL across three delayed chunks
def trickle():
    for part in (b"1234", b"5678", b"9abc"):
        time.sleep(0.05)
        a.sendall(part)


t = threading.Thread(target=trickle)
t.start()
out("waitall", c.recv(12, socket.MSG_WAITALL).decode())
t.join()

# epoll, level- and edge-triggered
ep = select.epoll()
ep.register(fd, select.EPOLLIN)
out("epoll_idle", ep.poll(0.05))
a.sendall(b"xy")
out("epoll_level_1", [(f == fd, e) for f, e in ep.poll(2)])
out("epoll_level_2", [(f == fd, e) for f, e in ep.poll(0.05)])
c.recv(2)
ep.modify(fd, select.EPOLLIN | select.EPOLLET)
a.sendall(b"z")
out("epoll_edge_1", [(f == fd, e) for f, e in ep.poll(2)])
out("epoll_edge_2", ep.poll(0.05))
c.recv(1)
ep.close()

# dup2 onto an fd that is open on something else, then write through it
spare = os.open("/dev/null", os.O_WRONLY)
out("dup2_same_number", libc.dup2(fd, spare) == spare)
msg = b"via-dup2"
out("write_via_dup", libc.write(spare, msg, len(msg)))
out("peer_got", a.recv(64).decode())
os.close(spare)
out("still_usable_after_closing_dup", c.send(b"ok"))
out("peer_got_2", a.recv(64).decode())

# F_DUPFD_CLOEXEC
d = libc.fcntl(fd, F_DUPFD_CLOEXEC, 100)
out("dupfd_at_least_100", d >= 100)
out("dupfd_cloexec", libc.fcntl(d, F_GETFD, 0) & 1)
os.close(d)

# getsockopt(SO_ERROR) after a refused non-blocking connect
probe = socket.socket()
probe.bind(("127.0.0.1", 0))
dead_port = probe.getsockname()[1]
probe.close()
s = socket.socket()
s.setblocking(False)
out("connect_ex", errno.errorcode.get(s.connect_ex(("127.0.0.1", dead_port)), "0"))
select.select([], [s], [], 2)
err = ctypes.c_int(-1)
ln = ctypes.c_uint32(4)
libc.getsockopt(s.fileno(), socket.SOL_SOCKET, socket.SO_ERROR, ctypes.byref(err), ctypes.byref(ln))
out("so_error", errno.errorcode.get(err.value, err.value))
out("so_error_cleared", s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
s.close()

# half-close and EOF
c.shutdown(socket.SHUT_WR)
out("peer_eof", a.recv(16))
a.sendall(b"late")
out("read_after_half_close", c.recv(16).decode())
a.close()
out("eof", c.recv(16))
c.close()

# non-TCP sockets are untouched
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind(("127.0.0.1", 0))
u.sendto(b"udp", u.getsockname())
out("udp", u.recvfrom(16)[0].decode())
u.close()
x, y = socket.socketpair()
x.sendall(b"unix")
out("unix", y.recv(16).decode())
out("done", True)
