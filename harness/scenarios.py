"""The labelled scenario suite: a real vLLM (CPU build) at normal priority, driven through phases whose
truth is written here, watched by the real sidecar; every second the sidecar's verdicts are read and
afterwards each phase is scored per condition: detected or not, seconds to detect, seconds to clear,
false actives. `bench/scenarios.py` (make scenarios) runs them all at the default settings and prints the
table; tests/integration/test_scenarios.py runs the fault scenarios at short settings in CI.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil
from aiohttp import web

from . import vllm_server
from .components import FAST_CADENCE, FAST_CONDITIONS, Sidecar, start_load, start_sidecar
from .load import Phase as LoadPhase

# Conditions that may be active in a loaded phase without being its truth (latency follows load on a
# 2-core CPU build; the GPU and GIL sources have nothing to read here).
SYMPTOMS = frozenset({"ttft_high", "itl_high"})


@dataclass(frozen=True)
class Phase(LoadPhase):
    # at the phase's start, to the first vLLM: "kill" | "restart" | "stop_engine_core" (SIGSTOP) | "continue_engine_core"
    # | "kill_api_server" (SIGKILL to the API server alone: its engine core lives on)
    action: str | None = None
    truth: frozenset[str] = frozenset()  # conditions that must become active in this phase
    tolerated: frozenset[str] = frozenset()  # may be active too (not counted as false)


@dataclass(frozen=True)
class Scenario:
    name: str
    phases: tuple[Phase, ...]
    faults: tuple[float, float] | None = None  # (share of scrapes delayed past the timeout, share dropped)
    second_server: tuple[Phase, ...] | None = None  # another vLLM on the host with its own sidecar, its own phases
    what: str = ""
    max_num_seqs: int = vllm_server.MAX_NUM_SEQS  # the first vLLM's


SATURATE = {"clients": 64, "prompt_words": 200, "max_tokens": 300}
SATURATED = frozenset({"kv_cache_saturated", "queue_backlog", "preemption_storm"})
# The CPU build's 128-token blocks: 16 running requests leave ~64 tokens empty each, 20 % of a 40-block
# cache, which kv_fragmentation_suspected (cause block_waste) rightly reports while saturated.
SYMPTOMS_SATURATED = SYMPTOMS | {"kv_fragmentation_suspected"}

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("healthy", (Phase("steady", 240, clients=6, tolerated=SYMPTOMS),), what="6 clients of 16 sequences: nothing is wrong"),
    Scenario(
        "underload",
        (Phase("underload", 220, clients=2, truth=frozenset({"client_underload"})), Phase("idle", 90)),
        what="2 clients of 16 sequences, then none",
    ),
    Scenario(
        "saturation",
        (Phase("saturation", 200, **SATURATE, truth=SATURATED, tolerated=SYMPTOMS_SATURATED), Phase("recovery", 200)),
        what="64 clients on a 40-block cache, then none",
    ),
    Scenario(
        "flaky_scrapes",
        (Phase("underload", 240, clients=2, truth=frozenset({"client_underload"})),),
        faults=(0.15, 0.10),
        what="2 clients; a proxy delays 15 % of scrapes past the 5 s timeout and drops 10 %",
    ),
    Scenario(
        "restart",
        (
            Phase("saturation", 160, **SATURATE, truth=SATURATED, tolerated=SYMPTOMS_SATURATED),
            Phase("restarted", 200, **SATURATE, action="restart", truth=SATURATED, tolerated=SYMPTOMS_SATURATED | {"vllm_unreachable"}),
        ),
        what="64 clients; vLLM restarted mid-saturation (counters reset), the load goes on",
    ),
    Scenario(
        "two_servers",
        (Phase("saturation", 220, **SATURATE, truth=SATURATED, tolerated=SYMPTOMS_SATURATED),),
        second_server=(Phase("underload", 220, clients=2, truth=frozenset({"client_underload"})),),
        what="two vLLMs on one host, each with its own sidecar: one saturated, one underloaded",
    ),
    Scenario(
        "kv_thrash",
        (
            Phase("steady", 60, clients=6, tolerated=SYMPTOMS),
            Phase("thrash", 200, clients=128, prompt_words=250, max_tokens=500, truth=SATURATED, tolerated=SYMPTOMS_SATURATED),
            Phase("recovery", 200),
        ),
        max_num_seqs=128,
        what="max_num_seqs 128 on a 40-block cache, 128 clients: more admitted than fit, ~1.4 preemptions per finished request",
    ),
    Scenario(
        "engine_stopped",
        (
            Phase("steady", 60, clients=8, prompt_words=50, max_tokens=300, tolerated=SYMPTOMS),
            Phase("stopped", 60, clients=8, prompt_words=50, max_tokens=300, action="stop_engine_core", truth=frozenset({"engine_wedged"})),
            Phase("resumed", 90, clients=8, prompt_words=50, max_tokens=300, action="continue_engine_core", tolerated=SYMPTOMS),
        ),
        # 8 requests of ~370 tokens fit the 40-block cache (5120 tokens); of 1000 tokens they would saturate it (a first run did)
        what="8 clients; the engine core SIGSTOPped for 60 s (vLLM's /health stays 200), then continued",
    ),
    Scenario(
        "api_server_killed",
        (Phase("steady", 60, clients=6, tolerated=SYMPTOMS), Phase("killed", 60, action="kill_api_server", truth=frozenset({"vllm_unreachable"}))),
        what="6 clients, then the API server SIGKILLed alone: its engine core and worker live on",
    ),
    Scenario(
        "killed",
        (Phase("steady", 80, clients=6, tolerated=SYMPTOMS), Phase("killed", 60, action="kill", truth=frozenset({"vllm_unreachable"}))),
        what="6 clients, then vLLM killed",
    ),
)


@dataclass
class Timeline:
    """What one sidecar said, second by second: (time, active conditions)."""

    sidecar: Sidecar
    points: list[tuple[float, frozenset[str]]] = field(default_factory=list)
    # what the sidecar said when a condition became active: its cause and evidence, to explain a false active
    onsets: list[tuple[float, str, str]] = field(default_factory=list)

    def poll(self) -> None:
        try:
            active = frozenset(c for c, v in self.sidecar.active().items() if v == 1.0)
        except (OSError, AssertionError):
            return
        now = time.monotonic()
        came = active - (self.points[-1][1] if self.points else frozenset())
        self.points.append((now, active))
        if came:
            with suppress(OSError, AssertionError, ValueError):
                for verdict in self.sidecar.diagnosis()["conditions"]:
                    if verdict["condition"] in came:
                        said = "; ".join(e["text"] for e in verdict["evidence"])
                        self.onsets.append((now, verdict["condition"], f"cause {verdict.get('cause')}: {said}"))


@dataclass
class Score:
    scenario: str
    server: str
    phase: str
    condition: str
    detected_seconds: float | None  # from the phase's start; None: never active in it
    cleared_seconds: float | None  # after the phase ended; None: still active at the end or never
    false_active_seconds: float  # active when neither its truth nor tolerated


def score(scenario: str, server: str, phases: tuple[Phase, ...], starts: list[float], end: float, timeline: Timeline, clear_allowance: float) -> list[Score]:
    scores = []
    bounds = [*starts[1:], end]
    for index, (phase, start, stop) in enumerate(zip(phases, starts, bounds, strict=True)):
        during = [(t, a) for t, a in timeline.points if start <= t < stop]
        later = [(t, a) for t, a in timeline.points if t >= stop]
        for condition in sorted(phase.truth):
            first = next((t for t, a in during if condition in a), None)
            cleared = next((t for t, a in later if condition not in a), None) if first is not None and later else None
            detect = None if first is None else first - start
            scores.append(Score(scenario, server, phase.name, condition, detect, None if cleared is None else cleared - stop, 0.0))
        carried = phases[index - 1].truth | phases[index - 1].tolerated if index else frozenset()
        falses: dict[str, float] = {}
        for (t, active), (t_next, _) in zip(during, [*during[1:], (stop, frozenset())], strict=True):
            allowed = phase.truth | phase.tolerated | (carried if t - start < clear_allowance else frozenset())
            for condition in active - allowed:
                falses[condition] = falses.get(condition, 0.0) + (t_next - t)
        scores += [Score(scenario, server, phase.name, c, None, None, s) for c, s in sorted(falses.items())]
    return scores


class FaultyProxy:
    """Between the sidecar and vLLM's /metrics: delays a share of requests past the scrape timeout and
    drops another share (connection closed without an answer); passes the rest through."""

    def __init__(self, target: str, delayed: float, dropped: float, seed: int = 7) -> None:
        self.target, self.delayed, self.dropped = target, delayed, dropped
        self.random = random.Random(seed)
        self.port = vllm_server.free_port()
        self.counts = {"passed": 0, "delayed": 0, "dropped": 0}
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()
        self._ready.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        self._session = session = aiohttp.ClientSession()

        async def handle(request: web.Request) -> web.StreamResponse:
            draw = self.random.random()
            if draw < self.dropped:
                self.counts["dropped"] += 1
                assert request.transport is not None
                request.transport.close()
                return web.Response(status=500)
            if draw < self.dropped + self.delayed:
                self.counts["delayed"] += 1
                await asyncio.sleep(6.0)  # the sidecar gives up after 5 s
            else:
                self.counts["passed"] += 1
            async with session.get(self.target + request.path_qs) as response:
                return web.Response(status=response.status, body=await response.read(), content_type="text/plain")

        app = web.Application()
        app.router.add_get("/{tail:.*}", handle)
        self._runner = runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()

    async def _close(self) -> None:
        await self._runner.cleanup()
        await self._session.close()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)


def engine_core(server: vllm_server.VllmServer) -> int:
    return next(c.pid for c in psutil.Process(server.process.pid).children(recursive=True) if c.cmdline()[:1] == ["VLLM::EngineCore"])


@contextmanager
def running(name: str, tmp: Path, port: int | None = None, max_num_seqs: int = vllm_server.MAX_NUM_SEQS) -> Iterator[vllm_server.VllmServer]:
    server = vllm_server.start(tmp / f"{name}.log", port=port, niceness=0, max_num_seqs=max_num_seqs)
    group = server.process.pid
    try:
        yield server
    finally:
        with suppress(ProcessLookupError):
            os.killpg(group, signal.SIGCONT)  # a stopped engine core would not hear the SIGTERM
        server.stop()
        with suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)  # what outlived a killed API server


def sidecar_config(settings: str) -> str:
    return "log_level: warning\n" + (FAST_CADENCE + FAST_CONDITIONS + "  gpu_starved: {for_seconds: 3, clear_for_seconds: 5}\n" if settings == "short" else "")


@dataclass
class Result:
    scores: list[Score]
    discovery: dict[str, dict]  # each sidecar's /diagnosis discovery at the end: what it bound to
    notes: list[str]
    # per server: (seconds after the first phase started, condition, cause and evidence) when each became active
    onsets: dict[str, list[tuple[float, str, str]]] = field(default_factory=dict)


def run(scenario: Scenario, settings: str = "default", scale: float = 1.0) -> Result:
    """Run one scenario; `scale` shortens every phase (short settings need less time)."""
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        with running("vllm", tmp, max_num_seqs=scenario.max_num_seqs) as server:
            proxy = FaultyProxy(server.url, *scenario.faults) if scenario.faults else None
            (tmp / "a").mkdir()
            sidecar = start_sidecar(tmp / "a", proxy.url if proxy else server.url, sidecar_config(settings))
            others: list[tuple[str, tuple[Phase, ...], Timeline, vllm_server.VllmServer]] = []
            second = None
            try:
                if scenario.second_server:
                    second_ctx = running("vllm-b", tmp, max_num_seqs=32)
                    second = second_ctx.__enter__()
                    (tmp / "b").mkdir()
                    others.append(("b", scenario.second_server, Timeline(start_sidecar(tmp / "b", second.url, sidecar_config(settings))), second))
                timelines = [("a", scenario.phases, Timeline(sidecar), server), *others]
                starts: list[float] = []
                stop = threading.Event()

                def poll() -> None:
                    while not stop.is_set():
                        for _, _, timeline, _ in timelines:
                            timeline.poll()
                        time.sleep(1.0)

                poller = threading.Thread(target=poll, daemon=True)
                poller.start()
                loads = []
                for index, phase in enumerate(scenario.phases):
                    for load in loads:
                        load.stop()
                    loads = []
                    starts.append(time.monotonic())  # before the action: a restart's outage belongs to its phase
                    if phase.action == "kill":
                        server.kill()
                    elif phase.action in ("stop_engine_core", "continue_engine_core"):
                        os.kill(engine_core(server), signal.SIGSTOP if phase.action == "stop_engine_core" else signal.SIGCONT)
                    elif phase.action == "kill_api_server":
                        os.kill(server.process.pid, signal.SIGKILL)
                    elif phase.action == "restart":
                        server.kill()
                        restarted = vllm_server.start(tmp / "vllm-restarted.log", port=server.port, niceness=0)
                        server.process = restarted.process
                    if phase.clients:
                        loads.append(start_load(server.url, phase.clients, phase.prompt_words, phase.max_tokens))
                    for _, phases, _, other in others:  # the second server's phases run alongside, same lengths
                        if index < len(phases) and phases[index].clients:
                            loads.append(start_load(other.url, phases[index].clients, phases[index].prompt_words, phases[index].max_tokens))
                    time.sleep(phase.seconds * scale)
                for load in loads:
                    load.stop()
                end = time.monotonic()
                time.sleep(5)
                stop.set()
                poller.join()
                allowance = 200.0 if settings == "default" else 20.0  # a verdict of the previous phase may still clear
                scores = []
                for name, phases, timeline, _ in timelines:
                    scores += score(scenario.name, name, phases, starts[: len(phases)], end, timeline, allowance)
                discovery = {name: timeline.sidecar.diagnosis()["discovery"] for name, _, timeline, _ in timelines}
                notes = [f"proxy: {proxy.counts}"] if proxy else []
                onsets = {name: [(t - starts[0], c, said) for t, c, said in timeline.onsets] for name, _, timeline, _ in timelines}
                return Result(scores, discovery, notes, onsets)
            finally:
                for _, _, timeline, _ in others:
                    timeline.sidecar.process.kill()
                if second is not None:
                    second_ctx.__exit__(None, None, None)
                sidecar.process.kill()
                if proxy:
                    proxy.stop()
