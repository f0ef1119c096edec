"""Layer 3 (host): who holds the GIL in vLLM's engine core and API server, sampled with py-spy.

py-spy has no streaming mode, so the source runs short windows: `py-spy record --gil --format raw`
for `window_seconds` at `rate` Hz against one process at a time. With --gil py-spy keeps only the
samples in which some thread held the GIL, so held ratio = samples / (rate x window) — validated
against processes with a known GIL duty cycle (tests/unit/test_gil.py, bench/gil_accuracy.py).
In nonblocking mode py-spy reads the stack of a process that keeps running: it only walks a stack when a
thread holds the GIL, and that read fails when the stack changes under it (vLLM's engine core loop, a
quarter to half of the held samples of a target with a busy stack), so a failed sample counts as held:
held ratio = (samples + errors) / (rate x window). The read errors' share is exported beside it.
Nonblocking is the default: on the H200 it read the real engine's GIL share as blocking did (within 0.07)
without pausing it (docs/measurements.md).
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from ..catalog import GilOptions
from ..model import GIL_SOURCE, ProcessTargets, Reading, SeriesKey, make_labels
from . import Clock, SourceLoop

if TYPE_CHECKING:
    from ..config import Config

log = logging.getLogger(__name__)

SAMPLES = re.compile(r"Samples: (\d+) Errors: (\d+)")
FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")
NO_PERMISSION_FIX = (
    "py-spy may not trace vLLM: run the sidecar as root or with CAP_SYS_PTRACE, and in Kubernetes set "
    "shareProcessNamespace: true and add SYS_PTRACE to the sidecar's capabilities (profiler.enabled in the chart)"
)


def find_py_spy() -> str | None:
    """py-spy installed beside this Python (the package's own dependency, venv or not), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _kill(process: asyncio.subprocess.Process) -> None:
    """Kill py-spy if it still runs; it may have exited on its own a moment ago."""
    if process.returncode is None:
        try:
            process.kill()
        except ProcessLookupError:
            pass


def hot_functions(raw: str, top: int) -> list[tuple[str, str, int]]:
    """(function, file, samples) of the innermost frames in py-spy's raw output, busiest first."""
    counts: Counter[tuple[str, str]] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        innermost = stack.split(";")[-1]
        match = FRAME.match(innermost)
        function, file = (match["function"], Path(match["file"]).name) if match else (innermost, "")
        counts[(function, file)] += int(count)
    return [(function, file, n) for (function, file), n in counts.most_common(top)]


DUMP_TIMEOUT_SECONDS = 15.0
MAX_DUMP_CHARS = 20_000

# Where a process' main thread waits, from the functions and files of its stack (innermost first, the first frame
# that matches any place decides): vLLM's names for its waits, torch's and its libraries'.
STUCK_PLACES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("gpu_sync", re.compile(r"synchroniz|_to_list \(|tolist|\bitem \(|_bookkeeping_sync|wait_stream|event_sync", re.I)),
    ("collective", re.compile(r"all_reduce|all_gather|reduce_scatter|all_to_all|broadcast|barrier|nccl|torch/distributed", re.I)),
    ("grammar_compilation", re.compile(r"xgrammar|outlines|guidance|grammar", re.I)),
    ("waiting_for_requests", re.compile(r"_process_input_queue|input_queue|get \(queue\.py", re.I)),
    ("ipc_wait", re.compile(r"zmq|recv_multipart|shm_broadcast|MessageQueue|dequeue|acquire_read", re.I)),
)
THREAD = re.compile(r'^Thread (?P<tid>\d+) \((?P<state>[^)]*)\): "(?P<name>[^"]*)"')


def where_stuck(stacks: str) -> tuple[str, str] | None:
    """(place, frame) of the main thread in a `py-spy dump`: the first frame from the innermost out that names a
    known wait (STUCK_PLACES); None when none does (or the dump has no main thread)."""
    frames: list[str] = []
    main = False
    for line in stacks.splitlines():
        header = THREAD.match(line)
        if header is not None:
            if main:
                break
            main = header["name"] == "MainThread"
        elif main and line.startswith("    ") and line.strip():
            frames.append(line.strip())
    for frame in frames:
        for place, pattern in STUCK_PLACES:
            if pattern.search(frame):
                return place, frame
    return None


async def dump_stacks(pid: int, py_spy: str | None = None) -> dict[str, str]:
    """Every thread's Python stack of one process, once (`py-spy dump --nonblocking`: it reads the process'
    memory without pausing it, so it works on a stopped process too): {"stacks": text} or {"error": why}."""
    py_spy = py_spy or find_py_spy()
    if py_spy is None:
        return {"error": "py-spy is not installed (pip install py-spy)"}
    try:
        process = await asyncio.create_subprocess_exec(
            py_spy, "dump", "--pid", str(pid), "--nonblocking", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
    except OSError as error:
        return {"error": f"{py_spy} could not start: {error}"}
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout=DUMP_TIMEOUT_SECONDS)
    except asyncio.TimeoutError:
        _kill(process)
        return {"error": f"py-spy dump of pid {pid} did not finish in {DUMP_TIMEOUT_SECONDS:.0f} s"}
    except BaseException:
        _kill(process)
        raise
    text = output.decode(errors="replace").strip()
    if process.returncode != 0:
        if "ermission" in text or "not permitted" in text:
            return {"error": NO_PERMISSION_FIX}
        return {"error": f"py-spy dump of pid {pid} failed: {text[-300:]}"}
    return {"stacks": text[:MAX_DUMP_CHARS]}


