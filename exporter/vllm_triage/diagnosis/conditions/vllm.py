"""Layer 1: the conditions judged on vLLM's own /metrics (with the host's and the GPUs' readings beside them where a
cause needs them), each entry beside its predicate."""

from __future__ import annotations

import math
from collections.abc import Mapping

from ...model import VLLM_SOURCE
from ..condition import FROZEN, Condition, Threshold
from ..judge import Judge, Term, all_of, any_of, sm_activity_words


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
            "unreachable, not starting (the chart's vllm.startupSeconds)",
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
            "process source off): seconds without an answer after which it is unreachable, not starting",
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


def _kv_cache_saturated(j: Judge) -> Term:
    # Two ways to know the cache is full. Sampled: usage mostly high and full at least once, with someone
    # waiting or preempted (each preemption frees a whole request's blocks at once, so a full cache averages
    # 0.90-0.95 with dips). Invariant: vLLM preempts only when it cannot allocate a block, so sustained
    # preemptions while requests wait for capacity are saturation whatever the gauge reads; under thrash
    # the gauge reads 0 at some scrapes and 1.0 at others (window means of 0.64-0.71 on a real engine).
    usage = all_of(
        j.compare("kv_cache_usage_ratio_mean", ">=", "usage_min", "KV cache usage (window mean)", upper=1.0),
        j.compare(
            "kv_cache_usage_ratio_max", ">=", "usage_peak_min", "KV cache usage (window peak)", upper=1.0, limit=_full_within_a_block(j, "usage_peak_min")
        ),
    )
    pressure = any_of(
        j.compare("requests_waiting_mean", ">", "waiting_min", "requests waiting (window mean)"),
        j.compare("preemptions_per_second", ">", "preemptions_per_second_min", "preemptions per second"),
    )
    sampled = all_of(usage, pressure)
    thrash = _preempting_while_waiting(j)
    verdict = any_of(sampled, thrash)
    if thrash.holds and not sampled.holds:
        low, mean = j.signals.get("kv_cache_usage_ratio_min"), j.signals.get("kv_cache_usage_ratio_mean")
        if low is not None and mean is not None:
            j.note(
                f"vLLM's KV usage gauge read {low:.2f} to full (mean {mean:.2f}) in the window, yet it preempted: it preempts only when "
                "no block is free, so the gauge is sampled between preemptions and understates the cache",
                "kv_cache_usage_ratio_min",
                low,
            )
    if verdict.holds:
        _advise_capacity(j)
    return verdict


def _preempting_while_waiting(j: Judge) -> Term:
    """Preemptions at a sustained rate while requests wait (for capacity, where vLLM says why they wait)."""
    preempting = j.compare("preemptions_per_second", ">=", "thrash_preemptions_per_second_min", "preemptions per second (no free KV block each time)")
    if j.signals.get("requests_waiting_capacity_mean") is not None:
        waiting = j.compare("requests_waiting_capacity_mean", ">", "waiting_min", "requests waiting for capacity (window mean, vLLM's reason)")
    else:
        waiting = j.compare("requests_waiting_mean", ">", "waiting_min", "requests waiting (window mean)")
    return all_of(preempting, waiting)


def _advise_capacity(j: Judge) -> None:
    """The flag values the observed workload asks for, with their arithmetic: how many requests of the observed
    length the KV cache holds (--max-num-seqs), how many replicas hold the observed demand, and how much
    GPU memory NVML still sees free (--gpu-memory-utilization)."""
    s = j.signals
    fit, prompt, output = s.get("kv_requests_that_fit"), s.get("prompt_tokens_mean"), s.get("generation_tokens_mean")
    capacity, block, max_seqs = s.get("kv_capacity_tokens"), s.get("block_size_tokens"), s.get("max_num_seqs")
    running, waiting = s.get("requests_running_mean"), s.get("requests_waiting_mean")
    if fit is not None and fit >= 1 and prompt is not None and output is not None and capacity is not None:
        per_request = f"{math.ceil((prompt + output) / block):.0f} blocks of {block:.0f}" if block else f"{prompt + output:.0f} tokens"
        if max_seqs is not None and fit < max_seqs:
            j.advise(
                f"--max-num-seqs {fit:.0f}: the cache's {capacity:.0f} KV tokens hold {fit:.0f} requests of {prompt:.0f} prompt + "
                f"{output:.0f} output tokens ({per_request} each); with max_num_seqs {max_seqs:.0f} more are admitted than fit, "
                "and they are preempted and recomputed. At that cap none is preempted and the rest wait in the queue; fewer run "
                "at once, so compare tokens/s after the change (more KV, below, keeps both)."
            )
        if running is not None and waiting is not None and running + waiting > fit:
            replicas = math.ceil((running + waiting) / fit)
            j.advise(
                f"{replicas} replicas of this size hold the observed demand at once: {running:.1f} running + {waiting:.1f} waiting = "
                f"{running + waiting:.1f} requests in the system, {fit:.0f} fit in one replica's KV cache."
            )
    free, utilization = s.get("gpu_memory_free_ratio"), s.get("gpu_memory_utilization")
    if free is not None and utilization is not None and 1.0 - free < utilization - 0.02:
        # On the H200 lent here NVML read 2 % used under a vLLM holding 50 %: a view that misses vLLM's own
        # allocation says nothing about what is free beside it.
        j.note(f"no --gpu-memory-utilization advice: NVML reads {1 - free:.0%} used, less than the {utilization:.0%} vLLM reserves")
    elif free is not None and utilization is not None and free > 0.1:
        target = min(0.95, utilization + free - 0.05)
        j.advise(
            f"--gpu-memory-utilization {target:.2f} (now {utilization:.2f}): NVML shows {free:.0%} of the GPU's memory free; leaving 5 % "
            "spare, the rest goes to the KV cache (check that nothing else uses this GPU)."
        )


def _full_within_a_block(j: Judge, threshold: str) -> float | None:
    """A peak threshold no stricter than "one block free": usage moves in steps of one block, and a
    small saturated cache (47 blocks on a real H200 run: steps of 0.021) is rarely sampled at 1.0."""
    one_block = j.signals.get("kv_cache_one_block_below_full_ratio")
    if one_block is None or one_block >= j.thresholds[threshold]:
        return None
    j.note(f"full is judged within one KV block: {one_block:.3f} is one block below full", "kv_cache_one_block_below_full_ratio", one_block)
    return one_block - 1e-9


