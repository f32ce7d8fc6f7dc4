#!/usr/bin/env python3
"""Echo server and checking client for scripts/soak (run under the shim).

  echo.py server PORT_FILE          threaded echo on 127.0.0.1:0; writes its
                                    port to PORT_FILE once listening
  echo.py client PORT SEED CONNS MAX
                                    CONNS connections at once, each sends
                                    seeded random bytes (0..MAX B) in random
                                    chunks while a thread reads the echo,
                                    then shuts down its write side; compares
                                    sha256 of sent and received

The client prints `conn I BYTES ok` or `conn I MISMATCH ...` per connection
and `total BYTES`; exit 0 only if every connection matched, 1 on a mismatch,
2 on an error.
"""
import hashlib
import os
import random
import socket
import sys
import threading


def serve(port_file):
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", 0))
    l.listen(128)
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(l.getsockname()[1]))
    os.rename(tmp, port_file)

    def echo(c):
        try:
            while True:
                b = c.recv(262144)
                if not b:
                    break
                c.sendall(b)
            c.shutdown(socket.SHUT_WR)
        except OSError as e:
            print("echo error", e, file=sys.stderr, flush=True)
        finally:
            c.close()

    while True:
        c, _ = l.accept()
        threading.Thread(target=echo, args=(c,), daemon=True).start()


def one(port, rng, i, results):
    size = int(rng.random() ** 2 * results["max"])
    data = rng.randbytes(size)
    chunks = []
    pos = 0
    while pos < size:
        n = min(size - pos, rng.choice([1, 7, 100, 1500, 4096, 65536, 300000]))
        chunks.append((pos, n))
        pos += n
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    got = hashlib.sha256()
    count = [0]
    err = []

    def reader():
        try:
            while True:
                b = s.recv(262144)
                if not b:
                    break
                got.update(b)
                count[0] += len(b)
        except OSError as e:
            err.append(e)

    t = threading.Thread(target=reader)
    t.start()
    try:
        mv = memoryview(data)
        for p, n in chunks:
            s.sendall(mv[p : p + n])
        s.shutdown(socket.SHUT_WR)
    except OSError as e:
        err.append(e)
    t.join(90)
    s.close()
    if t.is_alive():
        results["lines"].append((i, f"conn {i} ERROR reader did not finish"))
        results["errors"] += 1
    elif err:
        results["lines"].append((i, f"conn {i} ERROR {err[0]!r}"))
        results["errors"] += 1
    elif count[0] != size or got.hexdigest() != hashlib.sha256(data).hexdigest():
        results["lines"].append(
            (i, f"conn {i} MISMATCH sent {size} recv {count[0]} {got.hexdigest()}")
        )
        results["mismatches"] += 1
    else:
        results["lines"].append((i, f"conn {i} {size} ok"))
        results["bytes"] += size


def client(port, seed, conns, maximum):
    results = {"lines": [], "errors": 0, "mismatches": 0, "bytes": 0, "max": maximum}
    threads = [
        threading.Thread(target=one, args=(port, random.Random(f"{seed}/{i}"), i, results))
        for i in range(conns)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for _, line in sorted(results["lines"]):
        print(line)
    print("total", results["bytes"], flush=True)
    if results["mismatches"]:
        sys.exit(1)
    if results["errors"]:
        sys.exit(2)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "server":
        serve(sys.argv[2])
    elif len(sys.argv) == 6 and sys.argv[1] == "client":
        client(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(64)
