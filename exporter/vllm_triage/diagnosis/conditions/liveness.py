"""vLLM's liveness, judged on its own /metrics and what the host sees of its processes: is it answering, is
its engine stepping?"""

from __future__ import annotations

from ...model import VLLM_SOURCE
from ..condition import Condition, Threshold
from ..judge import Judge, Term, all_of, any_of


def _vllm_unreachable(j: Judge) -> Term:
    down = j.value("vllm_down_seconds")
    if down is None:
        return j.fact(None, "vLLM has not been scraped yet", "vllm_down_seconds")
    if not (scrape := j.health.get(VLLM_SOURCE)) or scrape.up is not False:
        return j.fact(False, "vLLM's last scrape succeeded", "vllm_down_seconds", down)
    # A gap shorter than stale_after is ridden through (a slow scrape is no outage); a vLLM never read is judged by
    # what the host shows of its start.
    stale = j.signals.get("vllm_stale_after_seconds") or 0.0
    if scrape.last_success_timestamp is None:
        return _never_answered(j, scrape.last_error_reason, scrape.last_error)
    limit = None if stale <= j.thresholds["down_seconds_min"] else stale
    term = j.compare("vllm_down_seconds", ">=", "down_seconds_min", "vLLM /metrics has been failing for", " s", limit=limit)
    if limit is not None:
        j.note(f"a gap shorter than stale_after ({stale:.0f} s) is ridden through", "vllm_stale_after_seconds", stale)
    j.note(f"last error ({scrape.last_error_reason}): {scrape.last_error}")
    if term.holds:
        _unreachable_cause(j, scrape.last_error_reason)
    return term


def _never_answered(j: Judge, reason: str | None, error: str | None) -> Term:
    """vLLM has not answered once since the sidecar started. Starting means loading, and that needs evidence: where the
    sidecar sees vLLM's processes, an API server that runs (its port opens once the model is loaded) is starting for
    up to startup_grace_seconds; one that keeps exiting is a crash loop at once, and none for not_started_seconds is an
    outage (not started, exited, or serving another port). Without that view, the wait alone says starting, for
    startup_grace_no_process_seconds."""
    down = j.signals.get("vllm_down_seconds") or 0.0
    exits = j.signals.get("host_api_server_exits_recent")
    running = j.signals.get("host_api_server_running_seconds")
    what = "vLLM has not answered once since the sidecar started, for"
    if j.signals.get("host_process_view") != 1.0:
        term = j.compare("vllm_down_seconds", ">=", "startup_grace_no_process_seconds", what, " s")
        if term.holds:
            j.cause = "unknown"
            j.note("cause unknown: the sidecar sees no process beyond its own (is the process namespace shared? is the process source on?)")
        else:
            j.note(
                f"starting? vLLM has not answered for {down:.0f} s; without a view of its processes that counts as starting for "
                f"{j.thresholds['startup_grace_no_process_seconds']:.0f} s (startup_grace_no_process_seconds)"
            )
    elif exits is not None and exits >= j.thresholds["crash_loop_exits_min"]:
        term = j.compare("host_api_server_exits_recent", ">=", "crash_loop_exits_min", "vLLM API server processes that exited in the last 10 minutes")
        _crash_loop(j, exits)
    elif running is not None:
        term = j.compare("vllm_down_seconds", ">=", "startup_grace_seconds", what, " s")
        if term.holds:
            _unreachable_cause(j, reason)
        else:
            j.note(
                f"starting: vLLM is loading: its API server has run {running:.0f} s and its port does not answer yet; unreachable after "
                f"{j.thresholds['startup_grace_seconds']:.0f} s without an answer (startup_grace_seconds)",
                "host_api_server_running_seconds",
                running,
            )
    else:
        term = j.compare("vllm_down_seconds", ">=", "not_started_seconds", "no vLLM API server runs and nothing has answered, for", " s")
        ignored = j.signals.get("host_vllm_processes_ignored") or 0.0
        gone = j.signals.get("host_api_server_gone_seconds")
        if not term.holds:
            j.note(f"starting? no vLLM API server process yet; not started after {j.thresholds['not_started_seconds']:.0f} s (not_started_seconds)")
        elif ignored:
            j.cause = "not_listening"
            j.note(
                f"cause not_listening: {ignored:.0f} vLLM process(es) run, started for another port than the scraped one: is vllm_url "
                "the port vLLM listens on?",
                "host_vllm_processes_ignored",
                ignored,
            )
        elif gone is not None:
            j.cause = "process_gone"
            j.note(f"cause process_gone: vLLM's API server exited {gone:.0f} s ago before it answered once", "host_api_server_gone_seconds", gone)
        else:
            j.cause = "not_started"
            j.note("cause not_started: no vLLM process has run since the sidecar started (the container's command, its image, its scheduling)")
    j.note(f"last error ({reason}): {error}")
    return term


