"""vLLM's performance envelope per configuration: what it delivered at each load, kept across vLLM's restarts (and the
sidecar's own, in a state file), so that a change that made it slower is said with what changed and by how much
(regression_after_change).

A configuration is vLLM's command line (every flag, as the process source read it), its version and its cache config
(less what vLLM computes at each start, such as the number of KV blocks). A restart that changes none of them goes on
with the same envelope: a plain restart is never a change. Only what both sides of a comparison know is compared: a
configuration read without the process view (no flags) is not "changed" by the flags appearing.

Each tick adds one point: the requests in flight (running and waiting) over the last POINT_WINDOW_SECONDS, and per
request in flight the output tokens per second, with the inter-token latency and the time to first token. A point is
taken only over a window in which vLLM answered every scrape and did not restart. After a change, the newest
COMPARED_SECONDS of points of the new configuration are compared with the points of the configuration before it at a
matched load (in flight within MATCH_TOLERANCE, prompts of about the same length: traffic that changed with the configuration
is not blamed on it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import stat
import statistics
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .discovery import Discovery
from .model import PROCESS_SOURCE, VLLM_SOURCE
from .scope import AGGREGATE_SCOPE
from .signals.vllm import VLLM_SIGNALS
from .signals.window import ServerFacts, compute_signals, window
from .store import Store

log = logging.getLogger(__name__)

POINT_WINDOW_SECONDS = 30.0
# In seconds of ticks, so that a comparison waits as long at any tick_seconds (points are counted: idle ticks add none).
KEPT_SECONDS = 3600.0  # per configuration
CONFIGURATIONS_MAX = 4  # the newest ones; a rollback finds its old envelope
COMPARED_SECONDS = 60.0  # the newest points of the configuration in force
MATCH_SECONDS_MIN = 30.0  # on each side of a comparison
MATCH_TOLERANCE = 0.2  # loads within 20 % of each other are the same load
PROMPT_TOLERANCE = 0.3  # and prompts within 30 % of the same length: a longer prompt alone slows each request
# A full envelope (4 configurations of an hour) takes ~35 ms to write, on the thread that evaluates and renders: it is
# written every 5 minutes, at once when a change is seen, and when the sidecar stops.
SAVE_EVERY_SECONDS = 300.0
USUAL_AGE_SECONDS = POINT_WINDOW_SECONDS  # "usual": the points whose windows end before the newest one begins
STATE_VERSION = 1
STATE_BYTES_MAX = 16 * 2**20  # a full envelope is under 1 MB
# A process' start time read twice (psutil: boot time plus clock ticks) agrees within this.
START_TIME_TOLERANCE_SECONDS = 1.0
# cache_config_info labels vLLM computes at each start (the blocks its memory profile found room for): not a change.
COMPUTED_CACHE_LABELS = frozenset({"engine", "num_gpu_blocks", "num_cpu_blocks", "kv_cache_max_concurrency", "kv_cache_size_tokens", "_block_size_resolved"})
CHANGE_SIGNALS = (
    "vllm_change_throughput_ratio",
    "vllm_change_itl_ratio",
    "vllm_change_ttft_ratio",
    "vllm_change_load_requests",
    "vllm_change_seconds",
)
_POINT_SIGNALS = tuple(
    s
    for s in VLLM_SIGNALS
    if s.id
    in (
        "requests_running_mean",
        "requests_waiting_mean",
        "generation_tokens_per_second",
        "inter_token_latency_seconds_mean",
        "ttft_seconds_mean",
        "prompt_tokens_mean",
    )
)

# After a change: (its newest points, the points before it at their load and prompt length, that load).
MATCH = tuple[list["Point"], list["Point"], float]
Identity = dict[str, str]  # "flag --max-num-seqs" / "version" / "cache block_size" -> value


@dataclass(frozen=True)
class Point:
    at: float
    in_flight: float
    tokens_per_second_per_request: float
    itl_seconds: float | None
    ttft_seconds: float | None
    prompt_tokens: float | None = None  # mean of the requests finished in the window


@dataclass
class Configuration:
    identity: Identity
    first_seen: float
    points: deque[Point] = field(default_factory=deque)  # the envelope bounds it: KEPT_SECONDS of its ticks


def _kind(key: str) -> str:
    return key.split(" ", 1)[0]


def differences(before: Identity, after: Identity) -> list[str]:
    """What changed from `before` to `after`, in words, over the kinds both know ("--enforce-eager added",
    "--max-num-seqs 256 -> 8", "vLLM 0.25.1 -> 0.26.0")."""
    common = {_kind(k) for k in before} & {_kind(k) for k in after}
    said = []
    for key in sorted({k for k in (*before, *after) if _kind(k) in common}):
        old, new = before.get(key), after.get(key)
        if old == new:
            continue
        kind, _, name = key.partition(" ")
        what = {"flag": name, "version": "vLLM", "cache": f"cache config {name}"}[kind]
        if old is None:
            said.append(f"{what} added" + (f" ({new})" if new else ""))
        elif new is None:
            said.append(f"{what} removed" + (f" (was {old})" if old else ""))
        else:
            said.append(f"{what} {old or '(set)'} -> {new or '(set)'}")
    return said


def identity_of(store: Store, discovery: Discovery) -> Identity | None:
    """The configuration vLLM serves with now, from what the sources read; None while vLLM does not answer."""
    latest = store.latest(VLLM_SOURCE)
    if latest is None or not latest.ok:
        return None
    identity: Identity = {}
    if discovery.vllm_version:
        identity["version"] = discovery.vllm_version
    flags = discovery.api_server_flags or {f"--{k.replace('_', '-')}": "" if v is True else str(v) for k, v in discovery.api_server_args.items()}
    identity.update({f"flag {name}": value for name, value in flags.items()})
    for (name, labels), _ in latest.samples.items():
        if name == "vllm:cache_config_info":
            identity.update({f"cache {k}": v for k, v in labels if k not in COMPUTED_CACHE_LABELS})
            break
    return identity


class Envelope:
    def __init__(self, path: str | None, tick_seconds: float) -> None:
        self.path = Path(path) if path else None
        self.points_max = round(KEPT_SECONDS / tick_seconds)
        self.compared_points = max(1, round(COMPARED_SECONDS / tick_seconds))
        self.match_points_min = max(1, round(MATCH_SECONDS_MIN / tick_seconds))
        self.configurations: list[Configuration] = []  # oldest first; the last is in force
        self.changed_at: float | None = None  # when the configuration in force was first seen after another
        self.clean_since = math.inf  # the windows after this hold no outage and no restart
        self._api_server_pid: int | None = None
        self._saved_at = -math.inf
        self._unwritable = False
        # vLLM's newest answer in this sidecar's life, and the API server (pid, start time) that gave it; and what the
        # state file said of the last one before this sidecar started, until it is recalled (Envelope.recall).
        self._answer: tuple[float, tuple[int, float] | None] | None = None
        self.answered_before: tuple[float, tuple[int, float] | None] | None = None
        self.served_models: tuple[str, ...] = ()  # the last model names vLLM was seen serving (its processes or its page)
        if self.path is not None:
            self._load()

    # ---------------------------------------------------------------- per tick

    def observe(self, store: Store, discovery: Discovery, now: float) -> None:
        latest = store.latest(VLLM_SOURCE)
        if discovery.served_models and discovery.served_models != self.served_models:
            self.served_models = discovery.served_models
            self._saved_at = -math.inf  # which model this pod serves is kept at once: its outage still counts for that model
        if latest is not None and latest.ok:
            first = self._answer is None
            self._answer = (latest.timestamp, _api_server(store))
            if first:
                self._saved_at = -math.inf  # that vLLM answered is kept at once: a restart during an outage recalls it
        pid = next((p["pid"] for p in discovery.processes if p.get("role") == "api_server"), None)
        restarted = pid is not None and self._api_server_pid is not None and pid != self._api_server_pid
        self._api_server_pid = pid if pid is not None else self._api_server_pid
        identity = identity_of(store, discovery)
        if latest is None or not latest.ok or identity is None or restarted:
            self.clean_since = math.inf
            self._save_when_due(now)
            return
        if self.clean_since == math.inf:
            self.clean_since = now
        self._in_force(identity, now)
        if now - POINT_WINDOW_SECONDS >= self.clean_since:
            point = self._point(store, now)
            if point is not None:
                self.configurations[-1].points.append(point)
        self._save_when_due(now)

    def _save_when_due(self, now: float) -> None:
        if self.path is not None and now - self._saved_at >= SAVE_EVERY_SECONDS:
            self._saved_at = now
            self.save()

    def recall(self, store: Store, processes_read: bool) -> float | None:
        """When vLLM last answered before this sidecar started, as the state file kept it, where that still holds: the
        API server that answered is the one running now, or none runs (it is gone: an outage). A sidecar restarted in an
        outage then judges an outage, not a start that would mute the page for the start-up budget and page again after
        it. Asked while vLLM has not answered in this sidecar's life; decided once, when the host view has read (where
        `processes_read` says it will)."""
        if self.answered_before is None or (processes_read and store.latest(PROCESS_SOURCE) is None):
            return None
        (at, server), self.answered_before = self.answered_before, None
        now_server = _api_server(store)
        if server is not None and now_server is not None and (server[0] != now_server[0] or abs(server[1] - now_server[1]) > START_TIME_TOLERANCE_SECONDS):
            log.info("vLLM answered before this sidecar started, but its API server is another process now (pid %d): it is starting", now_server[0])
            return None
        log.info("vLLM last answered before this sidecar started (the state file %s): judged as an outage, not a start", self.path)
        return at

    def _in_force(self, identity: Identity, now: float) -> None:
        current = self.configurations[-1] if self.configurations else None
        if current is not None and not differences(current.identity, identity):
            current.identity.update(identity)  # a kind read now that was not before (the process view came)
            return
        known = next((c for c in self.configurations if not differences(c.identity, identity)), None)
        if known is not None:  # a rollback: its envelope goes on
            self.configurations.remove(known)
            known.identity.update(identity)
        self.configurations.append(known or Configuration(dict(identity), now, deque(maxlen=self.points_max)))
        del self.configurations[:-CONFIGURATIONS_MAX]
        if current is not None:
            self.changed_at = now
            self._saved_at = -math.inf  # what was before the change is kept at once
            log.info("vLLM's configuration changed: %s", "; ".join(differences(current.identity, identity)))

    @staticmethod
    def _point(store: Store, now: float) -> Point | None:
        values = compute_signals(window(store, VLLM_SOURCE, now, POINT_WINDOW_SECONDS), AGGREGATE_SCOPE, ServerFacts(), _POINT_SIGNALS)
        running, waiting, tokens = values["requests_running_mean"], values["requests_waiting_mean"], values["generation_tokens_per_second"]
        if running is None or tokens is None:
            return None
        in_flight = running + (waiting or 0.0)
        if in_flight < 1.0:
            return None  # idle: no load to match
        return Point(now, in_flight, tokens / in_flight, values["inter_token_latency_seconds_mean"], values["ttft_seconds_mean"], values["prompt_tokens_mean"])

    # ---------------------------------------------------------------- what the judge reads

    def judged(self, now: float, notes: frozenset[str]) -> tuple[dict[str, float | None], tuple[str, ...], tuple[str, ...]]:
        """This tick's global signals, and the "change" and "usual" notes where a condition wants them (Condition.notes):
        the match after a change is made once for both."""
        matched = self.matched()
        change = self.notes(matched) if "change" in notes else ()
        return self.signals(now, matched), change, self.usual_notes(now) if "usual" in notes else ()

    def signals(self, now: float, matched: MATCH | None = None) -> dict[str, float | None]:
        values: dict[str, float | None] = dict.fromkeys(CHANGE_SIGNALS)
        if self.changed_at is not None and len(self.configurations) >= 2:
            values["vllm_change_seconds"] = max(0.0, now - self.changed_at)
        found = self.comparison(matched)
        if found is not None:
            keys = ("vllm_change_load_requests", "vllm_change_throughput_ratio", "vllm_change_itl_ratio", "vllm_change_ttft_ratio")
            values.update(zip(keys, found, strict=True))
        return values

    def matched(self) -> MATCH | None:
        """(the newest points after the change, the points before it at their load and prompt length, that load), or
        None where no change was seen or the two do not share a load yet."""
        if self.changed_at is None or len(self.configurations) < 2:
            return None
        after = [p for p in self.configurations[-1].points if p.at >= self.changed_at][-self.compared_points :]
        if len(after) < self.match_points_min:
            return None
        load = statistics.median(p.in_flight for p in after)
        prompts = [p.prompt_tokens for p in after if p.prompt_tokens is not None]
        prompt = statistics.median(prompts) if prompts else None
        before = [p for p in self.configurations[-2].points if _alike(p, load, prompt)]
        return (after, before, load) if len(before) >= self.match_points_min else None

    def comparison(self, matched: MATCH | None = None) -> tuple[float, float, float | None, float | None] | None:
        """(the matched load, and after / before at it: output tokens per second per request in flight, ITL, TTFT), or
        None where there is nothing to compare yet (`matched`: this tick's, where made already)."""
        found = matched or self.matched()
        if found is None:
            return None
        after, before, load = found

        def ratio(pick: Any) -> float | None:
            new, old = [v for p in after if (v := pick(p)) is not None], [v for p in before if (v := pick(p)) is not None]
            if len(new) < self.match_points_min or len(old) < self.match_points_min or statistics.median(old) <= 0:
                return None
            return float(statistics.median(new) / statistics.median(old))

        throughput = ratio(lambda p: p.tokens_per_second_per_request)
        if throughput is None:
            return None
        return load, throughput, ratio(lambda p: p.itl_seconds), ratio(lambda p: p.ttft_seconds)

    def against_usual(self, now: float) -> tuple[float, float, float | None] | None:
        """(load, and now / usual at it: output tokens per second per request in flight, ITL): this tick's point against
        the points of the same configuration at least USUAL_AGE_SECONDS older at its load and prompt length; None
        without a point now or enough of them."""
        points = self.configurations[-1].points if self.configurations else ()
        if not points or points[-1].at != now:
            return None
        newest = points[-1]
        usual = [p for p in points if p.at <= now - USUAL_AGE_SECONDS and _alike(p, newest.in_flight, newest.prompt_tokens)]
        if len(usual) < self.match_points_min:
            return None
        throughput = statistics.median(p.tokens_per_second_per_request for p in usual)
        itls = [p.itl_seconds for p in usual if p.itl_seconds is not None]
        itl = newest.itl_seconds / statistics.median(itls) if itls and newest.itl_seconds is not None and statistics.median(itls) > 0 else None
        return newest.in_flight, newest.tokens_per_second_per_request / throughput if throughput > 0 else math.inf, itl

    def usual_notes(self, now: float) -> tuple[str, ...]:
        """What vLLM delivers now against what this configuration usually gives at the same load (what another program
        on its GPU costs it)."""
        found = self.against_usual(now)
        if found is None:
            return ()
        load, throughput, itl = found
        itl_text = f"inter-token latency {itl:.2f}x and " if itl is not None else ""
        return (
            f"vLLM now: {itl_text}output tokens per second per request {throughput:.2f}x what this configuration usually gives at {load:.0f} "
            f"requests in flight (the last {POINT_WINDOW_SECONDS:.0f} s against its envelope)",
        )

    def notes(self, matched: MATCH | None = None) -> tuple[str, ...]:
        """What changed, when, and what the sidecar compared, for the verdict's evidence."""
        if self.changed_at is None or len(self.configurations) < 2:
            kept = f"kept in {self.path}" if self.path else "kept in memory only: a change made while the sidecar restarts (a pod's rollout) is not seen"
            return (f"no change of vLLM's configuration seen; its envelope is {kept}",)
        before, after = self.configurations[-2], self.configurations[-1]
        changed = "; ".join(differences(before.identity, after.identity)) or "a configuration the sidecar cannot tell apart"
        at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.changed_at))
        shown = [f"changed at {at}: {changed}"]
        found = matched or self.matched()
        if found is not None:
            new, old, load = found
            shown.append(
                f"at {load:.1f} requests in flight: {statistics.median(p.tokens_per_second_per_request for p in new):.2f} output tokens per second "
                f"per request after the change, {statistics.median(p.tokens_per_second_per_request for p in old):.2f} before "
                f"({len(old)} points before it at that load and prompt length, the newest {len(new)} after)"
            )
        return tuple(shown)

    # ---------------------------------------------------------------- across the sidecar's restarts

    def save(self) -> None:
        """Into the state file, where one is set (every SAVE_EVERY_SECONDS, when a change is seen, and when the sidecar
        stops)."""
        if self.path is None:
            return
        state: dict[str, Any] = {
            "version": STATE_VERSION,
            "changed_at": self.changed_at,
            "configurations": [{"identity": c.identity, "first_seen": c.first_seen, "points": [_row(p) for p in c.points]} for c in self.configurations],
        }
        if self.served_models:
            state["served_models"] = list(self.served_models)
        if answer := self._answer or self.answered_before:
            state["answered"] = {"at": answer[0], "api_server": None if answer[1] is None else list(answer[1])}
        written: str | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=self.path.parent, prefix=".envelope-", delete=False) as out:
                written = out.name
                json.dump(state, out)
            os.replace(out.name, self.path)
            self._unwritable = False
        except OSError as error:
            if written is not None:  # a full volume keeps no half-written copy
                with contextlib.suppress(OSError):
                    os.unlink(written)
            if not self._unwritable:  # said once, not every minute
                log.warning("cannot write vLLM's envelope to %s (%s): it is kept in memory only until it can", self.path, error)
            self._unwritable = True

    def _load(self) -> None:
        assert self.path is not None
        try:
            found = os.stat(self.path)
            if not stat.S_ISREG(found.st_mode):  # a FIFO would block the read, a device has no end
                raise OSError(f"not a regular file (mode {stat.filemode(found.st_mode)})")
            if found.st_size > STATE_BYTES_MAX:
                raise OSError(f"{found.st_size} bytes, over the {STATE_BYTES_MAX} an envelope takes")
            state = json.loads(self.path.read_text())
        except FileNotFoundError:
            log.info("no envelope in %s yet: it starts now", self.path)
            return
        except (OSError, ValueError) as error:
            log.warning("vLLM's envelope in %s cannot be read (%s): it starts again now", self.path, error)
            return
        try:
            if state.get("version") != STATE_VERSION:
                raise ValueError(f"state version {state.get('version')!r}, not {STATE_VERSION}")
            configurations = []
            for c in state["configurations"][-CONFIGURATIONS_MAX:]:
                identity = {str(k): str(v) for k, v in dict(c["identity"]).items()}
                kept = c["points"][-self.points_max :]
                points = deque(
                    (Point(_time(a), _amount(n), _amount(t), *(None if v is None else _amount(v) for v in rest)) for a, n, t, *rest in kept),
                    maxlen=self.points_max,
                )
                configurations.append(Configuration(identity, _time(c["first_seen"]), points))
            changed_at = None if state.get("changed_at") is None else _time(state["changed_at"])
            served = tuple(str(name)[:256] for name in state.get("served_models", ()))[:8]
            answered_before = None
            if answered := state.get("answered"):
                server = answered.get("api_server")
                answered_before = (_time(answered["at"]), None if server is None else (int(_amount(server[0])), _time(server[1])))
        except (AttributeError, KeyError, TypeError, ValueError) as error:
            log.warning("vLLM's envelope in %s is not one this sidecar wrote (%s): it starts again now", self.path, error)
            return
        self.configurations, self.changed_at = configurations, changed_at
        self.served_models, self.answered_before = served, answered_before
        log.info("vLLM's envelope read from %s: %d configurations", self.path, len(configurations))


