"""Layer 3 (host): find the vLLM processes visible to the sidecar, read their command line, and
sample their CPU (per process and busiest thread), memory, threads and container throttling.

In Kubernetes the sidecar sees vLLM's processes only when the pod shares its process namespace;
when it does not, this source reports an empty list and discovery falls back to defaults.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import psutil

from ..catalog import ProcessOptions
from ..cpu_account import CPU
from ..model import PROCESS_SOURCE, LostWorker, OrphanEntry, ProcessEntry, ProcessMeta, Reading, SeriesKey, ThreadSample, make_labels
from ..options import SECRET_NAME, redact_value
from . import Clock, SourceLoop, nothing_to_close

if TYPE_CHECKING:
    from ..config import Config
    from ..model import ProcessTargets

log = logging.getLogger(__name__)

# Command-line flags that other layers use, and the range a value must lie in to be believed: the command
# line is the monitored host's data, not the sidecar's trust (a 400-digit --max-num-seqs once overflowed
# every evaluation). A value outside it is logged once and ignored, as an absent flag is.
COUNT_MAX = 2**20
FLAGS: dict[str, tuple[type, float, float]] = {
    "--max-num-seqs": (int, 1, COUNT_MAX),
    "--max-num-batched-tokens": (int, 1, 2**31),
    "--tensor-parallel-size": (int, 1, 4096),
    "-tp": (int, 1, 4096),
    "--data-parallel-size": (int, 1, 4096),
    "--api-server-count": (int, 1, 4096),
    "--port": (int, 1, 65535),
    "--block-size": (int, 1, COUNT_MAX),
    "--max-model-len": (int, 1, 2**31),
    "--served-model-name": (str, 0, 0),
    "--model": (str, 0, 0),
    "--gpu-memory-utilization": (float, 0.0, 1.0),
}
TEXT_VALUE_MAX = 256  # a model name or path longer than this is cut (argv can be megabytes)
_refused: set[str] = set()  # flag=value already logged as out of range
BOOLEAN_FLAGS = ("--enable-prefix-caching", "--no-enable-prefix-caching", "--enforce-eager", "--async-scheduling")


MAX_FLAGS = 128  # of one command line, kept for what changed between two of vLLM's starts


def command_line_flags(cmdline: list[str]) -> dict[str, str]:
    """Every `--flag` of a vLLM command line with its value as written ("" for a flag given alone), secrets redacted:
    what a change between two starts of vLLM is told by (regression_after_change)."""
    flags: dict[str, str] = {}
    tokens, i = cmdline[1:], 0
    while i < len(tokens) and len(flags) < MAX_FLAGS:
        name, equals, value = tokens[i].partition("=")
        i += 1
        if not name.startswith("--"):
            continue
        if not equals and i < len(tokens) and not tokens[i].startswith("--"):
            value, i = tokens[i], i + 1
        # a flag whose name says its value is a secret (--api-key, --hf-token) is kept without its value; any other value
        # without the credentials it may carry (a URL's password, a signed URL, a JSON config's token)
        flags[name[:64]] = "(redacted)" if value and SECRET_NAME.search(name) else redact_value(value[:TEXT_VALUE_MAX])
    return flags


def parse_vllm_args(cmdline: list[str]) -> dict[str, Any]:
    """The flags above from a vLLM command line, keyed without dashes (`max_num_seqs`)."""
    args: dict[str, Any] = {}
    i = 0
    while i < len(cmdline):
        token = cmdline[i]
        flag, _, inline = token.partition("=")
        if flag in FLAGS:
            raw = inline if inline else (cmdline[i + 1] if i + 1 < len(cmdline) else None)
            if not inline:
                i += 1
            if raw is not None:
                key = "tensor_parallel_size" if flag == "-tp" else flag.lstrip("-").replace("-", "_")
                value = _bounded_value(flag, raw)
                if value is not None:
                    args[key] = value
        elif flag in BOOLEAN_FLAGS:
            args[flag.lstrip("-").replace("-", "_")] = True
        i += 1
    # `vllm serve MODEL` puts the model positionally.
    if "serve" in cmdline and "model" not in args:
        position = cmdline.index("serve") + 1
        if position < len(cmdline) and not cmdline[position].startswith("-"):
            args["model"] = redact_value(cmdline[position][:TEXT_VALUE_MAX])
    return args


def _bounded_value(flag: str, raw: str) -> Any:
    kind, low, high = FLAGS[flag]
    if kind is str:
        return redact_value(raw[:TEXT_VALUE_MAX])
    text = raw[:32]
    try:
        value = kind(text) if len(raw) <= 32 else None
    except ValueError:
        value = None
    if value is not None and low <= value <= high and not (kind is float and math.isnan(value)):
        return value
    if f"{flag}={text}" not in _refused and len(_refused) < 64:
        _refused.add(f"{flag}={text}")
        shown = text + ("..." if len(raw) > 32 else "")
        log.warning("vLLM command line: %s %s is not a number in %s..%s; ignored (as if it were not given)", flag, shown, kind(low), kind(high))
    return None


def _start_ticks(pid: int) -> bytes | None:
    """The process' start time in clock ticks since boot (/proc/PID/stat's 22nd field): with the pid, it names one
    process, whatever reuses the pid later."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
    except OSError:
        return None
    return fields[19] if len(fields) > 19 else None