def _crash_loop(j: Judge, exits: float) -> None:
    j.cause = "crash_loop"
    j.note(
        f"cause crash_loop: {exits:.0f} vLLM API server processes exited in the last 10 minutes: it starts and dies (a bad model path or "
        "argument, out of GPU memory at load, a CUDA error)",
        "host_api_server_exits_recent",
        exits,
    )


# Something answers on vLLM's port, but not with a page the sidecar can read: vLLM (or a proxy) is up.
PAGE_REASONS = ("http_status", "too_large", "too_many_series", "truncated", "parse", "no_vllm_metrics")


def _unreachable_cause(j: Judge, reason: str | None) -> None:
    """Why /metrics fails, from the failure itself and what the host sees of the API server process."""
    stopped, gone = j.signals.get("host_api_server_stopped"), j.signals.get("host_api_server_gone_seconds")
    exits = j.signals.get("host_api_server_exits_recent")
    if reason in PAGE_REASONS:
        j.cause = "page_unusable"
        j.note("cause page_unusable: something answers on vLLM's port, but not with a /metrics page the sidecar can read")
    elif stopped == 1.0:
        j.cause = "process_stopped"
        j.note("cause process_stopped: the API server process is stopped (SIGSTOP, a debugger): it can answer nothing", "host_api_server_stopped", stopped)
    elif stopped == 0.0 and reason in ("timeout", "http"):
        j.cause = "not_answering"
        j.note(
            "cause not_answering: the API server process runs but does not answer: its event loop is blocked (stack dump in /diagnosis)",
            "host_api_server_stopped",
            stopped,
        )
    elif stopped == 0.0:
        j.cause = "not_listening"
        j.note("cause not_listening: the API server process runs but nothing accepts on the scraped address", "host_api_server_stopped", stopped)
    elif exits is not None and exits >= j.thresholds["crash_loop_exits_min"]:
        _crash_loop(j, exits)
    elif gone is not None:
        j.cause = "process_gone"
        j.note(f"cause process_gone: the API server process was last seen {gone:.0f} s ago", "host_api_server_gone_seconds", gone)
    elif not j.active:  # once active, the cause seen first stays while the host can no longer tell
        j.cause = "unknown"
        j.note("cause unknown: the sidecar sees no vLLM process (is the process namespace shared? is the process source on?)")


