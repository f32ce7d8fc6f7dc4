"""A listener with TCP_DEFER_ACCEPT (apache's default on Linux, nginx's
`listen ... deferred`) and a client of it; what the option reads back and
how long the client's first request/response takes.

    defer_accept.py server PORT    accepts one connection, echoes 5 bytes
    defer_accept.py client PORT HOLD_FILE
                                   one request/response, then holds the
                                   connection until HOLD_FILE exists
"""

import os
import socket
import sys
import time

TCP_DEFER_ACCEPT = getattr(socket, "TCP_DEFER_ACCEPT", 9)


def opt(s):
    return s.getsockopt(socket.IPPROTO_TCP, TCP_DEFER_ACCEPT)


def server(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Before listen, as nginx sets it, and after, as apache does.
    s.setsockopt(socket.IPPROTO_TCP, TCP_DEFER_ACCEPT, 5)
    print("before-listen", opt(s), flush=True)
    s.bind(("127.0.0.1", port))
    s.listen(8)
    print("listening", opt(s), flush=True)
    s.setsockopt(socket.IPPROTO_TCP, TCP_DEFER_ACCEPT, 30)
    print("after-listen", opt(s), "short", s.getsockopt(socket.IPPROTO_TCP, TCP_DEFER_ACCEPT, 2).hex(), flush=True)
    try:
        s.setsockopt(socket.IPPROTO_TCP, TCP_DEFER_ACCEPT, b"\x01\x00")
        print("two-byte-value ok", flush=True)
    except OSError as e:
        print("two-byte-value", e.errno, flush=True)
    c, _ = s.accept()
    print("accepted", opt(c), "listener", opt(s), flush=True)
    data = b""
    while len(data) < 5:
        d = c.recv(5 - len(data))
        if not d:
            break
        data += d
    c.sendall(data[::-1])
    while c.recv(100):
        pass
    print("done", data.decode(), flush=True)


def client(port, hold):
    t = time.monotonic()
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(b"hello")
    back = b""
    while len(back) < 5:
        d = c.recv(5 - len(back))
        if not d:
            break
        back += d
    ms = (time.monotonic() - t) * 1000
    print("reply", back.decode(), "ms", int(ms), "local", c.getsockname()[1], flush=True)
    end = time.monotonic() + 30
    while not os.path.exists(hold) and time.monotonic() < end:
        time.sleep(0.01)
    c.close()


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(int(sys.argv[2]))
    else:
        client(int(sys.argv[2]), sys.argv[3])
