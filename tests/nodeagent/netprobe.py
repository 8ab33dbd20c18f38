"""Probes for what a node routes, from network namespaces of the tests' own: TCP connects
and UDP datagrams, and listeners that record what reached them (sink.py, udp_sink.py).

A datagram that was dropped leaves no trace, so "nothing arrived" is proven by order, not
by a pause: after the probes, markers are sent to the same listener from the node itself
(its own output, never forwarded); once the second marker is in, anything the node had
forwarded before it would be in too."""
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

from tests import deadlines

HERE = Path(__file__).parent


class Sink:
    """sink.py (TCP: byte counts) or udp_sink.py (payloads) in a network namespace."""

    def __init__(self, netns_name: str, directory: Path, *, udp: bool = False):
        self.log = Path(tempfile.mkstemp(dir=directory, suffix=".log")[1])
        script = HERE / ("udp_sink.py" if udp else "sink.py")
        self.process = subprocess.Popen(["ip", "netns", "exec", netns_name, sys.executable,
                                         str(script), str(self.log)], stdout=subprocess.PIPE,
                                        text=True)
        self.port = int(self.process.stdout.readline())

    def lines(self) -> list[str]:
        return self.log.read_text().split()

    def stop(self):
        self.process.terminate()
        self.process.wait(10)


def tcp_open(netns_name: str, host: str, port: int, *, seconds: float = 3) -> bool:
    """Whether a TCP connection from the namespace to host:port comes up within `seconds`
    (scaled with the load): a dropped SYN gets no answer at all."""
    result = subprocess.run(
        ["ip", "netns", "exec", netns_name, "timeout", f"{deadlines.scaled(seconds):.1f}",
         "bash", "-c", f"exec 3<>/dev/tcp/{host}/{port}"], capture_output=True)
    return result.returncode == 0


def udp_send(netns_name: str, host: str, port: int, payload: str, *, count: int = 3) -> None:
    code = ("import socket, sys\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"for _ in range({count}):\n"
            f"    s.sendto(sys.argv[1].encode(), ({host!r}, {port}))\n")
    subprocess.run(["ip", "netns", "exec", netns_name, sys.executable, "-c", code, payload],
                   check=True, capture_output=True)


def udp_arrives(sink: Sink, from_netns: str, host: str, port: int) -> bool:
    """Send datagrams from `from_netns`; True as soon as one arrives (bounded wait)."""
    probe = f"probe-{secrets.token_hex(4)}"
    udp_send(from_netns, host, port, probe)
    try:
        deadlines.wait_for(lambda: probe in sink.lines(), 5, f"datagram {probe}", every=0.05)
        return True
    except AssertionError:
        return False


def udp_dropped(sink: Sink, from_netns: str, host: str, port: int, *, node_netns: str) -> bool:
    """Send datagrams from `from_netns`, then two markers from the node's own namespace
    (`host` must be on one of its links): True when both markers arrived and no probe."""
    probe = f"probe-{secrets.token_hex(4)}"
    udp_send(from_netns, host, port, probe)
    for n in (1, 2):
        marker = f"marker{n}-{probe}"
        udp_send(node_netns, host, port, marker)
        deadlines.wait_for(lambda marker=marker: marker in sink.lines(), 10,
                           f"marker {marker} from the node", every=0.05)
    return probe not in sink.lines()
