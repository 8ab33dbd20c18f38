"""A local webhook receiver on 127.0.0.1 (a free port): records every request and answers
with the statuses it is told (then 200), optionally slowly."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self, statuses=(), delay: float = 0):
        self.requests: list[dict] = []
        self.statuses, self.delay = list(statuses), delay
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.lock:
                    receiver.requests.append({"headers": {k.lower(): v for k, v in self.headers.items()},
                                              "body": body, "json": json.loads(body), "path": self.path})
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                if receiver.delay:
                    time.sleep(receiver.delay)
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hooks"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def events(self) -> list[tuple[str, str]]:
        with self.lock:
            return [(r["json"]["type"], r["json"]["term"]) for r in self.requests]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