# What _advise_capacity reads beside a condition's own evidence.
_ADVICE_READS = (
    "kv_requests_that_fit",
    "prompt_tokens_mean",
    "generation_tokens_mean",
    "kv_capacity_tokens",
    "block_size_tokens",
    "gpu_memory_free_ratio",
    "gpu_memory_utilization",
)


_CAPACITY_ACTIONS = (
    "Capacity is the limit: lower --max-num-seqs or --max-num-batched-tokens.",
    "Raise --gpu-memory-utilization if GPU memory allows; use an fp8 KV cache (--kv-cache-dtype fp8).",
    "Enable prefix caching; route long-context requests elsewhere; add replicas.",
)


KV_CACHE_SATURATED = Condition(
    id="kv_cache_saturated",
    precedence=40,
    notes=("max_num_seqs",),
    layer="1",
    severity="warning",
    summary="KV cache is full and requests are queueing or being preempted",
    meaning="Every KV block is in use; new requests wait and running ones are preempted (recomputed on V1).",
    next_actions=_CAPACITY_ACTIONS,
    predicate=_kv_cache_saturated,
    reads=(
        "kv_cache_usage_ratio_mean",
        "kv_cache_usage_ratio_max",
        "requests_waiting_mean",
        "preemptions_per_second",
        "requests_waiting_capacity_mean",
        "kv_cache_usage_ratio_min",
        "kv_cache_one_block_below_full_ratio",
        "max_num_seqs",
        "requests_running_mean",
        *_ADVICE_READS,
    ),
    dont=(
        "Do not judge by GPU memory used: vLLM preallocates gpu_memory_utilization of the card at start. KV usage is the signal.",
        "There is no vllm:cache_usage metric: it is vllm:kv_cache_usage_perc (vllm:gpu_cache_usage_perc before ~0.10).",
    ),
    thresholds=(
        Threshold("usage_min", 0.8, "KV usage window mean at or above this", 0.0, 1.0),
        Threshold("usage_peak_min", 0.99, "KV usage window maximum at or above this (the cache filled up)", 0.0, 1.0),
        Threshold("waiting_min", 0.0, "mean waiting requests above this"),
        Threshold("preemptions_per_second_min", 0.0, "preemptions per second above this"),
        Threshold(
            "thrash_preemptions_per_second_min",
            0.1,
            "or, whatever the usage gauge reads: preemptions per second at or above this while requests wait (vLLM preempts only when no block is free)",
        ),
    ),
)


def _queue_backlog(j: Judge) -> Term:
    backlog = j.compare("requests_waiting_nonempty_ratio", ">=", "waiting_share_min", "share of the window's readings with requests waiting", upper=1.0)
    if backlog.holds and (low := j.signals.get("requests_waiting_min")) == 0:
        j.note("vLLM's waiting gauge read 0 at some readings of the window: under KV thrash it collapses between scrapes", "requests_waiting_min", low)
    deferred, waiting = j.signals.get("requests_waiting_deferred_mean"), j.signals.get("requests_waiting_mean")
    if backlog.holds and deferred is not None and waiting and deferred >= j.thresholds["deferred_share_for_deferred_cause"] * waiting:
        # vLLM says why they wait (0.26+): deferred requests are not held up by capacity, so no capacity cause applies
        j.cause = "deferred"
        j.note(
            f"cause deferred: {deferred:.1f} of {waiting:.1f} waiting requests are deferred by vLLM (LoRA budget, KV transfer, grammar), "
            "not waiting for capacity",
            "requests_waiting_deferred_mean",
            deferred,
        )
    elif backlog.holds:
        capacity = j.signals.get("requests_waiting_capacity_mean")
        if capacity is not None:
            j.note(f"vLLM says {capacity:.1f} of the waiting requests wait for capacity", "requests_waiting_capacity_mean", capacity)
        usage = j.signals.get("kv_cache_usage_ratio_mean")
        peak = j.signals.get("kv_cache_usage_ratio_max")
        running = j.signals.get("requests_running_mean")
        max_seqs = j.signals.get("max_num_seqs")
        preemptions = j.signals.get("preemptions_per_second")
        if preemptions is not None and preemptions >= j.thresholds["preemptions_for_capacity_cause"]:
            j.cause = "kv_capacity"
            j.note(
                f"cause kv_capacity: vLLM preempts {preemptions:.2f} requests per second: it preempts only when no KV block is free",
                "preemptions_per_second",
                preemptions,
            )
            _advise_capacity(j)
        elif (
            usage is not None
            and peak is not None
            and usage >= j.thresholds["kv_usage_for_capacity_cause"]
            and peak >= min(j.thresholds["kv_peak_for_capacity_cause"], (j.signals.get("kv_cache_one_block_below_full_ratio") or 1.0) - 1e-9)
        ):
            j.cause = "kv_capacity"
            j.note(
                f"cause kv_capacity: KV cache usage averages {usage:.2f} and reached {peak:.2f}: requests wait for KV blocks",
                "kv_cache_usage_ratio_mean",
                usage,
            )
            _advise_capacity(j)
        elif (limit := _gpu_limit(j, "gpu_compute")) is not None and not _budget_before_compute(j):
            j.cause = "gpu_compute"
            j.note(f"cause gpu_compute: {limit}: the GPU computes at its limit while requests wait; more sequences or tokens per step add no FLOPs")
            _advise_replicas(j, "the GPU's compute")
        elif (
            running is not None
            and max_seqs is not None
            and (running >= j.thresholds["running_ratio_for_cap_cause"] * max_seqs or (j.signals.get("requests_running_max") or 0.0) >= max_seqs)
        ):
            # at the cap on average, or at it at all while the queue held (a queue that formed within the window)
            j.cause = "concurrency_cap"
            j.note(
                f"cause concurrency_cap: {running:.1f} running on average (at most {j.signals.get('requests_running_max') or 0.0:.0f}), "
                f"at max_num_seqs {max_seqs:.0f}",
                "requests_running_mean",
                running,
            )
            fit = j.signals.get("kv_requests_that_fit")
            if fit is not None and fit > max_seqs:
                j.advise(f"--max-num-seqs {fit:.0f}: the KV cache holds {fit:.0f} requests of the observed length, the cap admits {max_seqs:.0f}.")
        elif (full := j.signals.get("tokens_per_step_to_budget_ratio")) is not None and full >= j.thresholds["budget_ratio_for_cause"]:
            j.cause = "token_budget"
            budget = j.signals.get("max_num_batched_tokens") or 0.0
            per_step = j.signals.get("tokens_per_step_mean") or 0.0
            j.note(
                f"cause token_budget: steps carry {per_step:.0f} tokens on average of the {budget:.0f} --max-num-batched-tokens allows ({full:.0%}): "
                "every step is full, and prompts wait for the budget",
                "tokens_per_step_to_budget_ratio",
                full,
            )
            prompt = j.signals.get("prompt_tokens_mean")
            if prompt:
                wanted = max(2 * budget, math.ceil(prompt / BATCHED_TOKENS_STEP) * BATCHED_TOKENS_STEP)
                j.advise(
                    f"--max-num-batched-tokens {wanted:.0f} (now {budget:.0f}): a prompt of {prompt:.0f} tokens on average takes "
                    f"{math.ceil(prompt / budget):.0f} steps to prefill at {budget:.0f}; a larger budget admits more prompts per step "
                    "(watch ITL: a step with a long prefill chunk delays every decode in it)."
                )
        elif (limit := _gpu_limit(j, "gpu_bandwidth")) is not None:
            j.cause = "gpu_bandwidth"
            j.note(f"cause gpu_bandwidth: {limit}: decode is memory-bound at this batch while requests wait")
            _advise_replicas(j, "the GPU's memory bandwidth")
        elif (
            (core := j.signals.get("host_engine_core_busiest_thread_cpu_ratio")) is not None
            and core >= j.thresholds["scheduler_thread_min"]
            and ((utilization := j.signals.get("gpu_utilization_ratio_mean")) is None or utilization < j.thresholds["kernel_resident_max"])
        ):
            j.cause = "scheduler_bound"
            j.note(f"cause scheduler_bound: the engine core's busiest thread uses {core:.2f} of a core", "host_engine_core_busiest_thread_cpu_ratio", core)
        elif (api := j.signals.get("host_api_server_busiest_thread_cpu_ratio")) is not None and api >= j.thresholds["scheduler_thread_min"]:
            j.cause = "api_server"
            j.note(f"cause api_server: the API server's busiest thread uses {api:.2f} of a core", "host_api_server_busiest_thread_cpu_ratio", api)
        else:
            j.cause = "unknown"
            j.note("no clear bottleneck: " + _ruled_out(j))
    return backlog


def _budget_before_compute(j: Judge) -> bool:
    """Steps pinned at --max-num-batched-tokens while the tensor cores have compute to spare: the budget limits each step
    before the GPU does (bigger steps run the GEMMs more efficiently). Measured on the H200's 70B-shaped layers: tensor
    activity 0.58-0.62 at 256-token steps, 0.82 at 8,192-token steps at the compute limit."""
    full = j.signals.get("tokens_per_step_to_budget_ratio")
    tensor = j.signals.get("gpu_tensor_active_ratio_mean")
    return full is not None and full >= j.thresholds["budget_ratio_for_cause"] and (tensor is None or tensor < j.thresholds["budget_tensor_saturated_min"])


# Where the GPU layer explains a queue or a slow step (queue_backlog's and itl_high's gpu_compute and gpu_bandwidth causes).
GPU_LIMIT_THRESHOLDS = (
    Threshold("gpu_tensor_min", 0.6, "cause gpu_compute when tensor-core activity is at or above this", 0.0, 1.0),
    Threshold("gpu_sm_min", 0.8, "... or SM activity at or above this with DRAM bandwidth below gpu_dram_min", 0.0, 1.0),
    Threshold("gpu_dram_min", 0.7, "cause gpu_bandwidth when DRAM bandwidth is at or above this (tensor cores below half gpu_tensor_min)", 0.0, 1.0),
)


def _gpu_limit(j: Judge, kind: str) -> str | None:
    """Where the GPU layer explains a queue: its compute at the limit (tensor cores, or SMs busy with DRAM to spare) or
    its memory bandwidth at the limit with idle tensor cores; the words that say so, else None."""
    tensor, sm, dram = (j.signals.get(f"gpu_{name}_ratio_mean") for name in ("tensor_active", "sm_active", "dram_bandwidth_utilization"))
    t = j.thresholds
    if kind == "gpu_compute":
        if tensor is not None and tensor >= t["gpu_tensor_min"]:
            return f"tensor-core activity {tensor:.2f} (>= {t['gpu_tensor_min']:g})"
        if sm is not None and dram is not None and sm >= t["gpu_sm_min"] and dram < t["gpu_dram_min"]:
            return f"SM activity {sm:.2f} (>= {t['gpu_sm_min']:g}) with DRAM bandwidth at {dram:.2f}"
        return None
    if dram is not None and dram >= t["gpu_dram_min"] and (tensor is None or tensor < t["gpu_tensor_min"] / 2):
        return f"DRAM bandwidth utilisation {dram:.2f} (>= {t['gpu_dram_min']:g}) with tensor-core activity {0.0 if tensor is None else tensor:.2f}"
    return None


def _advise_replicas(j: Judge, limit: str) -> None:
    """Replicas that serve the observed demand when one replica's GPU is the limit: each serves what runs now."""
    running, waiting = j.signals.get("requests_running_mean"), j.signals.get("requests_waiting_mean")
    if running and waiting is not None and running > 0:
        replicas = math.ceil((running + waiting) / running)
        j.advise(
            f"{replicas} replicas of this size serve the observed demand: {running:.1f} running + {waiting:.1f} waiting = "
            f"{running + waiting:.1f} requests, {running:.1f} at a time per replica at {limit}'s limit (or a faster GPU, or tensor parallelism)."
        )