def _api_server(store: Store) -> tuple[int, float] | None:
    """The API server the host view watches: (pid, start time), which names one process whatever reuses the pid."""
    latest = store.latest(PROCESS_SOURCE)
    if latest is None or not latest.ok:
        return None
    pid, started = latest.process_meta().get("api_server_pid"), latest.api_server_started()
    return None if pid is None or started is None else (int(pid), float(started))


def _alike(point: Point, load: float, prompt: float | None) -> bool:
    """At `load` requests in flight (within MATCH_TOLERANCE) and of `prompt` tokens (within PROMPT_TOLERANCE; any where
    unknown)."""
    same_load = abs(point.in_flight - load) <= MATCH_TOLERANCE * load
    return same_load and (prompt is None or (point.prompt_tokens is not None and abs(point.prompt_tokens - prompt) <= PROMPT_TOLERANCE * prompt))


def _row(point: Point) -> list[float | None]:
    return [point.at, point.in_flight, point.tokens_per_second_per_request, point.itl_seconds, point.ttft_seconds, point.prompt_tokens]


TIME_MAX = 2.0**33  # seconds since 1970: the year 2242; a time past it (1e300) or NaN is no time this sidecar wrote
AMOUNT_MAX = 1e12


def _time(value: Any) -> float:
    number = float(value)
    if not (math.isfinite(number) and 0.0 <= number <= TIME_MAX):
        raise ValueError(f"{value!r} is no time")
    return number


def _amount(value: Any) -> float:
    number = float(value)
    if not (math.isfinite(number) and 0.0 <= number <= AMOUNT_MAX):
        raise ValueError(f"{value!r} is no count, rate or duration")
    return number
