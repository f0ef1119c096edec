"""Layer 1: scrape vLLM's /metrics, parse it with prometheus_client, normalise names across versions.

The output Reading holds only `vllm:` series under today's names, so nothing downstream needs to
know which vLLM version produced them. `_created` series are dropped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from ..model import VLLM_SOURCE, Reading, SeriesKey, make_labels
from ..store import scope_of

log = logging.getLogger(__name__)


# Old name -> today's name (REFERENCE.md §1). Applied to the sample name, suffixes included.
RENAMES: dict[str, str] = {
    "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "vllm:gpu_prefix_cache_queries_total": "vllm:prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_hits_total": "vllm:prefix_cache_hits_total",
    "vllm:time_per_output_token_seconds": "vllm:inter_token_latency_seconds",
    "vllm:time_in_queue_requests": "vllm:request_queue_time_seconds",
}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

# Families that say "this page came from vLLM"; a page with none of them is not a vLLM page.
CORE_FAMILIES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


class ScrapeError(Exception):
    """A failed scrape; `reason` is a bounded label value for the error counter."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _canonical(name: str) -> tuple[str, bool]:
    """Today's name for a sample name, and whether it was renamed."""
    if name in RENAMES:
        return RENAMES[name], True
    for suffix in HISTOGRAM_SUFFIXES:
        base = name[: -len(suffix)]
        if name.endswith(suffix) and base in RENAMES:
            return RENAMES[base] + suffix, True
    return name, False


# A real vLLM 0.32.0 page has ~320 `vllm:` series per engine; wide expert-parallel deployments run
# 64-128 data-parallel engines behind one API server. Past these limits a label is exploding
# (or this is not a plain vLLM): judging every engine would cost seconds per tick and export an
# unbounded number of series, so the page is refused, as Prometheus refuses a scrape over sample_limit.
DEFAULT_MAX_SERIES = 15_000
DEFAULT_MAX_ENGINES = 32


