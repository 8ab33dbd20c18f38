"""A TCP forwarder between the agent and the storefront that the test can switch off and
on again (same port): a storefront outage as the agent sees it (connection refused)."""
import socket
import socketserver
import threading


class OutageProxy:
    def __init__(self, target_host: str, target_port: int):
        self.target = (target_host, target_port)
        self.port = 0
        self.server = None
        self.open: set[socket.socket] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> None:
        target, open_sockets = self.target, self.open

        class Forward(socketserver.BaseRequestHandler):
            def handle(self):
                with socket.create_connection(target, timeout=30) as upstream:
                    open_sockets.update((self.request, upstream))
                    pipes = [threading.Thread(target=_pipe, args=(self.request, upstream)),
                             threading.Thread(target=_pipe, args=(upstream, self.request))]
                    for pipe in pipes:
                        pipe.start()
                    for pipe in pipes:
                        pipe.join()

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", self.port), Forward)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down(self) -> None:
        """Stop listening and cut the connections in flight (kept-alive ones too)."""
        self.server.shutdown()
        self.server.server_close()
        for sock in list(self.open):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.open.clear()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass
