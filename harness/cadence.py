"""A capture's readings as a sidecar at a config's cadences would have read them: each source's readings thinned to one
per its interval (scrape_interval_seconds, process_interval_seconds, ...; a source recorded less often than that keeps
all of its own, as py-spy's windows do), to replay at that config. What a longer cadence costs in detection is judged on
these: replaying readings denser than the config reads would judge on evidence a live sidecar does not have."""

from __future__ import annotations

from vllm_triage.catalog import CATALOG
from vllm_triage.config import Config
from vllm_triage.model import Reading

# A reading counts as the next one at 3/4 of the interval: the recorded ones come a little early or late (2 s +- jitter).
JITTER_SHARE = 0.75


def every(seconds: float) -> dict[str, float]:
    """Flags that judge and read every source every `seconds`, but those read minutes apart by design (a lookback of
    their own: py-spy's windows)."""
    return {"tick_seconds": seconds, **{entry.interval_option: seconds for entry in CATALOG if not entry.lookback_intervals}}


def as_read(readings: list[Reading], config: Config) -> list[Reading]:
    intervals = {entry.name: float(config.value(entry.interval_option)) for entry in CATALOG}
    kept: list[Reading] = []
    last: dict[str, float] = {}
    for reading in readings:
        previous = last.get(reading.source)
        if previous is None or reading.timestamp - previous >= JITTER_SHARE * intervals.get(reading.source, 0.0):
            kept.append(reading)
            last[reading.source] = reading.timestamp
    return kept
