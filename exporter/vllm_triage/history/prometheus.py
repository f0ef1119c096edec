"""History from Prometheus: the series the signals read, over a time range, turned into the Readings the
live sources would have produced, so that the same pipeline judges the past (`diagnose --prometheus`,
`replay --prometheus`).

Two range queries, bounded in series, points and time: vLLM's own samples (today's names and every older
name of them), and the sidecar's exported last readings (`vllm_triage_gpu_*`, `vllm_triage_process_*`,
`vllm_triage_gil_*`, where a sidecar ran beside that vLLM). The selector must pick one server: the samples
of two pods would be mixed into one.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp

from ..catalog import CATALOG, EXPORTED_PREFIX
from ..model import GPU_SOURCE, HISTOGRAM_SUFFIXES, MAX_NUM_SEQS_READ, PROCESS_SOURCE, VLLM_SOURCE, GpuMeta, Reading, SeriesKey, VllmMeta, make_labels
from ..options import redact_url
from ..signals.vllm import VLLM_SAMPLES_READ
from ..sources import http_failure, read_bounded
from ..sources.dcgm import dcgm_readings
from ..sources.vllm import RENAMES, _canonical

# Labels Prometheus and its service discovery add to a target's series: not vLLM's nor the sidecar's own.
TARGET_LABELS = frozenset({"__name__", "job", "instance", "namespace", "pod", "container", "endpoint", "service", "cluster", "node", "prometheus"})
MAX_POINTS_PER_SERIES = 11_000  # Prometheus refuses a range query past this many steps


class HistoryError(Exception):
    """What is missing or wrong, in a sentence for the person who asked."""


@dataclass(frozen=True)
class HistoryLimits:
    step_seconds: float = 2.0
    max_series: int = 20_000
    # points over every query of one command: ~150 bytes each once decoded, so 1M points stay near 150 MB (an hour of one
    # server at 2 s steps is ~0.6M); counted in the answer's bytes before it is decoded (a 63 MB answer of 2.4M points
    # took the CLI to 1.26 GB)
    max_points: int = 1_000_000
    max_answer_bytes: int = 64 * 1024 * 1024  # read before it is parsed: a 100 MB answer took the CLI past 1 GB
    timeout_seconds: float = 60.0  # for the whole command, every query together


ANSWER_LISTS_MAX = 64  # lists an answer may hold besides its series' points (warnings, infos)


def _count_before_decoding(body: bytes) -> tuple[int, int]:
    """(series, points) an answer holds, from its bytes: each series has one "metric" key, each point opens one '['
    (labels are JSON strings, where a '[' would only add to the count: an answer can only seem larger)."""
    series = body.count(b'"metric"')
    return series, max(0, body.count(b"[") - series - 1)


def _vllm_names() -> list[str]:
    """Every sample name vLLM may have stored them under: today's and each older name (with its histogram suffixes)."""
    names = set(VLLM_SAMPLES_READ)
    for old, new in RENAMES.items():
        names.update(old + suffix for suffix in ("", *HISTOGRAM_SUFFIXES) if (new + suffix) in VLLM_SAMPLES_READ)
    return sorted(names)


def _latest_sources() -> dict[str, str]:
    """Exported prefix -> source, for the sources whose last reading the sidecar exports as read."""
    return {entry.latest_prefix: entry.name for entry in CATALOG if entry.exports_latest}


_WINDOWED = tuple(f"{EXPORTED_PREFIX}{entry.exported_as}" for entry in CATALOG)

# Every family a source exports as read: the sources' last readings, rebuilt from their history.
_LATEST_QUERY = "(" + "|".join(re.escape(prefix) for prefix in _latest_sources()) + ").+"


def parse_selector(selector: str) -> str:
    """The matchers inside a `{...}` selector ('namespace="x",pod="y"'), checked for shape."""
    text = selector.strip()
    if not text:
        return ""
    if not (text.startswith("{") and text.endswith("}")) or "__name__" in text:
        raise HistoryError(f'--selector {selector!r}: expected label matchers in braces, e.g. \'{{namespace="llm",pod="vllm-0"}}\'')
    return text[1:-1].strip().rstrip(",")


def _exported(matchers: str) -> str:
    return re.sub(r"\b(pod|namespace)(\s*(=~|!~|!=|=))", r"exported_\1\2", matchers)


def _query(names_regex: str, matchers: str) -> str:
    inner = f'__name__=~"{names_regex}"' + (f",{matchers}" if matchers else "")
    return "{" + inner + "}"


