"""A minimal HTTP/1.1 keep-alive client for the fleet benchmark's load generator.

The generator shares this machine's two cores with the server it measures, so what it spends
is taken from the server: aiohttp spent ~0.6 ms of CPU per request, about as much as the
storefront's own steady report. This client does only what the generator needs: a pool of
keep-alive connections, one request in flight on each, the request written as prepared bytes,
the answer's status, headers and body read back (Content-Length or chunked). Like wrk, it is a
measuring tool, not a general client: no redirects, proxies, TLS or cookies.
"""
import asyncio


class HttpError(Exception):
    """A connection closed, refused or timed out: the request's answer is unknown."""


def request_bytes(method: str, path: str, headers: dict, body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _parse(buffer: bytearray) -> tuple[int, dict, bytes, int] | None:
    """(status, headers, body, bytes used) of the first whole answer, or None; header names
    lower-case."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    status_line, *lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")
    status = int(status_line.split(" ", 2)[1])
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    start = end + 4
    if "content-length" in headers:
        used = start + int(headers["content-length"])
        return (status, headers, bytes(buffer[start:used]), used) if len(buffer) >= used else None
    if headers.get("transfer-encoding", "").lower() != "chunked":
        return status, headers, b"", start            # 204, 304: no body
    body, at = bytearray(), start
    while True:
        line_end = buffer.find(b"\r\n", at)
        if line_end < 0:
            return None
        size = int(bytes(buffer[at:line_end]).split(b";")[0], 16)
        if size == 0:
            used = line_end + 4                    # the last chunk, no trailers
            return (status, headers, bytes(body), used) if len(buffer) >= used else None
        if len(buffer) < line_end + 2 + size + 2:
            return None
        body += buffer[line_end + 2:line_end + 2 + size]
        at = line_end + 2 + size + 2


class _Connection(asyncio.Protocol):
    def __init__(self):
        self.transport, self.buffer, self.waiter, self.closed = None, bytearray(), None, False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.waiter is None or self.waiter.done():
            return
        parsed = _parse(self.buffer)
        if parsed is not None:
            status, headers, body, used = parsed
            del self.buffer[:used]
            self.closed = self.closed or headers.get("connection", "").lower() == "close"
            self.waiter.set_result((status, headers, body))

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(HttpError("connection closed"))


class Pool:
    """Up to `size` keep-alive connections to host:port; `request` waits for a free one."""

    def __init__(self, host: str, port: int, size: int, timeout: float):
        self.host, self.port, self.timeout = host, port, timeout
        self._free: asyncio.Queue = asyncio.Queue()
        for _ in range(size):
            self._free.put_nowait(None)            # a slot: connected on first use

    async def _connect(self) -> _Connection:
        try:
            _, connection = await asyncio.get_running_loop().create_connection(_Connection, self.host, self.port)
        except OSError as exc:
            raise HttpError(f"connect: {exc}") from None
        return connection

    async def request(self, raw: bytes) -> tuple[int, dict, bytes]:
        """(status, headers, body) of the answer to `raw` (request_bytes); HttpError when unknown."""
        connection = await self._free.get()
        try:
            if connection is None or connection.closed:
                connection = await self._connect()
            loop = asyncio.get_running_loop()
            connection.waiter = waiter = loop.create_future()
            timer = loop.call_later(self.timeout, lambda: waiter.done() or waiter.set_exception(
                HttpError("timed out")))
            connection.transport.write(raw)
            try:
                return await waiter
            finally:
                timer.cancel()
        except HttpError:
            if connection is not None and connection.transport is not None:
                connection.transport.close()       # an answer may still come: never reuse it
            connection = None
            raise
        finally:
            self._free.put_nowait(connection)

    def close(self) -> None:
        while not self._free.empty():
            connection = self._free.get_nowait()
            if connection is not None and connection.transport is not None:
                connection.transport.close()
