"""A capture's readings as a sidecar reading at another cadence would have taken them: each source's readings thinned
to one per `seconds` (a source read less often than that keeps all of its own, as py-spy's windows do), to replay with
tick_seconds at the same value. What a longer default cadence costs in detection is judged on these."""

from __future__ import annotations

from vllm_triage.model import Reading

# A reading counts as the next one at 3/4 of the period: the recorded ones come a little early or late (2 s +- jitter).
JITTER_SHARE = 0.75


def at_cadence(readings: list[Reading], seconds: float) -> list[Reading]:
    kept: list[Reading] = []
    last: dict[str, float] = {}
    for reading in readings:
        previous = last.get(reading.source)
        if previous is None or reading.timestamp - previous >= JITTER_SHARE * seconds:
            kept.append(reading)
            last[reading.source] = reading.timestamp
    return kept
