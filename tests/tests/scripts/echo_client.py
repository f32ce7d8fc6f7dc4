"""Echo client for the ringsock pass-through tests.

Usage: echo_client.py THREADED_PORT ASYNCIO_PORT SIZE

Sends SIZE pseudo-random bytes both ways through the threaded (sendall/recv)
and asyncio servers, and a few lines through makefile; prints the sha256 of
what was sent and of what came back.

With RS_HOLD_DIR set, each connection pauses once while it is open (halfway
through its data): the client prints `HOLD <name> <local port>` and waits
until the file RS_HOLD_DIR/<name> exists, so the test can look at the
connection (ringsock-ctl status) while it is alive.
"""
import asyncio
import hashlib
import os
import random
import socket
import sys
import threading
import time

HOLD_DIR = os.environ.get("RS_HOLD_DIR")
HOLD_TIMEOUT = 30


def hold(name, sock):
    if not HOLD_DIR:
        return
    print("HOLD", name, sock.getsockname()[1], flush=True)
    end = time.monotonic() + HOLD_TIMEOUT
    while not os.path.exists(os.path.join(HOLD_DIR, name)):
        if time.monotonic() > end:
            raise SystemExit("hold %s: never released" % name)
        time.sleep(0.005)


async def ahold(name, writer):
    if not HOLD_DIR:
        return
    print("HOLD", name, writer.get_extra_info("sockname")[1], flush=True)
    end = time.monotonic() + HOLD_TIMEOUT
    while not os.path.exists(os.path.join(HOLD_DIR, name)):
        if time.monotonic() > end:
            raise SystemExit("hold %s: never released" % name)
        await asyncio.sleep(0.005)


def payload(size):
    return random.Random(1234).randbytes(size)


def echo_threaded(port, data):
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    s.sendall(b"ECHO\n")

    def sender():
        view = memoryview(data)
        for i in range(0, len(view), 100_000):
            if i >= len(view) // 2 and i - 100_000 < len(view) // 2:
                hold("threaded", s)
            s.sendall(view[i:i + 100_000])
        s.shutdown(socket.SHUT_WR)

    t = threading.Thread(target=sender)
    t.start()
    h = hashlib.sha256()
    got = 0
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += len(chunk)
        h.update(chunk)
    t.join()
    s.close()
    return got, h.hexdigest()


def lines(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    s.sendall(b"LINES\n")
    f = s.makefile("rwb")
    answers = []
    for word in [b"alpha", b"beta", b"gamma" * 1000]:
        f.write(word + b"\n")
        f.flush()
        answers.append(f.readline().rstrip(b"\n"))
    hold("lines", s)
    f.write(b"BYE\n")
    f.flush()
    assert f.readline() == b"BYE\n"
    f.close()
    s.close()
    assert answers == [b"ALPHA", b"BETA", b"GAMMA" * 1000], answers


async def echo_asyncio(port, data):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def send():
        for i in range(0, len(data), 100_000):
            if i >= len(data) // 2 and i - 100_000 < len(data) // 2:
                await ahold("asyncio", writer)
            writer.write(data[i:i + 100_000])
            await writer.drain()
        writer.write_eof()

    task = asyncio.create_task(send())
    h = hashlib.sha256()
    got = 0
    while True:
        chunk = await reader.read(65536)
        if not chunk:
            break
        got += len(chunk)
        h.update(chunk)
    await task
    writer.close()
    return got, h.hexdigest()


def main():
    tport, aport, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    data = payload(size)
    print("sent", hashlib.sha256(data).hexdigest())
    got, digest = echo_threaded(tport, data)
    print("threaded-back", got, digest)
    lines(tport)
    print("lines ok")
    got, digest = asyncio.run(asyncio.wait_for(echo_asyncio(aport, data), 20))
    print("asyncio-back", got, digest)


if __name__ == "__main__":
    main()
