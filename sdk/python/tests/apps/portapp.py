"""A small web app for the gateway tests, run inside a sandbox (standard library only):
JSON echo of each request, a server-sent event stream, an echoing POST, and a WebSocket
echo. Every request's path goes to /tmp/requests.log, so a test can tell what reached it."""

import base64
import hashlib
import json
import struct
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG = "/tmp/requests.log"
GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _log(self):
        with open(LOG, "a") as f:
            f.write(self.path + "\n")

    def do_GET(self):
        self._log()
        if self.headers.get("Upgrade", "").lower() == "websocket":
            return self._websocket()
        if self.path.startswith("/events"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            for i in range(3):
                self.wfile.write(f"data: tick {i}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.4)
            self.close_connection = True
            return
        body = json.dumps({"path": self.path, "headers": dict(self.headers)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self._log()
        data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _websocket(self):
        key = self.headers["Sec-WebSocket-Key"]
        accept = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        r, w = self.rfile, self.wfile
        while True:
            head = r.read(2)
            if len(head) < 2:
                return
            op, n = head[0] & 15, head[1] & 127
            if n == 126:
                n = struct.unpack("!H", r.read(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", r.read(8))[0]
            mask = r.read(4) if head[1] & 128 else b""
            data = r.read(n)
            if mask:
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
            if op == 8:
                w.write(b"\x88\x00")
                w.flush()
                self.close_connection = True
                return
            if op in (1, 2):
                size = bytes([len(data)]) if len(data) < 126 else b"\x7e" + struct.pack("!H", len(data))
                w.write(bytes([0x80 | op]) + size + data)
                w.flush()


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
