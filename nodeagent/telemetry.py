"""GPU telemetry (PROTOCOL.md, "Telemetry"): one sample per card per minute — utilisation,
VRAM used, temperature, power, SM clock — plus Xid events and ECC counter deltas, kept in a
bounded buffer in the state dir until a report carrying them is answered.

Why a buffer with an explicit acknowledgement: a report can be lost (no answer), refused as
a whole (409 replayed, 5xx) or answered; only an answer that names `telemetry` accepted (or
refused: a bad sample never becomes good by resending) lets the agent drop what it sent.
Every sample is keyed by (minute, card) and every event by (minute, card, kind, code), and
the storefront stores by those keys, so a resent batch changes nothing: lost reports lose no
samples, duplicates are not counted twice.

The sampler runs on a thread of its own (like the packet filter's guard): a storefront that
does not answer makes the agent back off for minutes, and sampling must not wait for it."""
import json
import logging
import threading
import time
from collections import Counter
from pathlib import Path

from .state import read_json, write_atomic

log = logging.getLogger(__name__)

#: The per-sample values, in wire order after (minute offset, card index).
CHANNELS = ("util", "mem_mb", "temp_c", "power_w", "sm_mhz")
#: Events kept per sample kept: Xid storms are bounded like the samples.
EVENTS_PER_SAMPLE = 0.25
MAX_VALUE = 2**31


def _value(v):
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < MAX_VALUE else None


class Telemetry:
    def __init__(self, probe, path: Path, *, every_seconds: int = 60, max_samples: int = 8 * 3 * 1440,
                 per_report: int = 120, send_minutes: int = 5, clock=time.time):
        self.probe, self.path, self.clock = probe, Path(path), clock
        self.every_minutes = max(1, every_seconds // 60)
        self.max_samples, self.per_report, self.send_minutes = max_samples, per_report, send_minutes
        self.max_events = max(100, int(max_samples * EVENTS_PER_SAMPLE))
        self._lock = threading.Lock()
        state = read_json(self.path, {})
        self.samples: list[list] = state.get("samples", [])   # [minute, card, util, mem, temp, power, sm]
        self.events: list[list] = state.get("events", [])     # [minute, card, "xid", code, n] | [.., "ecc", corr, unc]
        self.ecc_seen: dict[str, list] = state.get("ecc_seen", {})
        self.last_minute: int = state.get("last_minute", 0)
        self.dropped: int = state.get("dropped", 0)
        self._in_flight: tuple[set, set] | None = None

    # --- sampling -----------------------------------------------------------------------

    def sample(self, now: float | None = None) -> bool:
        """Read every card once for the current minute (unix time // 60), unless this minute
        (or one within the interval) was sampled already. Returns whether it sampled."""
        minute = int((self.clock() if now is None else now) // 60)
        if minute < self.last_minute + self.every_minutes:
            return False
        readings = self.probe.telemetry()
        with self._lock:
            for reading in readings:
                card = reading["index"]
                self.samples.append([minute, card, *(_value(reading.get(c)) for c in CHANNELS)])
                for code, n in sorted(Counter(x for x in reading.get("xids") or [] if _value(x) is not None).items()):
                    self.events.append([minute, card, "xid", code, n])
                self._ecc(minute, card, reading)
            self.last_minute = minute
            self._bound()
            self._save()
        return True

    def _ecc(self, minute: int, card: int, reading: dict) -> None:
        """ECC counters are cumulative (volatile: since the driver loaded): what the report
        carries is how much each grew this minute. The first reading is the baseline; a
        counter that went down was reset (a driver reload), so all of it is new."""
        now = [_value(reading.get("ecc_corrected")), _value(reading.get("ecc_uncorrected"))]
        seen = self.ecc_seen.get(str(card))
        self.ecc_seen[str(card)] = now
        if seen is None:
            return
        delta = [0 if a is None else (a - b if b is not None and a >= b else a) for a, b in zip(now, seen, strict=True)]
        if any(delta):
            self.events.append([minute, card, "ecc", *delta])

    def _bound(self) -> None:
        """Oldest first out: a long outage keeps the most recent days."""
        over = len(self.samples) - self.max_samples
        if over > 0:
            del self.samples[:over]
            if not self.dropped:       # once, not every minute of a long outage
                log.warning("telemetry buffer full: the oldest samples are dropped (storefront unreachable?)")
            self.dropped += over
        if len(self.events) > self.max_events:
            del self.events[:len(self.events) - self.max_events]

    def _save(self) -> None:
        # compact: a day of 8 cards is ~300 kB, rewritten once a minute during an outage
        write_atomic(self.path, json.dumps({"samples": self.samples, "events": self.events,
                                            "ecc_seen": self.ecc_seen, "last_minute": self.last_minute,
                                            "dropped": self.dropped}, separators=(",", ":")).encode())

    # --- the report's field ---------------------------------------------------------------

    def batch(self) -> dict | None:
        """The report's `telemetry` field: the oldest unsent samples and events (at most
        `per_report` of each), minutes as offsets from `start`. None when nothing waits, or
        while what waits is younger than `send_minutes` and fits one report: the storefront
        rewrites a card's day row per report that carries it, so five minutes in one report
        cost it a fifth of five reports of one (bench/fleet.py --telemetry)."""
        with self._lock:
            rows, events = self.samples[:self.per_report], self.events[:self.per_report]
            oldest = min((r[0] for r in rows + events), default=None)
            young = oldest is not None and int(self.clock() // 60) - oldest < self.send_minutes
            if not rows and not events or (young and len(self.samples) < self.per_report
                                           and len(self.events) < self.per_report):
                self._in_flight = None
                return None
            start = min(r[0] for r in rows + events)
            self._in_flight = ({(r[0], r[1]) for r in rows}, {tuple(e[:4]) for e in events})
            return {"start": start, "samples": [[r[0] - start, *r[1:]] for r in rows],
                    "events": [[e[0] - start, *e[1:]] for e in events]}

    def settle(self, answer: dict | None) -> None:
        """After a report was answered: drop what it carried when the storefront took the
        field (accepted, or refused for good). No answer: keep all for the next report."""
        with self._lock:
            flight, self._in_flight = self._in_flight, None
            if flight is None or not _answered(answer):
                return
            rows, events = flight
            self.samples = [r for r in self.samples if (r[0], r[1]) not in rows]
            self.events = [e for e in self.events if tuple(e[:4]) not in events]
            self._save()

    def pending(self) -> int:
        return len(self.samples)


def _answered(answer: dict | None) -> bool:
    if not isinstance(answer, dict):
        return False
    if "telemetry" in (answer.get("accepted") or []):
        return True
    return any(isinstance(r, dict) and r.get("item") == "telemetry" for r in answer.get("refused") or [])


class TelemetrySampler:
    """Samples at each minute's start on a thread of its own, storefront or not."""

    def __init__(self, telemetry: Telemetry):
        self.telemetry = telemetry
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="telemetry", daemon=True)

    def start(self) -> "TelemetrySampler":
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            try:
                self.telemetry.sample()
            except Exception:          # a card or the disk failing must not end sampling
                log.exception("telemetry sample failed")
            if self._stop.wait(60 - time.time() % 60 + 0.05):
                return