def vllm_lines(text: str, max_series: int = DEFAULT_MAX_SERIES) -> str:
    """Only vLLM's families, without `_created` samples: halves the parser's work on a real page.
    Counting here is cheap (0.15 s for 10 MiB), so an oversized page is refused before the parser runs."""
    kept = []
    series = 0
    for line in text.splitlines():
        if line.startswith("vllm:"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if not name.endswith("_created"):
                kept.append(line)
                series += 1
        elif line.startswith(("# HELP vllm:", "# TYPE vllm:")):
            kept.append(line)
    if series > max_series:
        raise ScrapeError("too_many_series", f"the page has {series} vllm: series, over the {max_series} limit (max_series): is a label exploding?")
    return "\n".join(kept) + "\n"


def parse_page(text: str, max_series: int = DEFAULT_MAX_SERIES, max_engines: int = DEFAULT_MAX_ENGINES) -> tuple[dict[SeriesKey, float], dict[str, Any]]:
    """Parse an exposition page into normalised vLLM samples plus facts about the page.

    Raises ScrapeError for a page that is not exposition text, has no vLLM metrics, or is over the
    series or engine limits. When both an old and a new name are present (deprecation windows), the
    new name wins.
    """
    lines = vllm_lines(text, max_series)
    try:
        families = list(text_string_to_metric_families(lines))
    except Exception as exc:  # the parser raises ValueError, IndexError, ... on garbage
        raise ScrapeError("parse", f"vLLM /metrics is not valid Prometheus text ({type(exc).__name__}: {exc})") from exc
    samples: dict[SeriesKey, float] = {}
    renamed: dict[SeriesKey, float] = {}
    used_old_names: set[str] = set()
    nan_series = 0
    for family in families:
        for sample in family.samples:
            name = sample.name
            if not name.startswith("vllm:") or name.endswith("_created"):
                continue
            value = float(sample.value)
            if math.isnan(value):
                nan_series += 1
                continue
            canonical, was_renamed = _canonical(name)
            key = (canonical, make_labels(sample.labels))
            if was_renamed:
                used_old_names.add(name)
                renamed[key] = value
            else:
                samples[key] = value
    for key, value in renamed.items():
        samples.setdefault(key, value)
    present = {name for name, _ in samples}
    if not any(name in present for name in CORE_FAMILIES):
        raise ScrapeError("no_vllm_metrics", "the page has no vllm:num_requests_* series: is this vLLM's /metrics?")
    engines = {scope for _, labels in samples if not (scope := scope_of(labels)).startswith("/")}
    if len(engines) > max_engines:
        example = ", ".join(sorted(engines)[:3])
        raise ScrapeError(
            "too_many_engines",
            f"the page has {len(engines)} engine/model label combinations (e.g. {example}), over the {max_engines} limit (max_engines)",
        )
    facts: dict[str, Any] = {"series": len(samples)}
    if used_old_names:
        facts["old_names"] = sorted(used_old_names)
    if nan_series:
        facts["nan_series"] = nan_series
    if any(name.startswith("vllm:num_requests_swapped") for name, _ in samples):
        facts["engine_generation"] = "v0"
    return samples, facts


class VllmSource:
    """Scrapes one vLLM server. `collect()` never raises: failures become `ok=False` Readings."""

    def __init__(
        self,
        base_url: str,
        metrics_path: str,
        timeout_seconds: float,
        connect_timeout_seconds: float,
        max_page_bytes: int,
        clock: Callable[[], float] = time.time,
        max_series: int = DEFAULT_MAX_SERIES,
        max_engines: int = DEFAULT_MAX_ENGINES,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.metrics_url = self.base_url + metrics_path
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds, connect=connect_timeout_seconds)
        self.max_page_bytes = max_page_bytes
        self.max_series = max_series
        self.max_engines = max_engines
        self.clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._version: str | None = None
        self._last_state: str | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _session_or_new(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        return self._session

    async def _get(self, url: str, limit: int) -> bytes:
        session = self._session_or_new()
        async with session.get(url, headers={"Accept": "text/plain"}) as response:
            if response.status != 200:
                raise ScrapeError("http_status", f"{url} answered HTTP {response.status}")
            declared = response.content_length
            if declared is not None and declared > limit:
                raise ScrapeError("too_large", f"{url} is {declared} bytes, over the {limit}-byte limit (max_page_bytes)")
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.content.iter_any():
                size += len(chunk)
                if size > limit:
                    raise ScrapeError("too_large", f"{url} is over the {limit}-byte limit (max_page_bytes)")
                chunks.append(chunk)
            if declared is not None and size < declared:
                raise ScrapeError("truncated", f"{url} sent {size} of the {declared} bytes it announced")
            return b"".join(chunks)

    async def _fetch_version(self) -> None:
        # Best effort: the version picks vLLM's default max_num_seqs and is shown as evidence.
        try:
            body = await self._get(self.base_url + "/version", 4096)
            self._version = str(json.loads(body)["version"])
        except Exception:  # an older or proxied server may not have /version
            self._version = None

    async def collect(self) -> Reading:
        start = time.perf_counter()
        timestamp = self.clock()
        try:
            body = await self._get(self.metrics_url, self.max_page_bytes)
            text = body.decode("utf-8", errors="replace")
            # In a worker thread: a large page takes the parser seconds, and /metrics must keep answering.
            samples, facts = await asyncio.to_thread(parse_page, text, self.max_series, self.max_engines)
            if self._version is None:
                await self._fetch_version()
            if self._version:
                facts["version"] = self._version
            reading = Reading(
                VLLM_SOURCE,
                timestamp,
                True,
                samples,
                error="vLLM reported NaN for some series (dropped)" if "nan_series" in facts else None,
                error_reason="nan_values" if "nan_series" in facts else None,
                duration_seconds=time.perf_counter() - start,
                meta=facts,
            )
        except ScrapeError as exc:
            reading = self._failed(timestamp, start, exc.reason, str(exc))
        except asyncio.TimeoutError:
            reading = self._failed(timestamp, start, "timeout", f"{self.metrics_url} did not answer within {self.timeout.total} s")
        except aiohttp.ClientPayloadError as exc:
            reading = self._failed(timestamp, start, "truncated", f"{self.metrics_url} sent a truncated page: {exc}")
        except aiohttp.ClientConnectionError as exc:
            reading = self._failed(timestamp, start, "connect", f"cannot reach {self.metrics_url}: {exc}")
        except aiohttp.ClientError as exc:
            reading = self._failed(timestamp, start, "http", f"{self.metrics_url}: {exc}")
        self._log_state_change(reading)
        return reading

    def _failed(self, timestamp: float, start: float, reason: str, message: str) -> Reading:
        self._version = None  # it may come back as another version
        return Reading(VLLM_SOURCE, timestamp, False, error=message, error_reason=reason, duration_seconds=time.perf_counter() - start)

    def _log_state_change(self, reading: Reading) -> None:
        # One line per change of state, not one per scrape.
        state = reading.error_reason or "ok"
        if state == self._last_state:
            return
        if state == "ok":
            log.info("vLLM source: scraping %s (vLLM %s)", self.metrics_url, self._version or "version unknown")
        else:
            log.warning("vLLM source: %s [%s]", reading.error, state)
        self._last_state = state