def _ruled_out(j: Judge) -> str:
    """What a queue_backlog without a cause was checked against, each with its reading."""
    s = j.signals
    checked = []
    for what, signal, fmt in (
        ("KV usage", "kv_cache_usage_ratio_mean", "{:.2f}"),
        ("running / max_num_seqs", "running_to_max_num_seqs_ratio", "{:.2f}"),
        ("tokens per step / budget", "tokens_per_step_to_budget_ratio", "{:.2f}"),
        ("tensor activity", "gpu_tensor_active_ratio_mean", "{:.2f}"),
        ("SM activity", "gpu_sm_active_ratio_mean", "{:.2f}"),
        ("DRAM bandwidth", "gpu_dram_bandwidth_utilization_ratio_mean", "{:.2f}"),
        ("engine core's thread", "host_engine_core_busiest_thread_cpu_ratio", "{:.2f} of a core"),
        ("API server's thread", "host_api_server_busiest_thread_cpu_ratio", "{:.2f} of a core"),
    ):
        value = s.get(signal)
        checked.append(f"{what} {fmt.format(value)}" if value is not None else f"{what} not read")
    return "checked and ruled out: " + ", ".join(checked)


QUEUE_BACKLOG = Condition(
    id="queue_backlog",
    precedence=70,
    precedence_by_cause=(("concurrency_cap", 45), ("token_budget", 46)),
    suppressed_by=(FROZEN,),
    notes=("max_num_seqs",),
    layer="1",
    severity="warning",
    summary="Requests wait in vLLM's queue for most of the window",
    meaning=(
        "Requests waited at most readings of the window: demand exceeds what the server admits. A single reading of 0 does "
        "not empty a queue (vLLM's gauge collapses between scrapes under KV thrash)."
    ),
    next_actions=(
        "cause=kv_capacity: KV cache is the limit; see kv_cache_saturated's actions.",
        "cause=concurrency_cap: running reached max_num_seqs; raise --max-num-seqs if KV cache allows.",
        "cause=gpu_compute: the GPU computes at its limit: add replicas (the advice counts them), tensor parallelism or a faster GPU; "
        "raising --max-num-seqs or the token budget adds no FLOPs.",
        "cause=token_budget: every step is full: raise --max-num-batched-tokens (the advice computes it); long prompts take several steps each.",
        "cause=gpu_bandwidth: decode is memory-bound: fp8 weights or KV cache, speculative decoding, more replicas.",
        "cause=scheduler_bound: the engine core's thread is saturated: see gpu_starved.",
        "cause=api_server: the API server's thread is saturated: raise --api-server-count (see gpu_starved).",
        "cause=deferred: vLLM defers them (vllm:num_requests_waiting_by_reason): LoRA budget (raise --max-loras), "
        "KV transfer from a prefill instance (check the connector), structured-output grammar compilation.",
        "cause=unknown: no clear bottleneck: the evidence lists what was checked and ruled out; take a torch profiler trace "
        "(`vllm-triage trace`) and read vLLM's log for the scheduler's view.",
    ),
    predicate=_queue_backlog,
    reads=(
        "requests_waiting_nonempty_ratio",
        "requests_waiting_mean",
        "requests_running_mean",
        "requests_running_max",
        "requests_waiting_min",
        "preemptions_per_second",
        "requests_waiting_deferred_mean",
        "requests_waiting_capacity_mean",
        "kv_cache_usage_ratio_mean",
        "kv_cache_usage_ratio_max",
        "kv_cache_one_block_below_full_ratio",
        "max_num_seqs",
        "host_engine_core_busiest_thread_cpu_ratio",
        "host_api_server_busiest_thread_cpu_ratio",
        "gpu_tensor_active_ratio_mean",
        "gpu_sm_active_ratio_mean",
        "gpu_dram_bandwidth_utilization_ratio_mean",
        "gpu_utilization_ratio_mean",
        "tokens_per_step_to_budget_ratio",
        "tokens_per_step_mean",
        "max_num_batched_tokens",
        "running_to_max_num_seqs_ratio",
        *_ADVICE_READS,
    ),
    dont=("Do not raise --max-num-seqs when the cause is kv_capacity: more sequences compete for the same blocks.",),
    thresholds=(
        Threshold("waiting_share_min", 0.6, "share of the window's readings with requests waiting at or above this", 0.0, 1.0),
        Threshold("preemptions_for_capacity_cause", 0.1, "preemptions per second at or above which the cause is kv_capacity (no free block)"),
        Threshold("kv_usage_for_capacity_cause", 0.8, "KV usage window mean at or above which the cause is kv_capacity", 0.0, 1.0),
        Threshold("kv_peak_for_capacity_cause", 0.95, "... and KV usage window peak at or above this", 0.0, 1.0),
        Threshold("running_ratio_for_cap_cause", 0.9, "else mean running / max_num_seqs at or above which the cause is concurrency_cap", 0.0, 1.0),
        Threshold(
            "scheduler_thread_min", 0.85, "else the engine core's busiest thread (share of a core) at or above which the cause is scheduler_bound", 0.0, 1.0
        ),
        *GPU_LIMIT_THRESHOLDS,
        Threshold("budget_ratio_for_cause", 0.85, "cause token_budget when mean tokens per step / --max-num-batched-tokens is at or above this", 0.0, 1.0),
        Threshold(
            "budget_tensor_saturated_min",
            0.75,
            "steps at the token budget are its cause before the GPU's compute unless tensor-core activity is at or above this",
            0.0,
            1.0,
        ),
        Threshold(
            "kernel_resident_max",
            0.5,
            "cause scheduler_bound only while util.gpu is below this: a saturated thread beside a GPU with a kernel resident longer spins in its syncs",
            0.0,
            1.0,
        ),
        Threshold(
            "deferred_share_for_deferred_cause",
            0.5,
            "first: deferred / waiting (vLLM's waiting_by_reason) at or above which the cause is deferred",
            0.0,
            1.0,
        ),
    ),
    causes=("kv_capacity", "gpu_compute", "concurrency_cap", "token_budget", "gpu_bandwidth", "scheduler_bound", "api_server", "deferred", "unknown"),
    # The window share already asks for 36 s of queueing in the last minute; the `for` adds persistence on top, so
    # a queue that never empties is reported 0.6 W + 30 s after it formed (the two together: 66 s of it).
    for_seconds=30,
)