VLLM_UNREACHABLE = Condition(
    id="vllm_unreachable",
    precedence=10,
    notes=("orphans",),
    layer="1",
    severity="critical",
    summary="vLLM's /metrics endpoint is failing",
    meaning=(
        "The sidecar cannot read vLLM's metrics: the server is down, restarting, hung or unreachable, "
        "or its page is over the sidecar's limits (the evidence gives the last error)."
    ),
    next_actions=(
        "Is the server up? Check the pod's restarts and the vLLM container's logs; the cause says what the host sees of "
        "the API server process (gone, stopped, not answering, not listening) or of its page.",
        "cause=process_gone: the server exited: look for OOM kills (kubectl describe pod; dmesg) and CUDA errors in the log.",
        "An engine core or worker outlived its API server (the evidence names its pid and GPU memory; "
        "vllm_triage_process_orphaned): it keeps the GPU, so the restarted server cannot allocate: kill it.",
        "cause=process_stopped: something sent SIGSTOP or a debugger holds the API server: `kill -CONT <pid>`; find who stopped it.",
        "cause=not_answering: the API server's event loop is blocked: the stack dump /diagnosis attaches (stack_dumps), or "
        "`py-spy dump --pid <API server pid>`, shows where; restart the pod.",
        "cause=not_listening: the process runs but refuses connections: is vllm_url the port vLLM listens on?",
        "cause=crash_loop: vLLM starts and dies: read the vLLM container's previous log (kubectl logs --previous) for the error: a "
        "model path or argument, CUDA out of memory at load (lower --gpu-memory-utilization, or a process that outlived the last run).",
        "cause=not_started: no vLLM process has run: check the vLLM container's state (kubectl describe pod: image pull, command, "
        "scheduling) and that the pod shares its process namespace with the sidecar.",
        "cause=page_unusable, last error too_large, too_many_series or too_many_engines: vLLM is up but its page is not; find the "
        "exploding label, or raise max_page_bytes, max_series or max_engines (and the sidecar's memory limit).",
    ),
    predicate=_vllm_unreachable,
    reads=(
        "vllm_down_seconds",
        "vllm_stale_after_seconds",
        "host_api_server_stopped",
        "host_api_server_gone_seconds",
        "host_api_server_exits_recent",
        "host_api_server_running_seconds",
        "host_process_view",
        "host_vllm_processes_ignored",
    ),
    causes=("process_gone", "crash_loop", "not_started", "process_stopped", "not_answering", "not_listening", "page_unusable", "unknown"),
    stack_dump_role="api_server",
    stack_dump_causes=("not_answering",),
    thresholds=(
        Threshold("down_seconds_min", 0.0, "seconds of failed scrapes at or above which the predicate holds (at least stale_after)"),
        Threshold(
            "startup_grace_seconds",
            1800.0,
            "before vLLM's first answer, while its API server process runs (loading): seconds without an answer after which it is "
            "unreachable, not starting (default: vllm_startup_seconds where set; the chart sets it to vllm.startupSeconds)",
            option="vllm_startup_seconds",
        ),
        Threshold(
            "not_started_seconds",
            150.0,
            "before vLLM's first answer, where the sidecar sees vLLM's processes: seconds with no API server process after which it is "
            "unreachable (not_started), not starting",
        ),
        Threshold(
            "crash_loop_exits_min",
            2.0,
            "API server processes seen exiting within 10 minutes at or above which vLLM is unreachable (crash_loop), not starting",
            minimum=1.0,
        ),
        Threshold(
            "startup_grace_no_process_seconds",
            600.0,
            "before vLLM's first answer, where the sidecar sees no process beyond its own (no shared process namespace, or the "
            "process source off): seconds without an answer after which it is unreachable, not starting (default: "
            "vllm_startup_seconds where set; the chart sets it to vllm.startupSeconds)",
            option="vllm_startup_seconds",
        ),
    ),
    for_seconds=15,
    clear_seconds=30,
    sources=(),
    scope_kind="global",
)


