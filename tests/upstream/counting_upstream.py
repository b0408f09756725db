#!/usr/bin/env python3
"""A counting upstream for the idemlog-proxy end-to-end tests (Python standard library only).

It stands in for "any HTTP service, in any language" behind the proxy and records what the proxy
made it do, so a test can prove the proxy's promises from the outside:

* every request (other than the control endpoints below) is one run of its effect; the runs are
  counted per ``Idempotency-Key`` header value (the key as the upstream received it);
* every request is recorded with the headers it arrived with (in order, names as sent), so a test
  can check the fencing token, ``X-Forwarded-*``/``Forwarded`` and that hop-by-hop headers were
  removed;
* every answer carries a value unique to this process (``run``) and to the request (``seq`` and
  ``nonce``), so a replay that is byte for byte the first answer cannot have come from a second
  run.

Behaviour is chosen per request with ``X-Test-Behaviour``, a comma-separated list of:

``ok``             201 with a JSON body (the default)
``status=<code>``  answer with that status instead
``slow=<ms>``      sleep that long before answering
``fail``           500 with a JSON body
``hang``           never answer (the thread sleeps; other requests are served meanwhile)
``close``          read the request, then close the connection without any answer
``big=<bytes>``    a ``text/plain`` body of exactly that many bytes (starting with run and seq)
``cookie``         add ``Set-Cookie: session=<unique>; Path=/``
``chunked``        send the body with ``Transfer-Encoding: chunked`` (100-byte chunks)
``gzip``           compress the body with gzip and say so in ``Content-Encoding``
``truncate``       announce the whole body's length, send half of it, close the connection
``stall``          announce the whole body's length, send half of it, then hang

A 204 or 304 answer has no body and no ``Content-Type``.

Control endpoints (not counted, not recorded):

``GET /_counts``   ``{"counts": {key: runs}, "total": runs of every request with a key or not}``
``GET /_requests`` ``[{"seq", "method", "path", "key", "headers": [[name, value]], "body_len",
                   "body_sha256", "peer"}]`` in arrival order

Start: ``counting_upstream.py [--port N]`` (default 0: any free port); it binds 127.0.0.1 and prints
``listening port=N`` on stdout once it accepts connections.
"""

import argparse
import gzip
import hashlib
import json
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RUN_ID = uuid.uuid4().hex
LOCK = threading.Lock()
COUNTS = {}
TOTAL = [0]
REQUESTS = []
SEQ = [0]

# A hung request sleeps at most this long, so a forgotten process still ends its threads.
HANG_SECONDS = 600


def parse_behaviour(value):
    """The behaviour header as a dict: {"slow": "200", "fail": None, ...}."""
    out = {}
    for part in (value or "").split(","):
        part = part.strip()
        if not part:
            continue
        name, _, arg = part.partition("=")
        out[name.strip().lower()] = arg.strip() if arg else None
    return out


class Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 with a Content-Length on every answer: the proxy's pooled keep-alive client reuses
    # connections.
    protocol_version = "HTTP/1.1"
    server_version = "counting-upstream/1"
    # "truncate" or "stall" for the request being answered (see the module docs).
    behaviour_cut = None

    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        sys.stderr.write("upstream: %s - %s\n" % (self.address_string(), format % args))

    def read_body(self):
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            body = bytearray()
            while True:
                line = self.rfile.readline()
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    # Trailers end with an empty line.
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(body)
                body += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def send(self, status, body, content_type="application/json", extra=(), chunked=False):
        if any(name == "Content-Encoding" for name, _ in extra):
            body = gzip.compress(body, mtime=0)
        self.send_response(status)
        if status in (204, 304):
            # No body, by definition (RFC 9110 sections 15.3.5 and 15.4.5).
            body = b""
        else:
            self.send_header("Content-Type", content_type)
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.send_header("Content-Length", str(len(body)))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        if self.command == "HEAD" or status in (204, 304):
            return
        cut = self.behaviour_cut
        if cut and not chunked:
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            if cut == "stall":
                time.sleep(HANG_SECONDS)
            self.close_connection = True
            return
        if chunked:
            for start in range(0, len(body), 100):
                piece = body[start : start + 100]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.wfile.write(body)

    def control(self):
        with LOCK:
            if self.path == "/_counts":
                payload = {"counts": dict(COUNTS), "total": TOTAL[0]}
            else:
                payload = list(REQUESTS)
        self.send(200, json.dumps(payload).encode())

    def handle_any(self):
        if self.command == "GET" and self.path in ("/_counts", "/_requests"):
            self.control()
            return
        body = self.read_body()
        key = self.headers.get("Idempotency-Key")
        with LOCK:
            SEQ[0] += 1
            seq = SEQ[0]
            TOTAL[0] += 1
            if key is not None:
                COUNTS[key] = COUNTS.get(key, 0) + 1
            count = COUNTS.get(key, 0) if key is not None else None
            REQUESTS.append(
                {
                    "seq": seq,
                    "method": self.command,
                    "path": self.path,
                    "key": key,
                    "headers": [[n, v] for n, v in self.headers.items()],
                    "body_len": len(body),
                    "body_sha256": hashlib.sha256(body).hexdigest(),
                    "peer": self.client_address[0],
                }
            )
        behaviour = parse_behaviour(self.headers.get("X-Test-Behaviour"))
        self.behaviour_cut = next((c for c in ("truncate", "stall") if c in behaviour), None)
        if "slow" in behaviour:
            time.sleep(int(behaviour["slow"] or 0) / 1000.0)
        if "hang" in behaviour:
            time.sleep(HANG_SECONDS)
            self.close_connection = True
            return
        if "close" in behaviour:
            self.close_connection = True
            return
        nonce = uuid.uuid4().hex
        extra = [
            ("Location", "/things/%d" % seq),
            ("ETag", '"%s-%d"' % (RUN_ID, seq)),
            # Not in the proxy's default allow-list: a replay must not carry it.
            ("X-Upstream-Seq", str(seq)),
        ]
        if "gzip" in behaviour:
            extra.append(("Content-Encoding", "gzip"))
        if "cookie" in behaviour:
            extra.append(("Set-Cookie", "session=%s; Path=/" % nonce))
        status = 500 if "fail" in behaviour else 201
        if behaviour.get("status"):
            status = int(behaviour["status"])
        if "big" in behaviour:
            size = int(behaviour["big"] or 0)
            head = ("%s:%d:" % (RUN_ID, seq)).encode()
            payload = (head + b"x" * max(0, size - len(head)))[:size]
            self.send(status, payload, "text/plain", extra, "chunked" in behaviour)
            return
        payload = {
            "run": RUN_ID,
            "seq": seq,
            "nonce": nonce,
            "method": self.command,
            "path": self.path,
            "key": key,
            "count": count,
            "body_sha256": hashlib.sha256(body).hexdigest(),
            "outcome": "failed" if status >= 500 else "done",
        }
        self.send(
            status, json.dumps(payload).encode(), "application/json", extra, "chunked" in behaviour
        )

    do_GET = handle_any
    do_POST = handle_any
    do_PUT = handle_any
    do_PATCH = handle_any
    do_DELETE = handle_any
    do_HEAD = handle_any
    do_OPTIONS = handle_any


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    server = Server(("127.0.0.1", args.port), Handler)
    print("listening port=%d" % server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