def _preemption_storm(j: Judge) -> Term:
    return any_of(
        j.compare("preemptions_per_second", ">", "preemptions_per_second_max", "preemptions per second"),
        j.compare(
            "preemptions_per_finished_request",
            ">",
            "preemptions_per_finished_request_max",
            "preemptions per finished request",
        ),
    )


PREEMPTION_STORM = Condition(
    id="preemption_storm",
    precedence=60,
    layer="1",
    severity="warning",
    summary="vLLM is preempting requests at a high rate",
    meaning="Running requests lose their KV blocks to make room; V1 recomputes them, burning GPU time twice.",
    next_actions=(
        "KV thrashing: same levers as kv_cache_saturated (fewer concurrent sequences, more KV memory).",
        "V1 engines do not swap, they recompute: swap-space settings will not help.",
    ),
    predicate=_preemption_storm,
    reads=("preemptions_per_second", "preemptions_per_finished_request"),
    dont=(
        "Do not tune swap space: V1 engines recompute preempted requests, swap counters exist only on V0.",
        "Do not reach for --num-scheduler-steps: it exists only on old V0 engines (V1 has async scheduling).",
    ),
    thresholds=(
        Threshold("preemptions_per_second_max", 1.0, "preemptions per second above this"),
        Threshold("preemptions_per_finished_request_max", 0.05, "preemptions per finished request above this"),
    ),
    clear_seconds=120,
)


def _client_underload(j: Judge) -> Term:
    running = j.value("requests_running_mean")
    finished = j.value("finished_requests_per_second")
    if running is None and finished is None:
        return j.fact(None, "no running/finished request counts", "requests_running_mean")
    traffic = (running or 0) > 0 or (finished or 0) > 0
    if not traffic:
        j.fact(False, "no traffic in the window: the server is idle, not underloaded", "finished_requests_per_second", finished)
        return Term(False, 0.0)
    terms = [
        j.compare("running_to_max_num_seqs_ratio", "<", "running_ratio_max", "mean running / max_num_seqs", upper=1.0),
        j.compare("requests_waiting_max", "<=", "waiting_max", "requests waiting (window maximum)"),
    ]
    if j.signals.get("gpu_sm_activity_ratio") is not None:
        terms.append(j.compare("gpu_sm_activity_ratio", "<", "sm_activity_max", sm_activity_words(j), upper=1.0))
    else:
        j.note("GPU evidence unavailable: judged on vLLM's metrics alone")
    return all_of(*terms)


def _requests_queue(signals: Mapping[str, float | None]) -> str | None:
    """Requests waiting on average contradict underload: the server turns work away."""
    waiting = signals.get("requests_waiting_mean")
    return f"{waiting:.1f} requests waiting on average: the server, not the clients, is the limit" if waiting is not None and waiting >= 1 else None


CLIENT_UNDERLOAD = Condition(
    id="client_underload",
    precedence=170,
    suppressed_by=(
        FROZEN,
        ("gpu_starved", "pending work with idle SMs and a saturated host thread is starvation, not underload"),
        ("queue_backlog", "requests wait in the queue: the server, not the clients, is the limit"),
    ),
    notes=("max_num_seqs",),
    layer="1+3",
    severity="info",
    summary="Clients send too little concurrency to keep vLLM busy",
    meaning="Few requests run at once and none wait: the server is not the bottleneck.",
    next_actions=(
        "Raise client concurrency (or batch requests) before tuning vLLM.",
        "Check the load balancer spreads requests over fewer replicas if this persists.",
    ),
    predicate=_client_underload,
    reads=(
        "running_to_max_num_seqs_ratio",
        "requests_waiting_max",
        "gpu_sm_activity_ratio",
        "requests_running_mean",
        "finished_requests_per_second",
        "requests_waiting_mean",
        "gpu_sm_activity_from_gpm",
    ),
    contradicted=_requests_queue,
    dont=("Do not tune vLLM first: it is waiting for work.",),
    thresholds=(
        Threshold("running_ratio_max", 0.25, "mean running / max_num_seqs below this", 0.0, 1.0),
        Threshold("waiting_max", 0.0, "waiting requests (window maximum) at most this"),
        Threshold("sm_activity_max", 0.5, "GPU SM activity below this (when GPU readings exist)", 0.0, 1.0),
    ),
    for_seconds=120,
    clear_seconds=60,
)


def _with_observations(j: Judge, signal: str, what: str) -> bool | None:
    count = j.value(signal)
    if count is None:
        return None
    if count <= 0:
        j.fact(False, f"no {what} observed in the window", signal, count)
        return False
    return True


def _ttft_high(j: Judge) -> Term:
    seen = _with_observations(j, "ttft_seconds_observations", "first tokens")
    if seen is not True:
        return Term(seen, 0.0)
    term = j.compare("ttft_seconds_p95", ">", "ttft_p95_max_seconds", "TTFT p95", " s")
    queue, prefill = j.signals.get("queue_time_seconds_mean"), j.signals.get("prefill_time_seconds_mean")
    outside, ttft = j.signals.get("ttft_outside_engine_seconds_mean"), j.signals.get("ttft_seconds_mean")
    if term.holds and queue is not None and prefill is not None:
        # TTFT = time outside the engine (vLLM stamps arrival in the API server) + its queue time + its prefill time
        parts = {"queueing": queue, "prefill": prefill, "outside": outside or 0.0}
        largest = max(parts, key=lambda k: parts[k])
        split = f"mean TTFT {ttft or 0.0:.3f} s = {outside or 0.0:.3f} s outside the engine + {queue:.3f} s queued + {prefill:.3f} s prefill"
        if largest != "outside":
            j.cause = largest
            j.note(f"cause {largest} dominates: {split}", "queue_time_seconds_mean", queue)
        else:
            api = j.signals.get("host_api_server_busiest_thread_cpu_ratio_recent")
            saturated = api is not None and api >= j.thresholds["api_server_thread_min"]
            j.cause = "api_server" if saturated else "frontend"
            j.note(
                f"cause {j.cause}: {split}: the time is spent before the engine sees the request"
                + (
                    f", and the API server's busiest thread uses {api:.2f} of a core (tokenising, detokenising, one SSE chunk per token)"
                    if saturated
                    else " (tokenising, the API server's event loop, the input queue; its busiest thread "
                    + ("is not visible)" if api is None else f"uses {api:.2f} of a core)")
                ),
                "ttft_outside_engine_seconds_mean",
                outside,
            )
    return term