def _result(body: bytes, url: str, asked: str) -> Any:
    """data.result of an answer of Prometheus' JSON API, or a HistoryError saying what came instead."""
    try:
        payload = json.loads(body)
    except ValueError:
        raise HistoryError(f"Prometheus at {redact_url(url)} answered something that is not its JSON API") from None
    if not isinstance(payload, dict) or payload.get("status") != "success":
        said = payload.get("error") if isinstance(payload, dict) else payload
        raise HistoryError(f"Prometheus at {redact_url(url)} refused {asked}: {str(said)[:300]}")
    return payload.get("data", {}).get("result") if isinstance(payload.get("data"), dict) else None


async def list_servers(url: str, matchers: str, at: float, limit: int, timeout: float = 60.0, max_bytes: int = 8 * 2**20) -> list[dict[str, str]]:
    """The vLLM servers (namespace, pod, instance, model_name) the matchers pick at `at`, at most `limit`; the answer is
    read to `max_bytes` at most and checked for shape (a 300 MB list once took `fleet` to 2.95 GB)."""
    query = "count by (namespace, pod, instance, model_name) ({" + ",".join(filter(None, ['__name__="vllm:num_requests_running"', matchers])) + "})"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        try:
            async with session.post(f"{url.rstrip('/')}/api/v1/query", data={"query": query, "time": f"{at:.3f}"}) as response:
                body = await read_bounded(response.content, max_bytes)
        except (aiohttp.ClientError, TimeoutError) as error:
            raise HistoryError(f"Prometheus at {redact_url(url)} did not answer: {http_failure(error)}") from None
    if body is None:
        raise HistoryError(f"Prometheus' list of servers is over {max_bytes // 2**20} MiB: narrow --selector (a namespace, a model)")
    if _count_before_decoding(body)[0] > limit:
        raise HistoryError(f"over {limit} vLLM servers match: narrow --selector (a namespace, a model)")
    result = _result(body, url, query)
    if not isinstance(result, list) or not all(isinstance(s, dict) and isinstance(s.get("metric"), dict) for s in result):
        raise HistoryError(f"Prometheus at {redact_url(url)} answered in a shape that is not a query's vector (data.result: series of metric)")
    found = [{str(k): str(v) for k, v in s["metric"].items()} for s in result]
    if not found:
        raise HistoryError(f"no vLLM server (vllm:num_requests_running) matching {{{matchers}}} in Prometheus at {redact_url(url)} at {at:.0f}")
    if len(found) > limit:
        raise HistoryError(f"{len(found)} vLLM servers match, over {limit}: narrow --selector (a namespace, a model)")
    return found


def _clean_series(series: dict[str, Any]) -> dict[str, Any] | None:
    """A series as the readers expect it: a string __name__, string labels, [time, value] points of numbers (odd
    points skipped: null, short, not a number); None for a series without its name, which no signal reads."""
    metric = series["metric"]
    if not isinstance(metric.get("__name__"), str):
        return None
    points = []
    for point in series["values"]:
        try:
            t, value = point
            at, number = float(t), float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(at):
            points.append([at, number])
    return {"metric": {str(k): str(v) for k, v in metric.items()}, "values": points}


