"""A ring connection across python's subprocess calls. subprocess runs
its child with vfork (sharing our memory), closes every number above 2
there (close_fds) and dup2s pipes onto 0-2, then execs. The connection's
number is closed (or CLOEXEC) in that child, so the exec'd image never
gets the socket and the connection must stay on its ring; one passed
with pass_fds, given as the child's stdin and stdout, or dup2'd there
by posix_spawn's file actions, or inherited by system()'s shell, does
reach the image and must leave the ring, exactly; one whose inherited
number a file action closes stays.

Prints, per step, the bytes the client's kernel socket received during
that step's 64 KiB echo (0 while on the ring) and whether the echo came
back intact.

    subprocess_rings.py
"""

import os
import socket
import struct
import subprocess

N = 64 << 10


def kernel_bytes(s):
    # tcpi_bytes_received, at byte 128 of struct tcp_info (Linux >= 4.1).
    info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return struct.unpack_from("Q", info, 128)[0]


def echo(s, tag):
    data = os.urandom(N)
    before = kernel_bytes(s)
    s.sendall(data)
    back = b""
    while len(back) < N:
        d = s.recv(N - len(back))
        if not d:
            break
        back += d
    print(tag, "kernel", kernel_bytes(s) - before, "intact", back == data, flush=True)


def handed(cmd, tag, **kw):
    """A fresh connection given to a child as its stdin and stdout: the
    child reads the echo of our line and writes its answer, whose echo we
    read once it exited."""
    c = socket.create_connection(ls.getsockname())
    echo(c, tag + "_before")
    c.sendall(b"hello\n")
    subprocess.run(cmd, stdin=c, stdout=c, timeout=10, check=True, **kw)
    back = b""
    while not back.endswith(b"\n"):
        d = c.recv(100)
        if not d:
            break
        back += d
    print(tag, back.decode().strip(), flush=True)
    c.close()


ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(8)
pid = os.fork()
if pid == 0:
    import ctypes
    import threading

    # Gone with the client, also when a failing run is killed.
    ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL

    def serve(c):
        while d := c.recv(65536):
            c.sendall(d)

    while True:
        c, _ = ls.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()
s = socket.create_connection(ls.getsockname())
echo(s, "first")
subprocess.run(["true"], check=True)
echo(s, "close_fds")
subprocess.run(["cat"], input=b"x", stdout=subprocess.PIPE, check=True)
echo(s, "pipes")
subprocess.run(["true"], close_fds=False, check=True)
echo(s, "cloexec")
subprocess.run(["true"], pass_fds=(s.fileno(),), check=True)
echo(s, "passed")
s.close()
# The connection reaches the image through numbers 0 and 1 only: the
# first number is closed in the child (close_fds) or CLOEXEC.
answer = ["sh", "-c", "read x; echo got:$x"]
handed(answer, "stdin_close_fds")
handed(answer, "stdin_keep_fds", close_fds=False)

# posix_spawn: what reaches the child is what its file actions leave.
c = socket.create_connection(ls.getsockname())
echo(c, "spawn_dup2_before")
c.sendall(b"hello\n")
fd = c.fileno()
dup2 = [(os.POSIX_SPAWN_DUP2, fd, 0), (os.POSIX_SPAWN_DUP2, fd, 1)]
child = os.posix_spawn("/bin/sh", answer, os.environ, file_actions=dup2)
os.waitpid(child, 0)
print("spawn_dup2", c.recv(100).decode().strip(), flush=True)
c.close()
c = socket.create_connection(ls.getsockname())
os.set_inheritable(c.fileno(), True)
r, w = os.pipe()
acts = [(os.POSIX_SPAWN_CLOSE, c.fileno()), (os.POSIX_SPAWN_DUP2, w, 1)]
child = os.posix_spawn("/bin/sh", ["sh", "-c", "echo out"], os.environ, file_actions=acts)
os.close(w)
os.waitpid(child, 0)
os.close(r)
echo(c, "spawn_closed")
c.close()

# system(3) spawns its shell inside glibc: an inheritable connection
# reaches it.
c = socket.create_connection(ls.getsockname())
echo(c, "system_before")
c.sendall(b"hello\n")
os.set_inheritable(c.fileno(), True)
fd = c.fileno()
os.system(f"read x <&{fd}; echo got:$x >&{fd}")
print("system", c.recv(100).decode().strip(), flush=True)
c.close()
# popen(3) likewise (through ctypes: python's os.popen is subprocess).
import ctypes

libc = ctypes.CDLL(None)
libc.popen.restype = ctypes.c_void_p
libc.pclose.argtypes = [ctypes.c_void_p]
c = socket.create_connection(ls.getsockname())
echo(c, "popen_before")
c.sendall(b"hello\n")
os.set_inheritable(c.fileno(), True)
fd = c.fileno()
f = libc.popen(f"read x <&{fd}; echo got:$x >&{fd}".encode(), b"r")
libc.pclose(f)
print("popen", c.recv(100).decode().strip(), flush=True)
c.close()
os.kill(pid, 9)
os.waitpid(pid, 0)
