"""An HTTP/1.1 file server with keep-alive, for proxies to sit in front of.

    http_backend.py PORT DIR

Serves DIR on 127.0.0.1:PORT, one thread per connection, connections kept
open between requests (what haproxy's http-reuse and nginx's upstream
keepalive need), a listen backlog of 128 (http.server's 5 drops a burst of
connects into SYN retries), no access log.
"""

import functools
import http.server
import sys


class Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass


class Server(http.server.ThreadingHTTPServer):
    request_queue_size = 128


def main():
    port, root = int(sys.argv[1]), sys.argv[2]
    handler = functools.partial(Handler, directory=root)
    with Server(("127.0.0.1", port), handler) as s:
        print("listening", port, flush=True)
        s.serve_forever()


main()
