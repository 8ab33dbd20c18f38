"""Node agent settings: how nodes enrol, how often they report and wait (fleet/, nodeagent/
PROTOCOL.md, docs/operations/nodes.md). Star-imported by storefront/settings/__init__.py, so
they are Django settings like the others."""
import os
from datetime import timedelta

# A lease still provisioning this long after payment fails: slots freed, refunded to the balance.
NODE_PROVISIONING_DEADLINE = timedelta(minutes=int(os.environ.get("NODE_PROVISIONING_DEADLINE_MINUTES", "15")))
# A node whose last report is older than this is "not reporting" in the admin and dashboard.
NODE_REPORT_STALE_AFTER = timedelta(minutes=int(os.environ.get("NODE_REPORT_STALE_AFTER_MINUTES", "3")))
NODE_ENROLMENT_CODE_TTL = timedelta(hours=int(os.environ.get("NODE_ENROLMENT_CODE_TTL_HOURS", "24")))
NODE_REPORT_MAX_SKEW = timedelta(minutes=5)     # a report's sent_at further off is refused (replays)
NODE_POLL_SECONDS = int(os.environ.get("NODE_POLL_SECONDS", "15"))
# The interval every node is told (fleet/pacing.py, ADR 0032): NODE_POLL_SECONDS while its
# nodes send at most NODE_REPORTS_PER_SECOND at that pace (one request an interval each), else
# the interval at which they do, in steps of NODE_POLL_STEP_SECONDS, at most
# NODE_POLL_MAX_SECONDS (fleet/checks.py: within a wait, and two of them plus a heartbeat within
# NODE_REPORT_STALE_AFTER); the reporting nodes are recounted every NODE_PACE_RECOUNT_SECONDS.
# 175 a second: 5,000 nodes at 30 s (167) held beside the customers on a 2-core host (docs/performance.md).
NODE_REPORTS_PER_SECOND = float(os.environ.get("NODE_REPORTS_PER_SECOND", "175"))
NODE_POLL_STEP_SECONDS = int(os.environ.get("NODE_POLL_STEP_SECONDS", "5"))
NODE_POLL_MAX_SECONDS = int(os.environ.get("NODE_POLL_MAX_SECONDS", "60"))
NODE_PACE_RECOUNT_SECONDS = int(os.environ.get("NODE_PACE_RECOUNT_SECONDS", "300"))
# A node may wait for a change to its desired state (GET /agent/v1/desired/watch,
# fleet/desired_watch.py) up to NODE_WATCH_MAX_SECONDS; a waiting request reads its version
# again every NODE_WATCH_RECHECK_SECONDS (the bound on a change whose announcement was lost).
# Under WSGI a wait would hold a server thread: it is cut to NODE_WATCH_WSGI_HOLD_SECONDS
# (0: answered at once) — production serves the watch from the ASGI process (start.sh watch),
# which takes the reports that wait on NODE_WATCH_REPORT_THREADS threads per worker (ADR 0028).
NODE_WATCH_MAX_SECONDS = int(os.environ.get("NODE_WATCH_MAX_SECONDS", "60"))
NODE_WATCH_RECHECK_SECONDS = float(os.environ.get("NODE_WATCH_RECHECK_SECONDS", "5"))
NODE_WATCH_WSGI_HOLD_SECONDS = float(os.environ.get("NODE_WATCH_WSGI_HOLD_SECONDS", "0"))
NODE_WATCH_REPORT_THREADS = int(os.environ.get("NODE_WATCH_REPORT_THREADS", "1"))
# Each worker of that process collects its oldest generation of objects every
# WATCH_FULL_COLLECTION_SECONDS, not whenever CPython's own trigger would (0: as CPython does):
# the reports it holds reach that generation, and each full collection stops every answer
# (fleet/collector.py, ADR 0033).
WATCH_FULL_COLLECTION_SECONDS = float(os.environ.get("WATCH_FULL_COLLECTION_SECONDS", "600"))
# A node's cached desired-state ETag (fleet/desired_version.py) is recomputed at
# least this often even when no change bumped it: the bound on a bump lost while Redis kept
# its data (the clock and a Redis that came back older are handled exactly; recomputing
# 10,000 documents every 300 s took half of the storefront's CPU); the node's last_seen_at is written by a
# desired poll only when older than NODE_SEEN_WRITE_SECONDS, and by a report at least that often;
# a steady instance's egress counter is stored (and metered) once it grew by
# NODE_EGRESS_FLUSH_BYTES or its last stored report is NODE_EGRESS_FLUSH_SECONDS old.
NODE_DESIRED_REVALIDATE_SECONDS = int(os.environ.get("NODE_DESIRED_REVALIDATE_SECONDS", "1800"))
NODE_SEEN_WRITE_SECONDS = int(os.environ.get("NODE_SEEN_WRITE_SECONDS", "60"))
NODE_EGRESS_FLUSH_SECONDS = int(os.environ.get("NODE_EGRESS_FLUSH_SECONDS", "300"))
NODE_EGRESS_FLUSH_BYTES = int(os.environ.get("NODE_EGRESS_FLUSH_BYTES", str(10**9)))
# A worker keeps the agents whose credentials it has seen, at most this many; a desired poll
# trusts an entry at most this long, under the credential epoch that every enrolment and
# revocation moves (fleet/credentials.py); a report whatever its age, since it is re-checked
# by the heartbeat's UPDATE at least every NODE_SEEN_WRITE_SECONDS.
NODE_CREDENTIAL_CACHE_SECONDS = int(os.environ.get("NODE_CREDENTIAL_CACHE_SECONDS", "60"))
NODE_CREDENTIAL_CACHE_MAX = int(os.environ.get("NODE_CREDENTIAL_CACHE_MAX", "50000"))
# Redis takes a steady report's seq (fleet/seq.py) up to this far above the one the
# database last stored; after Redis lost its entry the database accepts only seqs past that
# fence. At most the agent's REPLAY_SKIP (nodeagent/agent.py: it skips that far on a 409).
# An agent's entry outlives its last checkpoint by NODE_SEQ_KEY_SECONDS.
NODE_SEQ_FENCE = int(os.environ.get("NODE_SEQ_FENCE", "1000"))
NODE_SEQ_KEY_SECONDS = int(os.environ.get("NODE_SEQ_KEY_SECONDS", str(24 * 3600)))