def _engine_wedged(j: Judge) -> Term:
    # A prefill produces no token until it completes (vLLM counts prompt tokens at the first output
    # token): a server whose prefills take long may stand still that long, so the bar rises with them.
    prefill = j.signals.get("prefill_time_seconds_p95")
    limit = None
    if prefill is not None and prefill * j.thresholds["prefill_p95_multiple"] > j.thresholds["stalled_seconds_min"]:
        limit = prefill * j.thresholds["prefill_p95_multiple"]
        j.note(f"prefills take up to {prefill:.1f} s (p95 in the window): a stall counts from {limit:.0f} s", "prefill_time_seconds_p95", prefill)
    stalled = j.compare("seconds_stalled_with_requests_pending", ">=", "stalled_seconds_min", "requests pending and no token produced for", " s", limit=limit)
    # A kernel resident on the GPU that computes nothing while no token comes: vLLM's gauges never see the requests
    # that arrive behind it (a real H200 run: running read 0 throughout while 8 clients waited), the GPU does.
    if j.signals.get("gpu_utilization_ratio_recent") is not None and j.signals.get("gpu_sm_active_ratio_recent") is not None:
        stalled = any_of(
            stalled,
            all_of(
                j.compare("seconds_since_last_token", ">=", "stalled_seconds_min", "no token produced for", " s", limit=limit),
                j.compare("gpu_utilization_ratio_recent", ">=", "resident_utilization_min", "util.gpu over the last 10 s (a kernel resident)", upper=1.0),
                j.compare("gpu_sm_active_ratio_recent", "<=", "hung_sm_active_max", "GPM SM activity over the last 10 s (computing nothing)", upper=1.0),
            ),
        )
    # A stopped engine core runs no code whatever vLLM's gauges say: the host's view alone is enough.
    stopped_for = j.signals.get("host_engine_core_stopped_seconds")
    if stopped_for:
        stalled = any_of(
            stalled, j.compare("host_engine_core_stopped_seconds", ">=", "stalled_seconds_min", "the engine core process has been stopped for", " s")
        )
    # A stopped engine core that runs again (SIGCONT): the stall seen before is over. It is hung again only once it has run
    # for the stall bar with requests still counted pending; and the latch below does not apply (vLLM does not count the
    # requests its clients gave up during the stop as finished: nothing else would ever end it on an idle server).
    resumed = j.signals.get("host_engine_core_resumed_seconds")
    if resumed is not None:
        stalled = all_of(
            stalled,
            j.compare("host_engine_core_resumed_seconds", ">=", "stalled_seconds_min", "the engine core was stopped and has run again for", " s"),
            j.compare("requests_pending_latest", ">", "pending_latest_min", "requests running or waiting as vLLM counts them since"),
        )
    if not stalled.holds and j.active and resumed is None:
        # Declared hung, it stays so while nothing moves: no token and no request finished in
        # the whole window. In a long hang the readings that saw the requests pending leave the window while
        # vLLM's gauges read 0.
        frozen = all_of(
            j.compare("seconds_since_last_token", ">=", "stalled_seconds_min", "no token produced for", " s", limit=j.signals.get("window_span_seconds")),
            j.compare("finished_requests_per_second", "<=", "finished_per_second_max", "requests finished per second"),
        )
        stalled = any_of(stalled, frozen)
    if not stalled.holds:
        return stalled
    _stall_evidence(j)
    stopped = j.signals.get("host_engine_core_stopped")
    cpu = j.signals.get("host_engine_core_cpu_cores_recent")
    utilization, sm = j.signals.get("gpu_utilization_ratio_recent"), j.signals.get("gpu_sm_active_ratio_recent")
    resident = utilization is not None and utilization >= j.thresholds["resident_utilization_min"]
    if stopped:
        j.cause = "process_stopped"
        j.note(
            "cause process_stopped: the engine core process is stopped (SIGSTOP, a debugger) or a zombie: it can run no code",
            "host_engine_core_stopped",
            stopped,
        )
    elif resident and (sm is None or sm <= j.thresholds["hung_sm_active_max"]):  # whether the engine core blocks or spins in its wait
        j.cause = "hung_kernel"
        idle = "" if sm is None else f", SMs {sm:.2f} active"
        j.note(
            f"cause hung_kernel: util.gpu {utilization:.2f} over the last 10 s{idle}: a kernel is resident and does not finish (a hung kernel, "
            "or a collective waiting for a peer that never comes), and the engine core waits for it",
            "gpu_utilization_ratio_recent",
            utilization,
        )
    elif cpu is not None and cpu < j.thresholds["idle_cpu_cores_max"]:
        j.cause = "blocked"
        j.note(
            f"cause blocked: the engine core uses {cpu:.2f} cores over the last 10 s: it waits on something (a lock, a peer, I/O)",
            "host_engine_core_cpu_cores_recent",
            cpu,
        )
    elif cpu is not None:
        j.cause = "spinning"
        j.note(
            f"cause spinning: the engine core uses {cpu:.2f} cores over the last 10 s and produces nothing (a busy loop, a hung collective)",
            "host_engine_core_cpu_cores_recent",
            cpu,
        )
    else:
        j.cause = "unknown"
        j.note("cause unknown: the engine core's process is not visible (share the pod's process namespace)")
    _where_stuck(j)
    if utilization is not None and j.cause != "hung_kernel":
        what = "a kernel is resident and does not finish" if resident else "nothing runs on it" if utilization < 0.1 else "it is partly busy"
        j.note(f"util.gpu {utilization:.2f} over the last 10 s: {what}", "gpu_utilization_ratio_recent", utilization)
    return stalled


