"""A recording proxy for agent traffic: forwards every request to cachet
unchanged (streamed answers stream through) and appends each request to a JSON
Lines trace: when it was sent (seconds since the proxy started), by which
client and in which of its runs (the session), the path, and the body. Used by `scripts/agents-check.sh` with
AGENTS_RECORD=FILE to record what real agent clients send (system prompts,
tool lists, turn structure) for the benchmark's agent-trace workload.

    python scripts/record_proxy.py LISTEN_PORT UPSTREAM_BASE TRACE.jsonl CLIENT [SESSION]
"""
import http.client
import http.server
import json
import sys
import threading
import time
import urllib.parse

port, upstream, trace, client = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
session = sys.argv[5] if len(sys.argv) > 5 else client
target = urllib.parse.urlsplit(upstream)
started = time.monotonic()
lock = threading.Lock()
HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization", "host"}


class Proxy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def forward(self, method):
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        if method == "POST":
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = None
            with lock, open(trace, "a") as f:
                f.write(json.dumps({"t": round(time.monotonic() - started, 3), "client": client,
                                    "session": session, "path": self.path, "body": parsed}) + "\n")
        conn = http.client.HTTPConnection(target.hostname, target.port, timeout=3600)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        conn.request(method, self.path, body=body or None, headers=headers)
        answer = conn.getresponse()
        self.send_response(answer.status)
        for k, v in answer.getheaders():
            if k.lower() not in HOP and k.lower() != "content-length":
                self.send_header(k, v)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        while True:
            chunk = answer.read1(65536)
            if not chunk:
                break
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        conn.close()

    def do_GET(self):
        self.forward("GET")

    def do_POST(self):
        self.forward("POST")


http.server.ThreadingHTTPServer(("127.0.0.1", port), Proxy).serve_forever()
