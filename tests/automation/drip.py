"""A webhook receiver that answers one byte at a time (on 127.0.0.1, a free port): it reads the
request, then sends `answer` one byte every `every` seconds, so no single read of the sender's
ever waits long enough to time out. Records each connection: when it opened and closed (wall
clock), who closed it, the path and webhook-id, and how many bytes it had sent."""
import select
import socket
import threading
import time
from dataclasses import dataclass, field

#: A 200 whose status line alone takes len/every seconds to trickle in.
SLOW_OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Padding: " + b"." * 80 + b"\r\nContent-Length: 2\r\n\r\nok"
#: Headers at once, then a body read until the connection closes (no Content-Length), a byte at a time.
SLOW_BODY = b"." * 200
#: A TLS handshake record header announcing 16 KB, then its "body" a byte at a time.
SLOW_TLS = b"\x16\x03\x03\x40\x00" + b"\x02" * 200


@dataclass
class Connection:
    opened: float
    path: str = ""
    webhook_id: str = ""
    sent: int = 0
    closed: float | None = None
    closed_by_client: bool = False


@dataclass
class Drip:
    every: float
    answer: bytes = SLOW_OK
    prefix: bytes = b""          # sent at once, before the drip (a status line and headers)
    read_request: bool = True    # False for TLS: the client's hello is not HTTP
    connections: list[Connection] = field(default_factory=list)

    def __post_init__(self):
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/hooks"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopping.is_set():
            try:
                sock, _ = self.server.accept()
            except OSError:
                return
            conn = Connection(opened=time.time())
            with self.lock:
                self.connections.append(conn)
            threading.Thread(target=self._serve, args=(sock, conn), daemon=True).start()

    def _serve(self, sock: socket.socket, conn: Connection):
        try:
            if self.read_request:
                self._read_request(sock, conn)
            if self.prefix:
                sock.sendall(self.prefix)
            for i in range(len(self.answer)):
                readable, _, _ = select.select([sock], [], [], self.every)
                if readable and not sock.recv(65536):  # the sender closed or shut the connection
                    conn.closed_by_client = True
                    return
                if self.stopping.is_set():
                    return
                sock.sendall(self.answer[i:i + 1])
                conn.sent += 1
        except OSError:
            conn.closed_by_client = True
        finally:
            conn.closed = time.time()
            sock.close()

    @staticmethod
    def _read_request(sock: socket.socket, conn: Connection):
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                raise OSError("closed before the request")
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        conn.path = lines[0].split(" ")[1]
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        conn.webhook_id = headers.get("webhook-id", "")
        while len(body) < int(headers.get("content-length", 0)):
            chunk = sock.recv(65536)
            if not chunk:
                raise OSError("closed in the request body")
            body += chunk

    def snapshot(self) -> list[Connection]:
        with self.lock:
            return list(self.connections)

    def open_now(self) -> list[Connection]:
        return [c for c in self.snapshot() if c.closed is None]

    def close(self):
        self.stopping.set()
        self.server.close()


def max_overlap(connections: list[Connection], key=lambda c: None) -> int:
    """The most connections of one `key` (an account's path, a delivery) open at the same moment."""
    events = sorted([(c.opened, 1, key(c)) for c in connections] + [(c.closed, -1, key(c)) for c in connections],
                    key=lambda e: (e[0], e[1]))  # a close before an open at the same instant
    open_by_key: dict = {}
    most = 0
    for _, step, k in events:
        open_by_key[k] = open_by_key.get(k, 0) + step
        most = max(most, open_by_key[k])
    return most
