"""The host agent of the two-hosts test's storefront hosts (HOST_AGENT=tests.deploy.hosts_probe.ProbeAgent).

The demo's FakeAgent, except that no instance ever becomes ready and every poll of a probe
lease (PROBE_LEASES, ids) is appended to PROBE_FILE as `time_ns host pid lease_id`, then takes
PROBE_POLL_SECONDS, as a real node's answer takes its time. A lifecycle pass polls each
provisioning lease once, in the same order, so one pass is a run of len(PROBE_LEASES) lines
from one process, and two passes at once would interleave their lines."""
import os
import time

from rental.agent import FakeAgent


class ProbeAgent(FakeAgent):
    def poll_ready(self, *, lease_id, started_at, now):
        if str(lease_id) in os.environ.get("PROBE_LEASES", "").split(","):
            line = f"{time.time_ns()} {os.environ['PROBE_HOST']} {os.getpid()} {lease_id}\n"
            fd = os.open(os.environ["PROBE_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line.encode())  # one write with O_APPEND: lines from processes never mix
            finally:
                os.close(fd)
            time.sleep(float(os.environ.get("PROBE_POLL_SECONDS", "0.05")))
        return None