TTFT_HIGH = Condition(
    id="ttft_high",
    precedence=130,
    layer="1",
    severity="warning",
    summary="Time to first token p95 is above the SLO",
    meaning="Users wait too long for the first token; the cause says whether queueing or prefill dominates.",
    next_actions=(
        "cause=queueing: requests wait in vLLM's queue: queue_backlog's cause says for what (KV, the cap, the GPU, the budget).",
        "cause=prefill: long prompts; enable chunked prefill and prefix caching, cap --max-num-batched-tokens.",
        "cause=api_server: the time is spent before the engine, in a saturated API server: raise --api-server-count (gpu_starved's "
        "advice computes N); fewer streamed chunks or logprobs per request.",
        "cause=frontend: the time is spent before the engine while the API server's thread is not saturated: tokenisation of "
        "long prompts, a blocked event loop, a proxy or the client's network; py-spy the API server.",
    ),
    predicate=_ttft_high,
    reads=(
        "ttft_seconds_p95",
        "queue_time_seconds_mean",
        "prefill_time_seconds_mean",
        "ttft_seconds_observations",
        "ttft_seconds_mean",
        "ttft_outside_engine_seconds_mean",
        "host_api_server_busiest_thread_cpu_ratio_recent",
    ),
    thresholds=(
        Threshold("ttft_p95_max_seconds", 2.0, "TTFT p95 SLO in seconds"),
        Threshold("api_server_thread_min", 0.85, "cause api_server (time outside the engine) when the API server's busiest thread is at least this", 0.0, 1.0),
    ),
    causes=("queueing", "prefill", "api_server", "frontend"),
)


def _itl_high(j: Judge) -> Term:
    seen = _with_observations(j, "inter_token_latency_seconds_observations", "inter-token latencies")
    if seen is not True:
        return Term(seen, 0.0)
    high = j.compare("inter_token_latency_seconds_p95", ">", "itl_p95_max_seconds", "inter-token latency p95", " s")
    if high.holds:
        _itl_cause(j)
    return high


def _itl_cause(j: Judge) -> None:
    """ITL against the engine's own step: a token streams once per step, so an ITL well above the step time is spent
    outside the engine; inside, a step is long because prefill chunks ride in it or because the GPU is at its limit."""
    s, t = j.signals, j.thresholds
    itl, step = s.get("inter_token_latency_seconds_p50"), s.get("engine_step_seconds_mean")
    per_step, running = s.get("tokens_per_step_mean"), s.get("requests_running_mean")
    if itl is not None and step and itl >= t["outside_engine_factor"] * step:
        api = s.get("host_api_server_busiest_thread_cpu_ratio_recent")
        j.cause = "api_server" if api is not None and api >= t["api_server_thread_min"] else "frontend"
        j.note(
            f"cause {j.cause}: ITL p50 {itl * 1000:.0f} ms against {step * 1000:.0f} ms per engine step: tokens wait outside the engine"
            + (f"; the API server's busiest thread uses {api:.2f} of a core" if api is not None else ""),
            "engine_step_seconds_mean",
            step,
        )
        return
    prefill_share = (per_step - running) / per_step if per_step and running is not None and per_step > running else 0.0
    p95 = s.get("inter_token_latency_seconds_p95")
    spikes = itl is not None and p95 is not None and s.get("prefill_time_seconds_mean") and p95 >= t["spike_factor"] * itl
    if (step and prefill_share >= t["prefill_share_of_step_min"]) or spikes:
        j.cause = "prefill_chunks"
        if step and prefill_share >= t["prefill_share_of_step_min"]:
            j.note(
                f"cause prefill_chunks: steps carry {per_step:.0f} tokens for {running:.0f} running sequences ({prefill_share:.0%} prefill) "
                f"and take {step * 1000:.0f} ms each: every decode waits for the prompts prefilled beside it",
                "tokens_per_step_mean",
                per_step,
            )
        else:
            j.note(
                f"cause prefill_chunks: ITL p95 {p95 or 0.0:.3f} s against p50 {itl or 0.0:.3f} s: the slow steps are those that carry a prefill chunk",
                "inter_token_latency_seconds_p95",
                p95,
            )
        _advise_batched_tokens(j)
    elif (gpu := next(((kind, limit) for kind in ("gpu_compute", "gpu_bandwidth") if (limit := _gpu_limit(j, kind)) is not None), None)) is not None:
        j.cause = gpu[0]
        j.note(f"cause {gpu[0]}: {gpu[1]}: each decode step of {running or 0.0:.0f} sequences is as fast as the GPU allows")
    else:
        j.cause = "unknown"
        checked = f"engine step {step * 1000:.0f} ms" if step else "no engine step rate"
        j.note(f"no clear bottleneck: {checked}, {prefill_share:.0%} of a step is prefill, the GPU is not at a compute or bandwidth limit")


# vLLM schedules prefill in chunks of at most --max-num-batched-tokens per step, beside the decodes.
BATCHED_TOKENS_STEP = 256


def _advise_batched_tokens(j: Judge) -> None:
    """The --max-num-batched-tokens that keeps a step with a prefill chunk within the ITL SLO: decode steps take
    the ITL's median, and a chunk adds its tokens x the prefill time per prompt token observed."""
    s = j.signals
    median, prefill, prompt = s.get("inter_token_latency_seconds_p50"), s.get("prefill_time_seconds_mean"), s.get("prompt_tokens_mean")
    slo = j.thresholds["itl_p95_max_seconds"]
    if median is None or prefill is None or not prompt or median >= slo:
        return
    per_token = prefill / prompt
    chunk = int((slo - median) / per_token) // BATCHED_TOKENS_STEP * BATCHED_TOKENS_STEP
    if chunk >= BATCHED_TOKENS_STEP:
        j.advise(
            f"--max-num-batched-tokens {chunk}: decode steps take {median * 1000:.0f} ms (ITL p50) and prefill costs "
            f"{per_token * 1e6:.0f} us per prompt token ({prefill:.3f} s for {prompt:.0f} tokens on average), so a chunk of "
            f"{chunk} tokens keeps a step within the {slo * 1000:.0f} ms SLO; longer prompts then take more steps to start."
        )


