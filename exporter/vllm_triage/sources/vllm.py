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
from functools import lru_cache, partial
from typing import TYPE_CHECKING, cast
from urllib.parse import urlsplit

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from ..config import DEFAULT_MAX_ENGINES, DEFAULT_MAX_LABEL_VALUE_LENGTH, DEFAULT_MAX_SERIES
from ..cpu_account import CPU
from ..model import HISTOGRAM_SUFFIXES, VLLM_SOURCE, Reading, SeriesKey, VllmMeta, bucket_bound, make_labels
from ..options import redact_url
from ..scope import scope_of
from ..signals.vllm import VLLM_SAMPLES_READ
from . import Clock, SourceLoop, http_failure, read_bounded, shortened

if TYPE_CHECKING:
    from ..config import Config
    from ..model import ProcessTargets

log = logging.getLogger(__name__)


# Old name -> today's name (vLLM's renames across its versions). Applied to the sample name, suffixes included.
RENAMES: dict[str, str] = {
    "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "vllm:gpu_prefix_cache_queries_total": "vllm:prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_hits_total": "vllm:prefix_cache_hits_total",
    "vllm:time_per_output_token_seconds": "vllm:inter_token_latency_seconds",
    "vllm:time_in_queue_requests": "vllm:request_queue_time_seconds",
}


def spellings(name: str) -> tuple[str, ...]:
    """Every name vLLM has exported a family under, today's first: what a query straight on vLLM's metrics selects
    (the alert rules, the dashboards), so that it works whatever vLLM version a server runs."""
    return (name, *sorted(old for old, new in RENAMES.items() if new == name))


# Families that say "this page came from vLLM"; a page with none of them is not a vLLM page.
CORE_FAMILIES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


class ScrapeError(Exception):
    """A failed scrape; `reason` is a bounded label value for the error counter."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@lru_cache(maxsize=4096)  # a page's few hundred names recur every scrape; bounded against a churning page
def _canonical(name: str) -> tuple[str, bool]:
    """Today's name for a sample name, and whether it was renamed."""
    if name in RENAMES:
        return RENAMES[name], True
    for suffix in HISTOGRAM_SUFFIXES:
        base = name[: -len(suffix)]
        if name.endswith(suffix) and base in RENAMES:
            return RENAMES[base] + suffix, True
    return name, False