class GilSource:
    def __init__(
        self,
        targets: ProcessTargets,
        window_seconds: float = 5.0,
        rate: int = 20,
        nonblocking: bool = True,
        top: int = 5,
        clock: Callable[[], float] = time.time,
        py_spy: str | None = None,
    ) -> None:
        self.targets = targets
        self.window_seconds = window_seconds
        self.rate = rate
        self.nonblocking = nonblocking
        self.top = top
        self.clock = clock
        self.py_spy = py_spy or find_py_spy()
        self._last_state: str | None = None
        self._running: set[asyncio.subprocess.Process] = set()

    async def close(self) -> None:
        for process in list(self._running):
            _kill(process)

    async def collect(self) -> Reading:
        """One window per role (engine core, then API server), one py-spy at a time."""
        start = time.perf_counter()
        timestamp = self.clock()
        samples: dict[SeriesKey, float] = {}
        problems: list[tuple[str, str]] = []
        sampled = {role: pid for role, pid in self.targets.first_by_role().items() if role in ("engine_core", "api_server")}
        if self.py_spy is None:
            problems.append(("no_py_spy", "py-spy is not installed (pip install py-spy): GIL sampling is off"))
        elif not sampled:
            problems.append(("no_target", "no vLLM engine core or API server visible: is the process namespace shared?"))
        else:
            for role, pid in sorted(sampled.items(), key=lambda item: item[0] != "engine_core"):
                problem = await self._window(role, pid, samples)
                if problem:
                    problems.append(problem)
        ok = not problems or bool(samples)
        reading = Reading(
            GIL_SOURCE,
            timestamp,
            ok,
            samples,
            error="; ".join(text for _, text in problems) or None,
            error_reason=problems[0][0] if problems else None,
            duration_seconds=time.perf_counter() - start,
        )
        state = reading.error_reason or "ok"
        if state != self._last_state:
            (log.info if state == "ok" else log.warning)("GIL source: %s", reading.error or f"sampling {', '.join(sampled)}")
            self._last_state = state
        return reading

    async def _window(self, role: str, pid: int, out: dict[SeriesKey, float]) -> tuple[str, str] | None:
        assert self.py_spy is not None
        with tempfile.TemporaryDirectory() as tmp:
            raw_path = Path(tmp) / "raw.txt"
            command = [self.py_spy, "record", "--pid", str(pid), "--rate", str(self.rate), "--duration", f"{self.window_seconds:g}"]
            command += ["--format", "raw", "--gil", "--output", str(raw_path)]
            if self.nonblocking:
                command.append("--nonblocking")
            try:
                process = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
            except PermissionError:
                # The image's py-spy carries the cap_sys_ptrace file capability: without SYS_PTRACE in the
                # container's bounding set the kernel refuses to start it at all.
                return ("no_permission", f"{self.py_spy} may not run (execve: permission denied): {NO_PERMISSION_FIX}")
            except OSError as error:
                return ("py_spy_failed", f"{self.py_spy} could not start: {error}")
            self._running.add(process)
            try:
                output, _ = await asyncio.wait_for(process.communicate(), timeout=self.window_seconds + 15)
            except asyncio.TimeoutError:
                _kill(process)
                return ("timeout", f"py-spy on the {role} (pid {pid}) did not finish")
            except BaseException:
                _kill(process)  # cancelled (shutdown): a py-spy left running would go on pausing vLLM
                raise
            finally:
                self._running.discard(process)
            text = output.decode(errors="replace")
            counted = SAMPLES.search(text)
            if process.returncode != 0 or counted is None:
                if "ermission" in text or "not permitted" in text:
                    return ("no_permission", NO_PERMISSION_FIX)
                if "No such process" in text or not _alive(pid):
                    return ("target_gone", f"the {role} (pid {pid}) exited while sampled")
                lines = text.strip().splitlines()
                # py-spy prints `Error: ...` and then a stack backtrace of its own: the error is the news
                first_error = next((line.strip() for line in lines if line.lstrip().startswith("Error")), None)
                said = first_error or (lines[-1].strip() if lines else f"exit {process.returncode}")
                if "Failed to find python" in said:
                    return ("not_python", f"the {role} (pid {pid}) is titled like vLLM but py-spy finds no Python in it: {said[:200]}")
                return ("py_spy_failed", f"py-spy on the {role} (pid {pid}): {said[:200]}")
            if not _alive(pid):  # py-spy stops quietly when its target exits: a partial window, not a ratio
                return ("target_gone", f"the {role} (pid {pid}) exited while sampled")
            raw = raw_path.read_text() if raw_path.exists() else ""
        ticks = self.rate * self.window_seconds
        labels = make_labels({"role": role})
        held, failed = int(counted.group(1)), int(counted.group(2))
        out[("gil_held_ratio", labels)] = min(1.0, (held + failed if self.nonblocking else held) / ticks)
        out[("gil_failed_sample_ratio", labels)] = min(1.0, failed / ticks)
        for function, file, count in hot_functions(raw, self.top):
            out[("gil_hot_function_ratio", make_labels({"role": role, "function": function[:120], "file": file}))] = count / ticks
        return None


def build(config: Config, clock: Clock, targets: ProcessTargets) -> SourceLoop:
    """A py-spy window on the engine core and the API server every gil_interval_seconds."""
    options = config.options(GilOptions)
    source = GilSource(targets, options.gil_window_seconds, options.gil_rate, options.gil_nonblocking, clock=clock)
    return SourceLoop(GIL_SOURCE, options.gil_interval_seconds, source.collect, source.close)