# Where the engine core's stack dump (taken once the verdict is active) finds its main thread, in words; the place is
# the cause where the host alone could say only blocked or spinning.
STUCK_WORDS = {
    "gpu_sync": "waits for the GPU (a synchronize: a kernel that does not finish)",
    "collective": "waits in a collective for its tensor-parallel peers",
    "grammar_compilation": "compiles a structured-output grammar",
    "waiting_for_requests": "waits for requests from the API server: the pending ones never reached it",
    "ipc_wait": "waits on a ZMQ or shared-memory queue for a peer process",
}


def _where_stuck(j: Judge) -> None:
    if (found := j.stuck.get("engine_core")) is None:
        return
    place, frame = found
    j.note(f"the engine core's stack dump: its main thread {STUCK_WORDS[place]}, in {frame}")
    if j.cause in ("blocked", "spinning", "unknown"):
        j.cause = place


def _stall_evidence(j: Judge) -> None:
    """What the host and vLLM's own counters say about the stall, and where vLLM's gauges contradict them."""
    thread = j.signals.get("host_engine_core_busiest_thread_cpu_ratio")
    if thread is not None:
        j.note(f"the engine core's busiest thread uses {thread:.2f} of a core", "host_engine_core_busiest_thread_cpu_ratio", thread)
    stuck = j.signals.get("requests_stalled")
    pending_now = (j.signals.get("requests_running_max") or 0) + (j.signals.get("requests_waiting_max") or 0)
    if stuck:
        j.note(f"{stuck:.0f} requests pending and not finished since the token counters froze", "requests_stalled", stuck)
    elif not pending_now:
        j.note("vLLM's gauges show nothing pending: the stall is judged by the host alone")
    since = j.signals.get("seconds_since_last_token")
    if since is not None:
        j.note(f"last token {since:.0f} s ago", "seconds_since_last_token", since)


