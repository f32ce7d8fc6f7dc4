"""Echo server for the ringsock pass-through tests.

Usage: echo_server.py THREADED_PORT ASYNCIO_PORT

THREADED_PORT serves one mode per connection, chosen by its first line:
  ECHO   echo every byte back (recv/sendall) until EOF, then print the
         sha256 of what was received;
  LINES  line protocol through socket.makefile: answer each line upper-cased
         until BYE.
ASYNCIO_PORT echoes with asyncio streams and prints the sha256 as well.
"""
import asyncio
import hashlib
import socket
import sys
import threading


def read_line(conn):
    line = b""
    while not line.endswith(b"\n"):
        b = conn.recv(1)
        if not b:
            break
        line += b
    return line


def handle(conn):
    with conn:
        mode = read_line(conn)
        if mode == b"ECHO\n":
            h = hashlib.sha256()
            while True:
                data = conn.recv(65536)
                if not data:
                    break
                h.update(data)
                conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)
            print("threaded-received", h.hexdigest(), flush=True)
        elif mode == b"LINES\n":
            f = conn.makefile("rwb")
            for line in f:
                if line == b"BYE\n":
                    f.write(b"BYE\n")
                    f.flush()
                    break
                f.write(line.upper())
                f.flush()
            f.close()


def threaded(port):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(16)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


async def echo(reader, writer):
    h = hashlib.sha256()
    while True:
        data = await reader.read(65536)
        if not data:
            break
        h.update(data)
        writer.write(data)
        await writer.drain()
    writer.write_eof()
    await writer.drain()
    writer.close()
    print("asyncio-received", h.hexdigest(), flush=True)


async def main(tport, aport):
    threading.Thread(target=threaded, args=(tport,), daemon=True).start()
    server = await asyncio.start_server(echo, "127.0.0.1", aport)
    print("READY", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
