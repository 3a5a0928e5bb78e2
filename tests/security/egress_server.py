"""A loopback HTTP server for the egress cases, run in a process of its own (so the guard's
descriptor and thread counts see none of it): `python egress_server.py LOG`. It prints its
port, then appends one JSON line per request to LOG (method, target, headers, body size) and
answers every method:

- `/v1/public/echo`: the request's headers, back in the body and in `X-Echo` (a server that
  echoes credentials);
- any path with `go=<url>` in its query: `302` (or `code=<n>`) to that URL;
- anything else: `{"method", "target", "authorized"}`, `authorized` being whether
  `Authorization` is `Bearer $EGRESS_TOKEN`.
"""

from __future__ import annotations

import http.server
import json
import os
import sys
import urllib.parse


class Handler(http.server.BaseHTTPRequestHandler):
    def _any(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = [[name, value] for name, value in self.headers.items()]
        with open(sys.argv[1], "a") as log:
            log.write(json.dumps({"method": self.command, "target": self.path, "headers": headers,
                                  "body": len(body)}) + "\n")  # fmt: skip
        parts = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(parts.query))
        if "go" in query:
            self.send_response(int(query.get("code", "302")))
            self.send_header("Location", query["go"])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if parts.path == "/v1/public/echo":
            reply = json.dumps(headers).encode()
            self.send_response(200)
            self.send_header("X-Echo", self.headers.get("Authorization", ""))
        else:
            expected = f"Bearer {os.environ['EGRESS_TOKEN']}"
            reply = json.dumps({"method": self.command, "target": self.path,
                                "authorized": self.headers.get("Authorization") == expected}).encode()  # fmt: skip
            self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(reply)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_TRACE = _any

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__":
    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()