ITL_HIGH = Condition(
    id="itl_high",
    precedence=140,
    layer="1+3",
    severity="warning",
    summary="Inter-token latency p95 is above the SLO",
    meaning="Tokens stream slowly once generation started.",
    next_actions=(
        "cause=prefill_chunks: prompts are prefilled in the same steps as decodes: lower --max-num-batched-tokens (the advice "
        "computes it) or split prefill and decode (disaggregated serving); TTFT rises as ITL falls.",
        "cause=gpu_compute: each step is as fast as the GPU computes: lower --max-num-seqs to trade throughput for latency, or add replicas.",
        "cause=gpu_bandwidth: decode is memory-bound: fp8 weights or KV cache, speculative decoding, a smaller batch.",
        "cause=api_server: tokens wait in a saturated API server: raise --api-server-count; fewer streamed chunks or logprobs.",
        "cause=frontend: tokens wait outside the engine while the API server's thread is not saturated: the proxy, the "
        "client's reading, the event loop; py-spy the API server.",
        "cause=unknown: read gpu_starved and preemption_storm; take a torch profiler trace (`vllm-triage trace`).",
    ),
    predicate=_itl_high,
    reads=(
        "inter_token_latency_seconds_p95",
        "inter_token_latency_seconds_p50",
        "engine_step_seconds_mean",
        "inter_token_latency_seconds_observations",
        "tokens_per_step_mean",
        "requests_running_mean",
        "host_api_server_busiest_thread_cpu_ratio_recent",
        "gpu_tensor_active_ratio_mean",
        "gpu_sm_active_ratio_mean",
        "gpu_dram_bandwidth_utilization_ratio_mean",
        "prefill_time_seconds_mean",
        "prompt_tokens_mean",
    ),
    dont=("Worker CPU near 100 % is not a CPU bottleneck: workers spin while they wait on the GPU.",),
    thresholds=(
        Threshold("itl_p95_max_seconds", 0.1, "inter-token latency p95 SLO in seconds"),
        Threshold("outside_engine_factor", 1.5, "cause api_server or frontend when ITL p50 is at least this many engine steps"),
        Threshold("prefill_share_of_step_min", 0.5, "cause prefill_chunks when prefill tokens are at least this share of a step's tokens", 0.0, 1.0),
        Threshold("spike_factor", 3.0, "... or when ITL p95 is at least this many times its p50 while prompts are prefilled (slow steps among fast ones)"),
        Threshold("api_server_thread_min", 0.85, "cause api_server (not frontend) when the API server's busiest thread is at least this", 0.0, 1.0),
        *GPU_LIMIT_THRESHOLDS,
    ),
    causes=("prefill_chunks", "gpu_compute", "gpu_bandwidth", "api_server", "frontend", "unknown"),
)


def _request_errors(j: Judge) -> Term:
    finished = j.value("finished_requests_per_second")
    if finished is not None and finished <= 0:
        return j.fact(False, "no request finished in the window", "finished_requests_per_second", finished)
    return j.compare("request_error_ratio", ">", "error_ratio_max", "share of requests finished with an error", upper=1.0)


REQUEST_ERRORS = Condition(
    id="request_errors",
    precedence=30,
    layer="1",
    severity="warning",
    summary="Requests finish with errors",
    meaning="A share of requests ends with finished_reason=error.",
    next_actions=("Read vLLM's logs; correlate with preemptions and out-of-memory events.",),
    predicate=_request_errors,
    reads=("request_error_ratio", "finished_requests_per_second"),
    thresholds=(Threshold("error_ratio_max", 0.01, "share of finished requests with an error above this", 0.0, 1.0),),
    clear_seconds=120,
)


def _prefix_cache_ineffective(j: Judge) -> Term:
    enabled = j.value("prefix_caching_enabled")
    on = j.fact(None if enabled is None else enabled > 0, f"prefix caching is {'on' if enabled else 'off'}", "prefix_caching_enabled", enabled)
    if on.holds is not True:
        return on
    queried = j.compare("prefix_cache_queries_per_second", ">", "queries_per_second_min", "prefix-cache queries per second")
    if queried.holds is not True:
        return queried
    # Only a cache that has hit before and stopped hitting is ineffective; one that never hit serves
    # prompts that share no prefix (random or unique prompts), which is expected, not a fault.
    ever = j.value("prefix_cache_hits_since_start")
    if ever is not None and ever <= 0:
        return j.fact(False, "no prompt has reused a cached prefix since vLLM started: expected for unique prompts", "prefix_cache_hits_since_start", ever)
    computed = j.signals.get("prompt_tokens_local_compute_ratio")
    if computed is not None:
        j.note(f"{computed:.0%} of the window's prompt tokens were computed here, not served from a cache", "prompt_tokens_local_compute_ratio", computed)
    external = j.signals.get("external_prefix_cache_hit_ratio")
    if external is not None:
        j.note(f"the external prefix cache (KV connector) hit {external:.0%} of its queries", "external_prefix_cache_hit_ratio", external)
    if j.signals.get("prompt_tokens_cached_ratio") is not None:  # token-level, local and external caches (vLLM 0.11+)
        return j.compare("prompt_tokens_cached_ratio", "<", "hit_ratio_max", "share of prompt tokens served from a cache", upper=1.0)
    return j.compare("prefix_cache_hit_ratio", "<", "hit_ratio_max", "prefix-cache hit ratio", upper=1.0)


