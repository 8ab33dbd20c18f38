"""A host agent that takes its time, so a test can kill a Celery worker mid-task
(HOST_AGENT=tests.billing.slow_agent.SlowAgent, SLOW_AGENT_SECONDS per poll and per stop)."""
import os
import time

from rental.agent import FakeAgent


class SlowAgent(FakeAgent):
    def poll_ready(self, *, lease_id, started_at, now):
        time.sleep(float(os.environ.get("SLOW_AGENT_SECONDS", "0.3")))
        return super().poll_ready(lease_id=lease_id, started_at=started_at, now=now)

    def stop(self, *, lease_id):
        time.sleep(float(os.environ.get("SLOW_AGENT_SECONDS", "0.3")))
        return super().stop(lease_id=lease_id)
