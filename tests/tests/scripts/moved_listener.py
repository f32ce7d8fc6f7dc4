"""A listener a forked worker moves to another number, as php-fpm's
workers do (strace of php-fpm8.2): the master opens other files, then
listens and forks; the worker dup()s the listener to the next free
number, closes the master's other files and the first number, and
accepts on the copy. The accepted socket takes a lower free number, so
the first number stays closed when the worker's daemon session opens
(inside that accept) and registers the listeners it inherited. The
worker echoes 5 bytes reversed.

    moved_listener.py PORT
"""

import os
import socket
import sys

port = int(sys.argv[1])
# The master's other files (php-fpm's event pipe, log): numbers below
# the listener's that the worker closes.
others = os.pipe()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen(8)
first = s.fileno()
assert first > max(others), (first, others)
pid = os.fork()
if pid == 0:
    moved = os.dup(first)
    for fd in others:
        os.close(fd)
    s.close()
    ls = socket.socket(fileno=moved)
    c, _ = ls.accept()
    # The pattern holds only while the first number stays closed.
    assert c.fileno() < first, (c.fileno(), first)
    try:
        os.fstat(first)
        sys.exit(f"fd {first} was reused")
    except OSError:
        pass
    data = b""
    while len(data) < 5:
        d = c.recv(5 - len(data))
        if not d:
            break
        data += d
    c.sendall(data[::-1])
    while c.recv(100):
        pass
    print("worker done", data.decode(), flush=True)
    os._exit(0)
for fd in others:
    os.close(fd)
_, status = os.waitpid(pid, 0)
print("master done", status, flush=True)