def vllm_lines(text: str, max_series: int = DEFAULT_MAX_SERIES, keep: frozenset[str] | None = None) -> list[str]:
    """vLLM's sample lines — only those named in `keep` (today's names) when given — without `_created`
    samples: the parser's time is most of a scrape's cost, so what no signal reads is skipped before it
    runs (HELP and TYPE too: a sample's name, labels and value do not depend on them). Every vllm: series
    is counted (cheap: 0.15 s for 10 MiB), so an oversized page is refused before the parser runs."""
    kept = []
    series = 0
    for line in text.splitlines():
        if line.startswith("vllm:"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if not name.endswith("_created"):
                series += 1
                if keep is None or _canonical(name)[0] in keep:
                    kept.append(line)
    if series > max_series:
        raise ScrapeError("too_many_series", f"the page has {series} vllm: series, over the {max_series} limit (max_series): is a label exploding?")
    return kept


ParsedLine = tuple[str, dict[str, str], float]
SeriesMemo = dict[str, tuple[str, dict[str, str]]]


def _value(text: str) -> float:
    """A sample's value as prometheus_client's parser reads it (no underscores, no padding)."""
    if "_" in text or text != text.strip():
        raise ValueError(f"Invalid value: {text!r}")
    return float(text)


def parse_lines(lines: list[str], memo: SeriesMemo | None = None) -> list[ParsedLine]:
    """Each sample line as (name, labels, value), parsed by prometheus_client's parser. With `memo`, a
    series seen on the previous page is not parsed again: its name and labels are the memo's and only its
    value (the text after the last space) is read — labels are most of the parser's time, and a page's
    series rarely change. A line enters the memo only where its series text and value, split at the last
    space, read as the parser read the whole line (a timestamp or an exemplar does not); the memo then
    holds this page's series."""
    known: SeriesMemo = {} if memo is None else memo
    result: list[ParsedLine | None] = []
    fresh: list[tuple[int, str, str, str]] = []  # (where in the result, the line, its series text, its value text)
    series_texts: list[str] = []
    for line in lines:
        series, _, value_text = line.rpartition(" ")
        series_texts.append(series)
        seen = known.get(series)
        if seen is not None:
            try:
                result.append((seen[0], seen[1], _value(value_text)))
                continue
            except ValueError:
                pass  # the parser says what is wrong with it
        fresh.append((len(result), line, series, value_text))
        result.append(None)
    if fresh:
        text = "\n".join(line for _, line, _, _ in fresh) + "\n"
        try:
            found = [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]
        except Exception as exc:  # the parser raises ValueError, IndexError, ... on garbage
            raise ScrapeError("parse", f"vLLM /metrics is not valid Prometheus text ({type(exc).__name__}: {shortened(exc)})") from exc
        if len(found) != len(fresh):
            raise ScrapeError("parse", f"vLLM /metrics is not valid Prometheus text: {len(fresh)} sample lines read as {len(found)} samples")
        for (index, _, series, value_text), (name, labels, value) in zip(fresh, found, strict=True):
            result[index] = (name, labels, value)
            try:
                read, whole = _value(value_text), float(value)
                same = read == whole or (math.isnan(read) and math.isnan(whole))
            except (ValueError, OverflowError):
                same = False
            if same and series:
                known[series] = (name, labels)
    if len(known) > len(lines):  # series gone from the page leave the memo: it holds one page
        kept = {series: known[series] for series in series_texts if series in known}
        known.clear()
        known.update(kept)
    return cast("list[ParsedLine]", result)


# Values past this are no real counter or gauge of vLLM's (10^30 FLOPs is 30 years of an H200 at its
# bf16 peak): refused, so that sums and rates of them stay finite.
MAX_ABS_VALUE = 1e30

# Why a series of a page was refused; each is counted in vllm_triage_source_errors_total{reason}.
DROP_REASONS = {
    "nan_values": "NaN values",
    "non_finite_values": "infinite or out-of-range values",
    "bad_bucket": "histograms with a non-numeric le label",
    "label_too_long": "label values over max_label_value_length",
}


def _histogram_base(name: str) -> str | None:
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return None


def parse_page(
    text: str,
    max_series: int = DEFAULT_MAX_SERIES,
    max_engines: int = DEFAULT_MAX_ENGINES,
    max_label_value_length: int = DEFAULT_MAX_LABEL_VALUE_LENGTH,
    keep: frozenset[str] | None = None,
    memo: SeriesMemo | None = None,
) -> tuple[dict[SeriesKey, float], VllmMeta]:
    """Parse an exposition page into normalised vLLM samples plus facts about the page.

    Raises ScrapeError for a page that is not exposition text, has no vLLM metrics, or is over the
    series or engine limits. A value or label that no arithmetic should see (NaN, ±Inf, a non-numeric
    bucket bound, a huge label) is refused here, at the edge, series by series (a bad bucket drops its
    whole histogram), and counted in facts["dropped"] by reason. When both an old and a new name are
    present (deprecation windows), the new name wins. With `keep`, only those samples (today's names);
    `memo`: see parse_lines.
    """
    parsed = parse_lines(vllm_lines(text, max_series, keep), memo)
    samples: dict[SeriesKey, float] = {}
    renamed: dict[SeriesKey, float] = {}
    used_old_names: set[str] = set()
    dropped: dict[str, int] = {}
    bad_histograms: set[str] = set()
    for name, labels, raw in parsed:  # vllm_lines kept only vllm: samples, without _created
        try:
            value = float(raw)
        except OverflowError:  # an integer of hundreds of digits
            value = math.inf
        reason = None
        if math.isnan(value):
            reason = "nan_values"
        elif not abs(value) <= MAX_ABS_VALUE:
            reason = "non_finite_values"
        elif any(len(v) > max_label_value_length for v in labels.values()):
            reason = "label_too_long"
        elif name.endswith("_bucket") and bucket_bound(labels.get("le")) is None:
            reason = "bad_bucket"
            bad_histograms.add(_canonical(name)[0].removesuffix("_bucket"))
        if reason is not None:
            dropped[reason] = dropped.get(reason, 0) + 1
            continue
        canonical, was_renamed = _canonical(name)
        key = (canonical, make_labels(labels))
        if was_renamed:
            used_old_names.add(name)
            renamed[key] = value
        else:
            samples[key] = value
    for key, value in renamed.items():
        samples.setdefault(key, value)
    if bad_histograms:
        doomed = [key for key in samples if _histogram_base(key[0]) in bad_histograms]
        for key in doomed:
            del samples[key]
        dropped["bad_bucket"] += len(doomed)
    present = {name for name, _ in samples}
    if not any(name in present for name in CORE_FAMILIES):
        raise ScrapeError("no_vllm_metrics", "the page has no vllm:num_requests_* series: is this vLLM's /metrics?")
    engines = {scope for _, labels in samples if (scope := scope_of(labels)).kind == "engine"}
    if len(engines) > max_engines:
        example = ", ".join(scope.key for scope in sorted(engines)[:3])
        raise ScrapeError(
            "too_many_engines",
            f"the page has {len(engines)} engine/model label combinations (e.g. {example}), over the {max_engines} limit (max_engines)",
        )
    facts = VllmMeta(series=len(samples))
    if used_old_names:
        facts["old_names"] = sorted(used_old_names)
    if dropped:
        facts["dropped"] = dropped
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
        max_label_value_length: int = DEFAULT_MAX_LABEL_VALUE_LENGTH,
        keep: frozenset[str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.metrics_url = self.base_url + metrics_path
        self.shown_url = redact_url(self.metrics_url)  # what messages say: never the credentials
        self._secrets = [s for s in (urlsplit(self.metrics_url).password, urlsplit(self.metrics_url).query) if s]
        self.max_label_value_length = max_label_value_length
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds, connect=connect_timeout_seconds)
        self.max_page_bytes = max_page_bytes
        self.max_series = max_series
        self.max_engines = max_engines
        self.keep = keep  # the samples the signals read (signals.vllm.VLLM_SAMPLES_READ); None: every vllm: sample
        self._memo: SeriesMemo = {}  # the last page's series, parsed (parse_lines)
        self.clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._version: str | None = None
        self._version_asked = False  # once per run of successful scrapes: a server without /version is not asked every scrape
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
            shown = redact_url(url)
            if response.status != 200:
                raise ScrapeError("http_status", f"{shown} answered HTTP {response.status}")
            declared = response.content_length
            if declared is not None and declared > limit:
                raise ScrapeError("too_large", f"{shown} is {declared} bytes, over the {limit}-byte limit (max_page_bytes)")
            body = await read_bounded(response.content, limit)
            if body is None:
                raise ScrapeError("too_large", f"{shown} is over the {limit}-byte limit (max_page_bytes)")
            if declared is not None and len(body) < declared:
                raise ScrapeError("truncated", f"{shown} sent {len(body)} of the {declared} bytes it announced")
            return body

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
            parse = partial(parse_page, text, self.max_series, self.max_engines, self.max_label_value_length, self.keep, self._memo)
            samples, facts = await asyncio.to_thread(CPU.run, "vllm_parse", parse)
            if not self._version_asked:
                self._version_asked = True
                await self._fetch_version()
            if self._version:
                facts["version"] = self._version
            dropped = facts.get("dropped", {})
            reading = Reading(
                VLLM_SOURCE,
                timestamp,
                True,
                samples,
                error="; ".join(f"{count} series refused: {DROP_REASONS[reason]}" for reason, count in sorted(dropped.items())) or None,
                error_reason=max(dropped, key=dropped.__getitem__) if dropped else None,
                duration_seconds=time.perf_counter() - start,
                meta=facts,
            )
        except ScrapeError as exc:
            reading = self._failed(timestamp, start, exc.reason, str(exc))
        except asyncio.TimeoutError:
            reading = self._failed(timestamp, start, "timeout", f"{self.shown_url} did not answer within {self.timeout.total} s")
        except aiohttp.ClientPayloadError as exc:
            reading = self._failed(timestamp, start, "truncated", f"{self.shown_url} sent a truncated page: {exc}")
        except aiohttp.ClientConnectionError as exc:
            reading = self._failed(timestamp, start, "connect", f"cannot reach {self.shown_url}: {exc}")
        except aiohttp.ClientError as exc:
            reading = self._failed(timestamp, start, "http", f"{self.shown_url}: {http_failure(exc)}")
        self._log_state_change(reading)
        return reading

    def _failed(self, timestamp: float, start: float, reason: str, message: str) -> Reading:
        self._version, self._version_asked = None, False  # it may come back as another version
        for secret in self._secrets:  # a client library's message may quote the URL it was given
            message = message.replace(secret, "***")
        return Reading(VLLM_SOURCE, timestamp, False, error=message, error_reason=reason, duration_seconds=time.perf_counter() - start)

    def _log_state_change(self, reading: Reading) -> None:
        # One line per change of state, not one per scrape.
        state = reading.error_reason or "ok"
        if state == self._last_state:
            return
        if state == "ok":
            log.info("vLLM source: scraping %s (vLLM %s)", self.shown_url, self._version or "version unknown")
        else:
            log.warning("vLLM source: %s [%s]", reading.error, state)
        self._last_state = state


def build(config: Config, clock: Clock, _: ProcessTargets) -> SourceLoop:
    """Scrape vLLM every scrape_interval_seconds, keeping only the samples some signal reads."""
    source = VllmSource(
        config.vllm_url,
        config.metrics_path,
        config.scrape_timeout_seconds,
        config.connect_timeout_seconds,
        config.max_page_bytes,
        clock,
        config.max_series,
        config.max_engines,
        config.max_label_value_length,
        VLLM_SAMPLES_READ,
    )
    return SourceLoop(VLLM_SOURCE, config.scrape_interval_seconds, source.collect, source.close)