ENGINE_WEDGED = Condition(
    id="engine_wedged",
    precedence=20,
    stack_dump_role="engine_core",
    notes=("stuck",),
    fails_engine_liveness=True,
    layer="1+3",
    severity="critical",
    summary="Requests are pending and the engine produces no tokens: it is hung",
    meaning=(
        "vLLM's API server still answers (its /health says 200 and /metrics shows the last gauges) but the engine "
        "core has produced no token while requests wait or run: it is stopped, deadlocked or stuck in a step. "
        "Clients hang until their timeouts; nothing recovers by itself."
    ),
    next_actions=(
        "See where it is stuck: the stack dump /diagnosis attaches (stack_dumps), or `py-spy dump --pid <engine core pid>`.",
        "cause=process_stopped: something sent SIGSTOP or a debugger holds it: `kill -CONT <pid>`; find who stopped it.",
        "cause=blocked: a deadlock or a lost peer (tensor-parallel worker, KV transfer): the dump shows the lock or "
        "the collective; check the workers' logs and NCCL; restart the pod.",
        "cause=hung_kernel: a GPU kernel or collective never finishes (util.gpu stays near 1 with idle SMs): the dump shows the "
        "engine core waiting in a synchronize; check the kernel log for Xid errors and NCCL peers; restart the pod (the GPU may need a reset).",
        "cause=spinning: a busy loop or a hung GPU collective: check the GPU's SM activity and NCCL; restart the pod.",
        "cause=gpu_sync: the engine core waits in a GPU synchronize that does not return: check the kernel log for Xid errors; "
        "restart the pod (the GPU may need a reset).",
        "cause=collective: a tensor-parallel collective waits for a peer: find the rank that is gone, stopped or slow "
        "(tp_rank_lost, the workers' logs, NCCL_DEBUG=INFO); restart the pod.",
        "cause=grammar_compilation: a structured-output grammar (a JSON schema, a regex) compiles for long: find the request "
        "that sent it; cap schema size in the gateway, or use a faster backend (--structured-outputs-config).",
        "cause=waiting_for_requests: the engine core idles while requests are counted pending: they never reached it; the API "
        "server's side of its input queue is stuck: its stacks (py-spy dump); restart the pod.",
        "cause=ipc_wait: the engine core waits on a ZMQ or shared-memory queue for a peer process (a worker, the API server) "
        "that does not answer: find it in the process list; restart the pod.",
        "Restart vLLM (a liveness probe on the sidecar's /engine-liveness restarts it for you: engine_liveness_endpoint).",
    ),
    predicate=_engine_wedged,
    reads=(
        "seconds_stalled_with_requests_pending",
        "host_engine_core_stopped_seconds",
        "requests_stalled",
        "seconds_since_last_token",
        "window_span_seconds",
        "finished_requests_per_second",
        "prefill_time_seconds_p95",
        "host_engine_core_stopped",
        "host_engine_core_cpu_cores_recent",
        "gpu_utilization_ratio_recent",
        "gpu_sm_active_ratio_recent",
        "host_engine_core_busiest_thread_cpu_ratio",
        "requests_running_min",
        "requests_running_max",
        "requests_waiting_max",
        # last: the drill-down plots the first few, and these exist only around a stop
        "host_engine_core_resumed_seconds",
        "requests_pending_latest",
    ),
    dont=(
        "Do not trust vLLM's /health alone: the API server answers 200 while its engine core is hung.",
        "Do not read the frozen gauges (running, waiting, KV usage) as the current load: they hold their last values.",
    ),
    thresholds=(
        Threshold("stalled_seconds_min", 20.0, "seconds with requests pending and no token produced, at or above this"),
        Threshold("prefill_p95_multiple", 3.0, "or, when higher, this many times the window's prefill p95 (a long prefill produces no token)"),
        Threshold("idle_cpu_cores_max", 0.05, "cause blocked when the engine core uses fewer cores than this over the last 10 s (else spinning)"),
        Threshold(
            "finished_per_second_max",
            0.0,
            "once hung, it stays so while no token came in the whole window and no more requests finish per second than this",
        ),
        Threshold("pending_latest_min", 0.0, "once a stopped engine core runs again, it is hung only with more requests than this pending"),
        Threshold("resident_utilization_min", 0.9, "cause hung_kernel when util.gpu over the last 10 s is at or above this (a kernel resident)", 0.0, 1.0),
        Threshold("hung_sm_active_max", 0.1, "... and GPM SM activity at or below this (it computes nothing)", 0.0, 1.0),
    ),
    for_seconds=5,
    clear_seconds=10,
    window_seconds=60.0,  # a stall is measured within the window: never shorter than the bar, whatever window_seconds says
    causes=(
        "process_stopped",
        "hung_kernel",
        "gpu_sync",
        "collective",
        "grammar_compilation",
        "waiting_for_requests",
        "ipc_wait",
        "blocked",
        "spinning",
        "unknown",
    ),
    contradicted=lambda s: (
        "tokens are produced again, or nothing is pending"
        if s.get("seconds_stalled_with_requests_pending") == 0 and not s.get("host_engine_core_stopped")
        else "the engine core runs again and vLLM counts nothing pending"
        if s.get("host_engine_core_resumed_seconds") is not None and s.get("requests_pending_latest") == 0
        else None
    ),
)
