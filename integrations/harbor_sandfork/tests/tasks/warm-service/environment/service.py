"""A lookup service with a slow start: its table (1,000 keys, each value a chain of
3,000 SHA-256 rounds) is computed in memory before it answers."""

import hashlib
import http.server
import urllib.parse


def value(key: int) -> str:
    digest = str(key).encode()
    for _ in range(3000):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()


TABLE = {str(k): value(k) for k in range(1000)}


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        url = urllib.parse.urlparse(self.path)
        if url.path == "/health":
            body = b"ok"
        elif url.path == "/lookup":
            key = urllib.parse.parse_qs(url.query).get("key", [""])[0]
            if key not in TABLE:
                self.send_error(404)
                return
            body = TABLE[key].encode()
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", 8000), Handler).serve_forever()
