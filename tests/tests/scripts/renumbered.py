"""A server that moves an accepted connection to another fd number (dup,
then close of the first) before it accepts the next one, which takes the
first number (tests/tests/status_renumbered.rs).

server PORT DIR: prints `moved N M PORT_A`, then, once DIR/go exists and
the second connection came, `both N2 PORT_B`; closes both once DIR/done
exists. client PORT DIR: the first connection at once, the second once
DIR/go exists; reads one byte from each and ends once DIR/done exists.
"""
import os
import socket
import sys
import time


def wait_file(path):
    end = time.time() + 30
    while not os.path.exists(path):
        if time.time() > end:
            sys.exit(f"{path} never came")
        time.sleep(0.02)


mode, port, where = sys.argv[1], int(sys.argv[2]), sys.argv[3]
go, done = os.path.join(where, "go"), os.path.join(where, "done")
if mode == "server":
    lst = socket.socket()
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lst.bind(("127.0.0.1", port))
    lst.listen(8)
    a, peer_a = lst.accept()
    n = a.fileno()
    m = os.dup(n)
    a.close()
    os.write(m, b"A")
    print("moved", n, m, peer_a[1], flush=True)
    b, peer_b = lst.accept()
    b.sendall(b"B")
    print("both", b.fileno(), peer_b[1], flush=True)
    wait_file(done)
    os.close(m)
    b.close()
else:
    c1 = socket.create_connection(("127.0.0.1", port))
    wait_file(go)
    c2 = socket.create_connection(("127.0.0.1", port))
    got = c1.recv(1) + c2.recv(1)
    wait_file(done)
    print("got", got.decode(), flush=True)