def role_of(cmdline: list[str], title_prefix: str) -> str | None:
    """api_server | engine_core | worker, or None for a process that is not vLLM's."""
    if not cmdline:
        return None
    first = cmdline[0]
    if first.startswith(f"{title_prefix}::EngineCore"):
        return "engine_core"
    if first.startswith(f"{title_prefix}::Worker"):
        return "worker"
    if first.startswith(f"{title_prefix}::APIServer"):
        return "api_server"
    head = cmdline[:4]
    if any(token.startswith("vllm.entrypoints") for token in head):
        return "api_server"  # python -m vllm.entrypoints.openai.api_server
    for token, following in itertools.pairwise(head):
        if token.rsplit("/", 1)[-1] == "vllm" and following == "serve":
            return "api_server"  # the `vllm serve` console script
    return None


RESCAN_SECONDS = 30.0  # a full scan of /proc for vLLM's processes; sampling known ones is cheaper
# A process known this long, and not vLLM's, keeps its title: its command line is not read again at each scan (reading
# every process' was 20 ms a scan on the H200's host, most of this source's cost). vLLM titles its processes within
# seconds of their start (VLLM::EngineCore), so a younger one is read again; vLLM's own always are.
TITLE_SETTLED_SECONDS = 60.0
# Reading every thread's CPU is most of a collection (the engine core and the API server run ~100 threads
# each on a GPU): done this often, the busiest thread's share is over these seconds and repeated between.
THREAD_SAMPLE_SECONDS = 10.0
# A process that can run no code: stopped by a signal (SIGSTOP, a debugger's stop) or exited unreaped. Not
# "tracing-stop": py-spy's own blocking samples put vLLM in that state for a moment.
STOPPED_STATES = (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


@dataclass
class _Tracked:
    process: psutil.Process
    role: str
    index: int  # small, stable per role: a label value, never the pid
    title: str
    args: dict[str, Any]
    flags: dict[str, str]  # the API server's whole command line (command_line_flags); empty for the other roles
    thread_times: dict[int, float] = field(default_factory=dict)  # tid -> cumulative CPU seconds
    thread_waits: dict[int, float] = field(default_factory=dict)  # tid -> cumulative seconds runnable but not running
    sampled_at: float | None = None  # when thread_times were read
    threads: int = 0
    busiest: ThreadSample | None = None  # the busiest thread between the last two reads of thread_times
    neediest: ThreadSample | None = None  # the thread that wanted the most CPU (ran + waited for one) between them
    cpus_allowed: int | None = None

    @property
    def short_title(self) -> str:
        """Its title's first word (VLLM::Worker_TP1): what names its ranks, without the command line after it."""
        return self.title.split(" ", 1)[0]


class ProcessSource:
    """Finds vLLM's processes (psutil; run in a thread by the daemon) and samples their CPU, memory,
    threads, busiest thread and container CPU throttling. Roles: api_server, engine_core, worker."""

    def __init__(self, port: int | None, title_prefix: str = "VLLM", clock: Callable[[], float] = time.time) -> None:
        self.port = port
        self.title_prefix = title_prefix
        self.clock = clock
        self._tracked: list[_Tracked] = []
        self._scanned_at = -math.inf
        self._last_count: tuple[int, int] | None = None
        self.binding = "not scanned yet"
        self._titled: set[int] = set()
        self._members: set[int] = set()
        self._bound_to_listener = False
        self.ignored = 0
        # Engine cores and workers that outlived the API server they were watched under (SIGKILL, OOM kill): they
        # keep their GPU memory, so a restarted server cannot allocate. Kept until they exit, whatever binds next.
        self._orphans: dict[int, _Tracked] = {}
        # Workers (ranks) that exited or turned zombie while the engine core that ran them lives on: its other ranks
        # wait for it in their next collective. Kept while one of those engine cores lives (a restart forgets them).
        self._lost: dict[int, tuple[_Tracked, list[_Tracked]]] = {}
        self._cgroup_stat: tuple[int, str | None] | None = None  # the API server's pid and its cgroup's cpu.stat
        # API servers that exited since the sidecar started (a crash loop restarts one under a new pid), and whether
        # any process beyond the sidecar's own is visible (a process namespace shared with vLLM's container).
        self._api_server_exits = 0
        self._exit_times: collections.deque[float] = collections.deque(maxlen=16)  # when the last ones were seen gone
        self._exited: set[int] = set()
        self.process_view: bool | None = None
        # (pid, start time) -> when first seen, its role (None: not vLLM's), the process and its command line
        self._known: dict[tuple[int, bytes], tuple[float, str | None, psutil.Process | None, list[str]]] = {}

    def _scan(self) -> None:
        titled: dict[int, tuple[str, psutil.Process, list[str]]] = {}
        # A namespace does not change under a running sidecar: once a view is seen (vLLM's processes, or any not its
        # own) it stays, and the sidecar's own tree (a second walk of every process) is not read again.
        own = set() if self.process_view else _own_tree()
        # a process started in the sidecar's own container (kubectl exec, its image's HEALTHCHECK) is no view of vLLM's:
        # only one in another container (another cgroup) counts
        mine = None if self.process_view else _cgroup_of(os.getpid())
        others = 0
        now = time.monotonic()
        seen: dict[tuple[int, bytes], tuple[float, str | None, psutil.Process | None, list[str]]] = {}
        for pid in psutil.pids():
            others += pid not in own and (mine is None or _cgroup_of(pid) != mine)
            started = _start_ticks(pid)
            if started is None:
                continue  # gone since the listing
            key = (pid, started)
            remembered = self._known.get(key)
            # vLLM's own are read at every scan (an exited one turns zombie: its command line is gone, and so is it)
            if remembered is None or remembered[1] is not None or now - remembered[0] < TITLE_SETTLED_SECONDS:
                try:
                    proc = psutil.Process(pid)
                    cmdline = proc.cmdline()
                except (psutil.ZombieProcess, psutil.AccessDenied):
                    cmdline = []  # no command line to read now or later: not one of vLLM's that can be watched
                except psutil.NoSuchProcess:
                    continue
                role = role_of(cmdline, self.title_prefix)
                remembered = (remembered[0] if remembered else now, role, proc if role else None, cmdline if role else [])
            seen[key] = remembered
            _, role, proc_or_none, cmdline = remembered
            if role is not None and proc_or_none is not None:
                titled[pid] = (role, proc_or_none, cmdline)
        self._known = seen  # processes that exited are forgotten
        self.process_view = bool(self.process_view) or others > 0 or bool(titled)
        if set(titled) != self._titled or not self._bound_to_listener:
            # Binding reads every process' sockets (psutil.net_connections): only when vLLM's processes changed,
            # or while the server was not yet found listening on its port.
            self._members, self.binding, self._bound_to_listener = self._bind(titled)
            self._titled = set(titled)
        members = self._members
        known = {t.process.pid: t for t in self._tracked}
        tracked = []
        for role in ("api_server", "engine_core", "worker"):
            chosen = sorted((p for pid, p in titled.items() if p[0] == role and pid in members), key=lambda p: p[1].pid)
            for index, (_, proc, cmdline) in enumerate(chosen):
                previous = known.get(proc.pid)
                server = role == "api_server"
                args, flags = (parse_vllm_args(cmdline), command_line_flags(cmdline)) if server else ({}, {})
                entry = _Tracked(proc, role, index, " ".join(cmdline)[:200], args, flags)
                if previous is not None and previous.role == role:
                    entry.thread_times, entry.thread_waits, entry.sampled_at = previous.thread_times, previous.thread_waits, previous.sampled_at
                    entry.threads, entry.busiest, entry.neediest = previous.threads, previous.busiest, previous.neediest
                    entry.cpus_allowed = previous.cpus_allowed
                tracked.append(entry)
        self._adopt_orphans()
        self._note_lost_workers()
        current = {t.process.pid for t in tracked if t.role == "api_server"}
        for old in self._tracked:
            pid = old.process.pid
            if old.role == "api_server" and pid not in self._exited and (pid not in current or not _alive(old.process)):
                self._exited.add(pid)  # an unreaped zombie stays watched: counted once
                self._api_server_exits += 1
                self._exit_times.append(self.clock())
                log.warning("vLLM's API server (pid %d) exited (%d seen exiting since the sidecar started)", pid, self._api_server_exits)
        self._exited &= current
        tracked = [t for t in tracked if t.process.pid not in self._orphans]
        self._tracked = tracked  # processes that exited are gone with their state
        self.ignored = len(titled) - len(tracked)
        if (len(tracked), self.ignored) != self._last_count:
            ignored = f"; {self.ignored} other vLLM-titled process(es) ignored" if self.ignored else ""
            log.info("process source: %d vLLM process(es) watched (%s)%s", len(tracked), self.binding, ignored)
            self._last_count = (len(tracked), self.ignored)

    def _server_gone(self) -> bool:
        """The API server watched so far exited or is an unreaped zombie (its parent not yet told)."""
        servers = [t for t in self._tracked if t.role == "api_server"]
        return bool(servers) and not any(_alive(t.process) for t in servers)

    def _adopt_orphans(self) -> None:
        """Engine cores and workers watched before whose API server died while they live on."""
        servers = [t for t in self._tracked if t.role == "api_server"]
        if self._server_gone():
            for old in self._tracked:
                if old.role != "api_server" and _alive(old.process):
                    self._orphans.setdefault(old.process.pid, old)
                    log.warning("vLLM %s pid %d outlived its API server (pid %d): it keeps its GPU memory", old.role, old.process.pid, servers[0].process.pid)
        self._orphans = {pid: t for pid, t in self._orphans.items() if _alive(t.process)}

    def _note_lost_workers(self) -> None:
        """Workers watched before that are gone (or zombies) while an engine core watched with them still runs."""
        cores = [t for t in self._tracked if t.role == "engine_core" and _alive(t.process)]
        for old in self._tracked:
            if old.role == "worker" and cores and not _alive(old.process) and old.process.pid not in self._lost:
                self._lost[old.process.pid] = (old, cores)
                title, pid, core = old.short_title, old.process.pid, cores[0].process.pid
                log.warning("vLLM worker %s (pid %d) is gone while its engine core (pid %d) runs", title, pid, core)
        self._lost = {pid: (t, cores) for pid, (t, cores) in self._lost.items() if any(_alive(c.process) for c in cores)}

    def _bind(self, titled: dict[int, tuple[str, psutil.Process, list[str]]]) -> tuple[set[int], str, bool]:
        """The pids of the vLLM server the sidecar scrapes, how they were found, and whether by its listening
        socket: the process listening on the scraped port and its descendants (engine cores, workers,
        data-parallel engines); else the API server whose --port is that port and its descendants (its socket
        in another network namespace); else every vLLM-titled process, said to be an assumption."""
        if not titled:
            return set(), "no vLLM process visible (no shared process namespace?)", False
        if self.port:
            listeners = _listening_pids(self.port)
            roots = {pid for pid in listeners if _parent_pid(pid) not in listeners}
            if roots:
                members = _with_descendants(roots)
                if members & set(titled):
                    return members, f"the process listening on port {self.port} (pid {', '.join(map(str, sorted(roots)))}) and its descendants", True
            flagged = [pid for pid, (role, _, cmdline) in titled.items() if role == "api_server" and parse_vllm_args(cmdline).get("port", 8000) == self.port]
            if len(flagged) == 1:
                return (
                    _with_descendants(set(flagged)),
                    f"the API server started with --port {self.port} (pid {flagged[0]}) and its descendants "
                    "(no listening socket on that port is visible: another network namespace?)",
                    False,
                )
        # An API server started for another port is another server: it and its descendants are not ours.
        foreign = _with_descendants(
            {
                pid
                for pid, (role, _, cmdline) in titled.items()
                if role == "api_server" and self.port and parse_vllm_args(cmdline).get("port", 8000) != self.port
            }
        )
        return (
            set(titled) - foreign,
            f"every vLLM-titled process not started for another port: none listens on port {self.port} here and no single "
            f"API server has --port {self.port}; assumed to be one server (set vllm_url to the port vLLM listens on)",
            False,
        )

    def collect(self) -> Reading:
        start = time.perf_counter()
        timestamp = self.clock()
        now = time.monotonic()
        # While no API server is watched (vLLM not started yet, or between the restarts of a crash loop), every
        # collection looks: a process that lives seconds is still seen.
        if now - self._scanned_at >= RESCAN_SECONDS or not any(t.role == "api_server" for t in self._tracked):
            self._scan()
            self._scanned_at = now
        # Sampling reads each process' status anyway: a process gone or turned zombie (the API server included) shows
        # there, and only then is /proc scanned again, so a healthy reading costs no second look at each process.
        samples, processes, intact = self._sample_all(now)
        if not intact:
            self._scan()
            self._scanned_at = now
            samples, processes, _ = self._sample_all(now)
        meta = ProcessMeta(processes=processes, binding=self.binding, ignored_processes=self.ignored, runnable_tasks=_runnable_tasks())
        if self.process_view is not None:
            meta["process_view"] = self.process_view
        samples[("process_exits_total", make_labels({"role": "api_server"}))] = float(self._api_server_exits)
        if self._exit_times:
            meta["api_server_exit_times"] = list(self._exit_times)
        orphans = [t for t in self._orphans.values() if _alive(t.process)]
        if orphans:
            meta["orphans"] = [OrphanEntry(pid=t.process.pid, role=t.role, title=t.title, status=_status(t.process)) for t in orphans]
        for role in ("engine_core", "worker"):
            samples[("process_orphaned", make_labels({"role": role}))] = float(sum(1 for t in orphans if t.role == role))
        if self._lost and not all(_alive(c.process) for _, cores in self._lost.values() for c in cores):
            self._scanned_at = -math.inf  # their engine core is gone too: forget them at the next reading
        samples[("process_lost", make_labels({"role": "worker"}))] = float(len(self._lost))
        if self._lost:
            meta["lost_workers"] = [
                LostWorker(pid=t.process.pid, title=t.short_title, status=_status(t.process), engine_core_pid=cores[0].process.pid)
                for t, cores in self._lost.values()
            ]
        servers = [t for t in self._tracked if t.role == "api_server"]
        if servers:
            meta["api_server_args"] = servers[0].args
            meta["api_server_flags"] = servers[0].flags
            meta["api_server_pid"] = servers[0].process.pid
            pid = servers[0].process.pid
            if self._cgroup_stat is None or self._cgroup_stat[0] != pid:  # a process stays in its cgroup: found once
                self._cgroup_stat = (pid, _cgroup_stat_path(pid))
            samples.update(_cgroup_throttling(self._cgroup_stat[1]))
        return Reading(PROCESS_SOURCE, timestamp, True, samples, duration_seconds=time.perf_counter() - start, meta=meta)

    def _sample_all(self, now: float) -> tuple[dict[SeriesKey, float], list[ProcessEntry], bool]:
        """The tracked processes' samples, their entries, and whether every one was read and none is a zombie."""
        samples: dict[SeriesKey, float] = {}
        processes: list[ProcessEntry] = []
        intact = True
        for tracked in self._tracked:
            try:
                entry = self._sample(tracked, now, samples)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                intact = False
                continue
            processes.append(entry)
            intact = intact and entry["status"] != psutil.STATUS_ZOMBIE
        return samples, processes, intact

    def _sample(self, tracked: _Tracked, now: float, out: dict[SeriesKey, float]) -> ProcessEntry:
        labels = make_labels({"role": tracked.role, "index": str(tracked.index)})
        proc = tracked.process
        due = tracked.sampled_at is None or tracked.busiest is None or now - tracked.sampled_at >= THREAD_SAMPLE_SECONDS
        with proc.oneshot():
            cpu = proc.cpu_times()
            out[("process_cpu_seconds_total", labels)] = cpu.user + cpu.system
            status = proc.status()
            out[("process_stopped", labels)] = 1.0 if status in STOPPED_STATES else 0.0
            out[("process_resident_memory_bytes", labels)] = float(proc.memory_info().rss)
            out[("process_start_time_seconds", labels)] = proc.create_time()
            if due:
                self._sample_threads(tracked, now)
                tracked.cpus_allowed = _cpus_allowed(proc)
        out[("process_threads", labels)] = float(tracked.threads)
        entry = ProcessEntry(pid=proc.pid, role=tracked.role, index=tracked.index, status=status)
        if tracked.role != "api_server":  # VLLM::Worker_TP1, VLLM::EngineCore_DP1: its ranks (discovery's rank map)
            entry["title"] = tracked.short_title
        if tracked.busiest is not None:
            out[("process_busiest_thread_cpu_ratio", labels)] = tracked.busiest["cpu_ratio"]
            entry["busiest_thread"] = tracked.busiest
        if tracked.neediest is not None:
            out[("process_thread_runqueue_wait_ratio", labels)] = tracked.neediest["runqueue_wait_ratio"]
            out[("process_thread_cpu_demand_ratio", labels)] = tracked.neediest["cpu_ratio"] + tracked.neediest["runqueue_wait_ratio"]
            entry["neediest_thread"] = tracked.neediest
        if tracked.cpus_allowed is not None:
            entry["cpus_allowed"] = tracked.cpus_allowed
        return entry

    @staticmethod
    def _sample_threads(tracked: _Tracked, now: float) -> None:
        pid = tracked.process.pid
        stats = _thread_schedstats(pid)
        if stats is not None:
            times = {tid: ran for tid, (ran, _) in stats.items()}
            waits = {tid: waited for tid, (_, waited) in stats.items()}
        else:  # a kernel without schedstats: psutil's per-thread CPU times, and no run-queue waits
            times = {t.id: t.user_time + t.system_time for t in tracked.process.threads()}
            waits = {}
        if tracked.sampled_at is not None and now > tracked.sampled_at:
            elapsed = now - tracked.sampled_at
            deltas = {tid: value - tracked.thread_times.get(tid, value) for tid, value in times.items()}
            tid, busiest = max(deltas.items(), key=lambda item: item[1], default=(0, 0.0))
            tracked.busiest = ThreadSample(tid=tid, name=_thread_name(pid, tid), main=tid == pid, cpu_ratio=round(max(0.0, busiest / elapsed), 3))
            # A thread that waits for a CPU is starved, not idle: what it ran plus what it waited to run is what it wanted.
            waited = {tid: max(0.0, value - tracked.thread_waits.get(tid, value)) for tid, value in waits.items()}
            if waited:
                tid = max(waited, key=lambda t: waited[t] + max(0.0, deltas.get(t, 0.0)))
                tracked.neediest = ThreadSample(
                    tid=tid,
                    name=_thread_name(pid, tid),
                    main=tid == pid,
                    cpu_ratio=round(max(0.0, deltas.get(tid, 0.0)) / elapsed, 3),
                    runqueue_wait_ratio=round(waited[tid] / elapsed, 3),
                )
        tracked.thread_times, tracked.thread_waits, tracked.sampled_at, tracked.threads = times, waits, now, len(times)


def _thread_schedstats(pid: int) -> dict[int, tuple[float, float]] | None:
    """tid -> (seconds it ran on a CPU, seconds it was runnable but waited for one), from each thread's
    /proc/<pid>/task/<tid>/schedstat (in ns; kernels with schedstats); None where the kernel keeps none. One small
    read per thread, without buffering: this is most of what the process source costs (~100 threads a process)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    stats: dict[int, tuple[float, float]] = {}
    for tid in tids:
        try:
            handle = os.open(f"/proc/{pid}/task/{tid}/schedstat", os.O_RDONLY)
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread exited since the listing
        except OSError:
            return None
        try:
            fields = os.read(handle, 128).split()
            stats[int(tid)] = (int(fields[0]) / 1e9, int(fields[1]) / 1e9)
        except (OSError, ValueError, IndexError):
            return None
        finally:
            os.close(handle)
    return stats


def _runnable_tasks() -> int | None:
    """Threads runnable on the whole host now (/proc/loadavg's running count, /proc/stat's procs_running in one short
    line): how crowded the run queues are."""
    try:
        with open("/proc/loadavg", encoding="ascii") as handle:
            return int(handle.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None


def _cpus_allowed(process: psutil.Process) -> int | None:
    """How many CPUs the process may run on (its affinity: cpuset, taskset)."""
    try:
        return len(process.cpu_affinity() or [])
    except (psutil.Error, AttributeError, OSError):
        return None


def _alive(process: psutil.Process) -> bool:
    """Running and not a zombie (an exited child its parent has not reaped holds no memory)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _status(process: psutil.Process) -> str:
    try:
        return str(process.status())
    except psutil.Error:
        return "gone"


def _listening_pids(port: int) -> set[int]:
    """Pids with a TCP socket listening on `port` in this network namespace (those whose file
    descriptors the sidecar may read)."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return set()
    return {c.pid for c in connections if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid}


def _own_tree() -> set[int]:
    """The sidecar's own process, its ancestors and its descendants (py-spy): what it sees even alone in its namespace."""
    me = psutil.Process()
    try:
        return {me.pid, *(p.pid for p in me.parents()), *(c.pid for c in me.children(recursive=True))}
    except psutil.Error:
        return {me.pid}


def _parent_pid(pid: int) -> int | None:
    try:
        return psutil.Process(pid).ppid()
    except psutil.Error:
        return None


def _with_descendants(pids: set[int]) -> set[int]:
    members = set(pids)
    for pid in pids:
        try:
            members.update(child.pid for child in psutil.Process(pid).children(recursive=True))
        except psutil.Error:
            continue
    return members


def _thread_name(pid: int, tid: int) -> str:
    try:
        # The kernel cuts a name at 15 bytes, which can split a UTF-8 character.
        with open(f"/proc/{pid}/task/{tid}/comm", encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return "?"


def _cgroup_of(pid: int) -> str | None:
    """The process' cgroups (/proc/PID/cgroup, readable by anyone): which container it runs in; None where unreadable."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as handle:
            return handle.read(4096)
    except OSError:
        return None


def _cgroup_stat_path(pid: int) -> str | None:
    """The cpu.stat of the process' cgroup (v2) that the sidecar can read: through the host's /sys/fs/cgroup, else
    through vLLM's own view of it."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as handle:
            path = next((line.split(":", 2)[2].strip() for line in handle if line.startswith("0::")), None)
    except OSError:
        return None
    candidates = [f"/sys/fs/cgroup{path}/cpu.stat"] if path else []
    candidates.append(f"/proc/{pid}/root/sys/fs/cgroup/cpu.stat")
    return next((candidate for candidate in candidates if os.access(candidate, os.R_OK)), None)


def _cgroup_throttling(path: str | None) -> dict[SeriesKey, float]:
    """CPU throttling of vLLM's container (cgroup v2 cpu.stat), when the sidecar can read it."""
    if path is None:
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            stat = dict(line.split() for line in handle if line.strip())
    except (OSError, ValueError):
        return {}
    labels = make_labels({"role": "api_server"})
    out: dict[SeriesKey, float] = {}
    if "nr_periods" in stat:
        out[("process_cgroup_periods_total", labels)] = float(stat["nr_periods"])
        out[("process_cgroup_throttled_periods_total", labels)] = float(stat.get("nr_throttled", 0))
        out[("process_cgroup_throttled_seconds_total", labels)] = float(stat.get("throttled_usec", 0)) / 1e6
    return out


def build(config: Config, clock: Clock, _: ProcessTargets) -> SourceLoop:
    """Sample vLLM's processes every process_interval_seconds, on a worker thread (psutil blocks)."""
    options = config.options(ProcessOptions)
    source = ProcessSource(config.vllm_port, options.process_title_prefix, clock)
    collect = partial(asyncio.to_thread, CPU.run, "process_collect", source.collect)
    return SourceLoop(PROCESS_SOURCE, options.process_interval_seconds, collect, nothing_to_close)
