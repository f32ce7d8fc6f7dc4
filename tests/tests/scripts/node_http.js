// An HTTP server and client in node, for the shim's program matrix.
//
//   node node_http.js server PORT FILE
//     serves FILE's bytes for every request on 127.0.0.1:PORT (keep-alive);
//     prints "listening PORT".
//   node node_http.js client PORT N SHA256 HOLD_MS
//     N requests over a keep-alive agent of 4 sockets, each body's sha256
//     checked against SHA256; keeps the sockets open HOLD_MS more (for
//     `ringsock-ctl status`), then prints "ok N" and exits.
"use strict";
const http = require("http");
const crypto = require("crypto");
const fs = require("fs");

const [mode, port] = [process.argv[2], Number(process.argv[3])];

if (mode === "server") {
  const body = fs.readFileSync(process.argv[4]);
  const server = http.createServer((req, res) => {
    res.writeHead(200, { "content-length": body.length });
    res.end(body);
  });
  server.keepAliveTimeout = 60000;
  server.listen(port, "127.0.0.1", () => console.log("listening " + port));
} else if (mode === "client") {
  const n = Number(process.argv[4]);
  const want = process.argv[5];
  const hold = Number(process.argv[6]);
  const agent = new http.Agent({ keepAlive: true, maxSockets: 4 });
  let done = 0;
  let started = 0;
  const fail = (msg) => {
    console.error("FAIL " + msg);
    process.exit(1);
  };
  const one = () => {
    started++;
    http
      .get({ host: "127.0.0.1", port, path: "/", agent }, (res) => {
        const h = crypto.createHash("sha256");
        res.on("data", (d) => h.update(d));
        res.on("end", () => {
          const got = h.digest("hex");
          if (res.statusCode !== 200 || got !== want) fail(`status ${res.statusCode} sha ${got}`);
          done++;
          if (started < n) one();
          else if (done === n)
            setTimeout(() => {
              agent.destroy();
              console.log("ok " + done);
            }, hold);
        });
      })
      .on("error", (e) => fail(e.message));
  };
  for (let i = 0; i < 4 && i < n; i++) one();
} else {
  console.error("usage: node_http.js server PORT FILE | client PORT N SHA256 HOLD_MS");
  process.exit(64);
}