class PrometheusHistory:
    def __init__(self, url: str, selector: str = "", limits: HistoryLimits | None = None) -> None:
        self.url = url.rstrip("/")
        self.matchers = parse_selector(selector)
        self.limits = limits or HistoryLimits()
        self.notes: list[str] = []  # what the history lacks, for the person who asked
        self._points_left = self.limits.max_points  # of the command's point budget

    async def readings(self, start: float, end: float) -> list[Reading]:
        """The Readings of vLLM and of the sidecar's exported sources at each step from start to end, within one
        deadline for every query together (a slow Prometheus once took four full timeouts)."""
        try:
            return await asyncio.wait_for(self._readings(start, end), self.limits.timeout_seconds)
        except asyncio.TimeoutError:  # TimeoutError itself from 3.11
            took = f"{self.limits.timeout_seconds:g} s"
            asked = "ask for a shorter range or a larger --step"
            raise HistoryError(f"Prometheus at {redact_url(self.url)} did not answer every query within {took}: {asked}") from None

    async def _readings(self, start: float, end: float) -> list[Reading]:
        steps = math.floor((end - start) / self.limits.step_seconds) + 1
        if steps > MAX_POINTS_PER_SERIES:
            raise HistoryError(
                f"{steps} steps of {self.limits.step_seconds:g} s: over Prometheus' {MAX_POINTS_PER_SERIES}; use a larger --step or a shorter range"
            )
        self._points_left = self.limits.max_points
        async with aiohttp.ClientSession() as session:
            vllm = await self._range(session, "|".join(re.escape(n) for n in _vllm_names()), self.matchers, start, end, steps)
            sidecar = await self._range(session, _LATEST_QUERY, self.matchers, start, end, steps)
            seqs = await self._range(session, f"{EXPORTED_PREFIX}vllm_max_num_seqs", self.matchers, start, end, steps)
            dcgm = await self._range(session, "DCGM_FI_.+", self.matchers, start, end, steps)
            if not dcgm and self.matchers:  # scraped without honor_labels, dcgm-exporter's pod and namespace are exported_*
                dcgm = await self._range(session, "DCGM_FI_.+", _exported(self.matchers), start, end, steps)
        where = f" matching {{{self.matchers}}}" if self.matchers else ""
        if not vllm and not sidecar:
            raise HistoryError(f"no vLLM series{where} in Prometheus at {redact_url(self.url)} between {start:.0f} and {end:.0f}: was vLLM scraped then?")
        self._one_server(vllm or sidecar)
        times = [start + i * self.limits.step_seconds for i in range(steps)]
        readings = list(self._vllm_readings(vllm, times, self._exported_max_num_seqs(seqs))) if vllm else []
        if not vllm:  # a sidecar whose vLLM Prometheus did not scrape: its GPU and host readings still judge those layers
            self.notes.append(f"no vLLM series{where}: only the sidecar's GPU and host readings are judged; the vLLM conditions are unknown")
        readings += self._sidecar_readings(sidecar, times)
        if not any(r.source == GPU_SOURCE for r in readings):
            readings += self._dcgm_readings(dcgm, times)
        if not any(r.source == GPU_SOURCE for r in readings):
            self.notes.append(
                "no GPU series: neither the sidecar's (vllm_triage_gpu_*) nor dcgm-exporter's (DCGM_FI_*) match the selector; the GPU conditions are unknown"
            )
        if not any(r.source == PROCESS_SOURCE for r in readings):
            self.notes.append("no host series: the sidecar did not run beside this vLLM (vllm_triage_process_*); the host conditions are unknown")
        readings.sort(key=lambda r: r.timestamp)
        return readings

    @staticmethod
    def _dcgm_readings(series: list[dict[str, Any]], times: list[float]) -> list[Reading]:
        by_time: dict[float, list[tuple[str, dict[str, str], float]]] = {}
        for s in series:
            metric = s["metric"]
            for t, value in s["values"]:
                by_time.setdefault(round(float(t), 3), []).append((metric["__name__"], metric, float(value)))
        readings = []
        for t in times:
            if found := by_time.get(round(t, 3)):
                samples, gpus = dcgm_readings(found)
                readings.append(Reading(GPU_SOURCE, t, True, samples, meta=GpuMeta(gpus=gpus, selection="dcgm-exporter's series in Prometheus")))
        return readings

    async def _range(self, session: aiohttp.ClientSession, names: str, matchers: str, start: float, end: float, steps: int) -> list[dict[str, Any]]:
        """The series named by the regex `names` (and `matchers`) from start to end; series the answer holds under other
        names are not used, and said."""
        query = _query(names, matchers)
        params = {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{self.limits.step_seconds:g}"}
        try:
            async with session.post(f"{self.url}/api/v1/query_range", data=params) as response:
                body = await read_bounded(response.content, self.limits.max_answer_bytes)
        except (aiohttp.ClientError, TimeoutError) as error:
            raise HistoryError(f"Prometheus at {redact_url(self.url)} did not answer: {http_failure(error)}") from None
        if body is None:
            limit = self.limits.max_answer_bytes // (1024 * 1024)
            raise HistoryError(f"Prometheus' answer is over {limit} MiB: narrow --selector to one server, use a larger --step or a shorter range")
        series, points = _count_before_decoding(body)
        if series > self.limits.max_series:
            raise HistoryError(f"{series} series match, over max {self.limits.max_series}: narrow --selector to one server")
        if points > series * steps + ANSWER_LISTS_MAX:
            raise HistoryError(f"Prometheus answered {points} points for {series} series of {steps} steps: not an answer to the query asked")
        if points > self._points_left:
            raise HistoryError(f"the history holds over {self.limits.max_points} points: use a larger --step or a shorter range")
        self._points_left -= points
        result = _result(body, self.url, f"the query {query[:200]}")
        if not isinstance(result, list) or not all(
            isinstance(s, dict) and isinstance(s.get("metric"), dict) and isinstance(s.get("values"), list) for s in result
        ):
            raise HistoryError(
                f"Prometheus at {redact_url(self.url)} answered in a shape that is not a query_range matrix (data.result: series of metric and values)"
            )
        found = [clean for series in result if (clean := _clean_series(series)) is not None]
        asked = re.compile(names)
        stray = [s for s in found if not asked.fullmatch(s["metric"].get("__name__", ""))]
        if stray:
            example = stray[0]["metric"].get("__name__", "a series without a name")[:80]
            self.notes.append(f"Prometheus answered {len(stray)} series its query did not ask for (e.g. {example!r}): not used")
        return [s for s in found if asked.fullmatch(s["metric"].get("__name__", ""))]

    @staticmethod
    def _exported_max_num_seqs(series: list[dict[str, Any]]) -> dict[float, int]:
        """The max_num_seqs the sidecar beside this vLLM exported, by time (its largest where several series answer)."""
        by_time: dict[float, int] = {}
        for s in series:
            for t, value in s["values"]:
                if math.isfinite(value) and 1 <= value <= MAX_NUM_SEQS_READ:
                    by_time[round(float(t), 3)] = max(by_time.get(round(float(t), 3), 0), int(value))
        return by_time

    @staticmethod
    def _one_server(series: list[dict[str, Any]]) -> None:
        targets = sorted({tuple(s["metric"].get(k, "") for k in ("namespace", "pod", "instance")) for s in series})
        if len(targets) > 1:
            shown = ", ".join("/".join(part for part in t if part) for t in targets[:5])
            raise HistoryError(f"the selector matches {len(targets)} vLLM servers ({shown}): add pod=... or instance=... to pick one")

    @staticmethod
    def _by_time(series: Iterable[dict[str, Any]], rename: bool) -> dict[float, dict[SeriesKey, float]]:
        by_time: dict[float, dict[SeriesKey, float]] = {}
        for s in series:
            metric = s["metric"]
            name = metric["__name__"]
            if rename:
                name, _ = _canonical(name)
            labels = make_labels({k: v for k, v in metric.items() if k not in TARGET_LABELS})
            for t, value in s["values"]:
                number = float(value)
                if math.isfinite(number):
                    by_time.setdefault(round(float(t), 3), {})[(name, labels)] = number
        return by_time

    def _vllm_readings(self, series: list[dict[str, Any]], times: list[float], max_num_seqs: dict[float, int]) -> Iterable[Reading]:
        by_time = self._by_time(series, rename=True)
        if not by_time:
            raise HistoryError(f"vLLM's series in Prometheus at {redact_url(self.url)} hold no number in the range (NaN or no points)")
        first = min(by_time)
        for t in times:
            samples = by_time.get(round(t, 3))
            if round(t, 3) < first:
                continue  # before vLLM's first sample in the range the history has not begun: no outage
            if samples:
                seqs = max_num_seqs.get(round(t, 3))
                yield Reading(VLLM_SOURCE, t, True, samples, meta=VllmMeta(exported_max_num_seqs=seqs) if seqs else VllmMeta())
            else:  # Prometheus marks a failed scrape's series stale: nothing at this step is an outage
                yield Reading(VLLM_SOURCE, t, False, error="no vLLM sample in Prometheus at this time (down, or not scraped)", error_reason="no_data")

    def _sidecar_readings(self, series: list[dict[str, Any]], times: list[float]) -> list[Reading]:
        by_source: dict[str, list[dict[str, Any]]] = {}
        prefixes = _latest_sources()
        for s in series:
            name = s["metric"]["__name__"]
            if name.startswith(_WINDOWED) or name.endswith("_created"):
                continue  # the sidecar's own windowed signals and counters' creation times are not readings
            source = next((src for prefix, src in prefixes.items() if name.startswith(prefix)), None)
            if source is not None:
                by_source.setdefault(source, []).append({**s, "metric": {**s["metric"], "__name__": name.removeprefix(EXPORTED_PREFIX)}})
        readings = []
        for source, found in by_source.items():
            by_time = self._by_time(found, rename=False)
            readings += [Reading(source, t, True, samples) for t in times if (samples := by_time.get(round(t, 3)))]
        return readings
