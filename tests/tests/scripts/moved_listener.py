"""A listener a forked worker moves to another number, as php-fpm's
workers do: the master listens and forks; the worker dups the listener
onto a fixed number, closes the first number, accepts on the new one and
echoes 5 bytes reversed.

    moved_listener.py PORT
"""

import os
import socket
import sys

port = int(sys.argv[1])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen(8)
MOVED = 40
pid = os.fork()
if pid == 0:
    os.dup2(s.fileno(), MOVED)
    s.close()
    ls = socket.socket(fileno=MOVED)
    c, _ = ls.accept()
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
_, status = os.waitpid(pid, 0)
print("master done", status, flush=True)