PREFIX_CACHE_INEFFECTIVE = Condition(
    id="prefix_cache_ineffective",
    precedence=190,
    layer="1",
    severity="info",
    summary="Prefix caching stopped hitting",
    meaning="The prefix cache has hit since vLLM started but now almost never does: pressure evicts cached blocks before reuse, or the traffic changed.",
    next_actions=(
        "The cache hit before and stopped: KV pressure evicts the shared prefixes (see kv_cache_saturated), or the "
        "traffic changed (a new system prompt, a router that no longer keeps a user's requests on this replica).",
        "Never judged on a cache that never hit: that is expected for unique prompts.",
    ),
    predicate=_prefix_cache_ineffective,
    reads=(
        "prompt_tokens_cached_ratio",
        "prefix_cache_hit_ratio",
        "prefix_cache_queries_per_second",
        "prefix_caching_enabled",
        "prefix_cache_hits_since_start",
        "prompt_tokens_local_compute_ratio",
        "external_prefix_cache_hit_ratio",  # only where a KV connector shares a cache: last, the drill-down shows the first
    ),
    thresholds=(
        Threshold("queries_per_second_min", 0.0, "prefix-cache queries per second above this"),
        Threshold("hit_ratio_max", 0.05, "hit ratio below this", 0.0, 1.0),
    ),
    for_seconds=300,
    clear_seconds=300,
)


def _kv_fragmentation_suspected(j: Judge) -> Term:
    usage = j.compare("kv_cache_usage_ratio_mean", ">=", "usage_min", "KV cache usage (window mean)", upper=1.0)
    live = j.compare("kv_live_token_ratio", "<", "live_token_ratio_max", "tokens the running requests hold / KV tokens in use", upper=1.0)
    waste = j.compare("kv_last_block_waste_ratio", ">=", "block_waste_ratio_min", "half-empty last blocks / KV capacity", upper=1.0)
    # Only evidence of fragmentation itself: the seeds' row "util.gpu < 30 % with a full cache" holds
    # for every CPU-bound engine (a real one on the H200: SM active 0.3 %, live tokens 0.93 of the
    # blocks in use) and is gpu_starved's story, not this one's.
    if usage.holds:
        j.cause = "live_tokens" if live.holds else "block_waste" if waste.holds else None
    return all_of(usage, any_of(live, waste))


KV_FRAGMENTATION_SUSPECTED = Condition(
    id="kv_fragmentation_suspected",
    precedence=120,
    layer="1+3",
    severity="warning",
    summary="KV blocks are held beyond the tokens that live in them",
    meaning=(
        "KV usage is high while the running requests account for far fewer tokens, or half-empty last "
        "blocks waste a noticeable share of capacity. PagedAttention keeps external fragmentation near zero: "
        "this is internal waste or retention."
    ),
    next_actions=(
        "Try a smaller --block-size; check long-tail request lengths.",
        "Check prefix-cache retention (cached blocks count as used).",
    ),
    predicate=_kv_fragmentation_suspected,
    reads=("kv_live_token_ratio", "kv_last_block_waste_ratio", "kv_cache_usage_ratio_mean"),
    dont=(
        "PagedAttention keeps external fragmentation near zero: restarting to 'compact' memory does not help.",
        "An idle GPU with a full KV cache is not fragmentation: the CPU side cannot feed the GPU (see gpu_starved).",
    ),
    thresholds=(
        Threshold("usage_min", 0.8, "KV usage window mean at or above this", 0.0, 1.0),
        Threshold("live_token_ratio_max", 0.5, "live tokens / KV tokens in use below this", 0.0, 1.0),
        Threshold("block_waste_ratio_min", 0.10, "last-block waste / capacity at or above this", 0.0, 1.0),
    ),
    for_seconds=120,
    clear_seconds=120,
    causes=("live_tokens", "block_waste"),
)


def _spec_decode_ineffective(j: Judge) -> Term:
    if j.signals.get("spec_decode_drafts_per_second") is None:
        return j.fact(False, "speculative decoding is off (vLLM exports no draft counters)", "spec_decode_drafts_per_second")
    drafting = j.compare("spec_decode_drafts_per_second", ">", "drafts_per_second_min", "drafts proposed per second")
    if drafting.holds is not True:
        return drafting
    low = j.compare("spec_decode_acceptance_ratio", "<", "acceptance_ratio_max", "accepted / proposed draft tokens", upper=1.0)
    yielded = j.signals.get("spec_decode_tokens_per_draft")
    if yielded is not None:
        j.note(f"each verification step yields {yielded:.2f} tokens (1 is what decoding without a draft gives)", "spec_decode_tokens_per_draft", yielded)
    return low


SPEC_DECODE_INEFFECTIVE = Condition(
    id="spec_decode_ineffective",
    precedence=180,
    layer="1",
    severity="info",
    summary="Speculative decoding's drafts are mostly rejected: it costs more than it saves",
    meaning=(
        "Each draft costs a pass of the draft model and a verification of all its tokens by the target model; when few "
        "draft tokens are accepted, decoding is slower than without speculation (higher inter-token latency, less throughput)."
    ),
    next_actions=(
        "Lower num_speculative_tokens in --speculative-config (fewer wasted tokens per draft).",
        "Use a draft aligned with the target (same family, distilled; EAGLE heads trained for it); n-gram drafts only for repetitive text.",
        "Compare inter-token latency with speculative decoding off for this traffic; keep it only where acceptance is high.",
    ),
    predicate=_spec_decode_ineffective,
    reads=("spec_decode_acceptance_ratio", "spec_decode_drafts_per_second", "spec_decode_tokens_per_draft"),
    thresholds=(
        Threshold("drafts_per_second_min", 0.1, "drafts proposed per second above this (speculation in use)"),
        Threshold("acceptance_ratio_max", 0.3, "accepted / proposed draft tokens below this", 0.0, 1.0),
    ),
    for_seconds=120,
    clear_seconds=120,
)


CONDITIONS: tuple[Condition, ...] = (
    VLLM_UNREACHABLE,
    ENGINE_WEDGED,
    KV_CACHE_SATURATED,
    QUEUE_BACKLOG,
    PREEMPTION_STORM,
    CLIENT_UNDERLOAD,
    TTFT_HIGH,
    ITL_HIGH,
    REQUEST_ERRORS,
    PREFIX_CACHE_INEFFECTIVE,
    KV_FRAGMENTATION_SUSPECTED,
    SPEC_DECODE_INEFFECTIVE,
)
