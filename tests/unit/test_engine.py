"""The condition engine on synthetic pages: hysteresis, unknown inputs, causes, both sides of each
layer-1 threshold."""

from __future__ import annotations

import dataclasses

from vllm_triage.config_loader import load
from vllm_triage.derive import DeriveSettings
from vllm_triage.diagnosis.engine import Engine
from vllm_triage.model import Snapshot
from vllm_triage.pipeline import evaluate
from vllm_triage.report import format_report
from vllm_triage.scope import engine_scope
from vllm_triage.store import Store

from .pages import Counters, failed, page, reading

# The sidecar's config sets max_num_seqs here: the synthetic pages carry no cache config to read it from.
DERIVE = DeriveSettings(max_num_seqs=64)


def engine(overrides: dict | None = None, window: float = 20.0) -> Engine:
    config = load(env={})
    settings = {cid: dataclasses.replace(s, window_seconds=window) for cid, s in config.conditions.items()}
    for cid, values in (overrides or {}).items():
        thresholds = {**settings[cid].thresholds, **values.pop("thresholds", {})}
        settings[cid] = dataclasses.replace(settings[cid], thresholds=thresholds, **values)
    return Engine(settings, window)


def verdict(snapshot: Snapshot, condition: str):
    return next(v for v in snapshot.verdicts if v.condition == condition)


class Scenario:
    """Feeds one page per `step` seconds and evaluates after each."""

    def __init__(self, eng: Engine, step: float = 2.0) -> None:
        self.engine = eng
        self.store = Store(horizon_seconds=eng.horizon_seconds + 10)
        self.step = step
        self.t = 0.0
        self.c = Counters()

    def run(self, seconds: float, running=1, waiting=0, kv=0.1, preempt_per_step=0.0, finish_per_step=1.0, errors_per_step=0.0, ttft=0.05, producing=True):
        """`producing`: the running requests produce tokens (a served engine); False freezes the token counters."""
        snapshot = None
        for _ in range(int(seconds / self.step)):
            self.t += self.step
            if producing:
                self.c.generation_tokens += 8 * running
                self.c.prompt_tokens += 100 * finish_per_step
            self.c.preemptions += preempt_per_step
            self.c.finished += finish_per_step
            self.c.errors += errors_per_step
            self.c.ttft += [ttft] * int(finish_per_step)
            self.store.add(reading(self.t, page(running, waiting, kv, self.c)))
            snapshot = evaluate(self.engine, self.store, self.t, derive_settings=DERIVE)
        return snapshot

    def fail(self, seconds: float):
        snapshot = None
        for _ in range(int(seconds / self.step)):
            self.t += self.step
            self.store.add(failed(self.t))
            snapshot = evaluate(self.engine, self.store, self.t, derive_settings=DERIVE)
        return snapshot


def test_before_any_scrape_everything_is_unknown():
    eng = engine()
    snap = evaluate(eng, Store(60), 0.0, derive_settings=DERIVE)
    assert {v.state for v in snap.verdicts} == {"unknown"}
    assert "source vllm has no reading yet" in verdict(snap, "kv_cache_saturated").missing


def test_one_scrape_judges_gauges_but_not_rates():
    snap = Scenario(engine()).run(2)
    assert verdict(snap, "kv_cache_saturated").state == "inactive"  # KV at 10 % is a fact already
    storm = verdict(snap, "preemption_storm")
    assert storm.state == "unknown" and "preemptions_per_second" in storm.missing


def test_saturation_activates_after_for_and_clears_after_clear_for():
    s = Scenario(engine({"kv_cache_saturated": {"for_seconds": 30, "clear_seconds": 30}}))
    s.run(30)  # healthy
    snap = s.run(24, running=60, waiting=10, kv=1.0, preempt_per_step=2)
    v = verdict(snap, "kv_cache_saturated")
    assert v.raw is True and v.state == "inactive"  # holding, but not yet for 30 s
    snap = s.run(32, running=60, waiting=10, kv=1.0, preempt_per_step=2)
    v = verdict(snap, "kv_cache_saturated")
    assert v.state == "active" and v.score > 0.5
    assert any("KV cache usage" in e.text and e.holds for e in v.evidence)
    assert v.scopes == ("m/0",)
    snap = s.run(24)  # healthy again: the 20 s window drains first, then clear_for runs
    assert verdict(snap, "kv_cache_saturated").state == "active"
    snap = s.run(30)
    assert verdict(snap, "kv_cache_saturated").state == "inactive"


def test_saturation_judges_the_window_mean_and_the_peak():
    """Measured on a real vLLM: a full cache dips whenever a preemption frees a request's blocks."""
    fast = {"kv_cache_saturated": {"for_seconds": 0}}
    s = Scenario(engine(fast, window=20), step=2)
    for _ in range(3):  # mean ~0.84 with dips, full now and then, requests waiting
        for kv in (1.0, 0.97, 0.39, 1.0, 0.85):
            snap = s.run(2, running=10, waiting=50, kv=kv, preempt_per_step=3)
    assert verdict(snap, "kv_cache_saturated").state == "active"
    s = Scenario(engine(fast, window=20), step=2)
    snap = s.run(30, running=10, waiting=50, kv=0.97)  # high but never full: something else limits
    v = verdict(snap, "kv_cache_saturated")
    assert v.state == "inactive" and any("window peak" in e.text and not e.holds for e in v.evidence)
    s = Scenario(engine(fast, window=20), step=2)
    snap = s.run(30, running=10, waiting=0, kv=1.0)  # full, but nobody waits or is preempted
    assert verdict(snap, "kv_cache_saturated").state == "inactive"


def test_kv_thrash_is_saturation_and_a_backlog_whatever_the_collapsing_gauges_read():
    """Measured on a real vLLM under thrash: ~15 preemptions a second; KV usage read 0 at some scrapes and 1.0 at
    others (window mean 0.64-0.71); running and waiting each read 0 at some scrape while ~15-20 waited."""
    s = Scenario(engine(window=20), step=2)
    s.run(30, running=4, kv=0.3)  # healthy first: nothing before the thrash
    snapshots = []
    for _ in range(8):  # 80 s of thrash; a zero reading of each gauge in every cycle of five scrapes
        for running, waiting, kv in ((16, 20, 1.0), (0, 18, 0.0), (16, 0, 1.0), (12, 17, 0.0), (16, 19, 1.0)):
            snapshots.append(s.run(2, running=running, waiting=waiting, kv=kv, preempt_per_step=30, finish_per_step=20))
    kv_first = next(i for i, snap in enumerate(snapshots) if verdict(snap, "kv_cache_saturated").active) * 2
    backlog_first = next(i for i, snap in enumerate(snapshots) if verdict(snap, "queue_backlog").active) * 2
    assert kv_first <= 90 and backlog_first <= 90, (kv_first, backlog_first)
    last = snapshots[-1]
    assert last.primary == "kv_cache_saturated"
    saturated = verdict(last, "kv_cache_saturated")
    assert any("preempts only when no block is free" in e.text for e in saturated.evidence)
    backlog = verdict(last, "queue_backlog")
    assert backlog.cause == "kv_capacity" and any("collapses between scrapes" in e.text for e in backlog.evidence)
    s.run(20 + 60 + 4, running=2, kv=0.2)  # the load ends: the window drains, then clear_for
    snap = s.run(2, running=2, kv=0.2)
    assert not verdict(snap, "kv_cache_saturated").active and not verdict(snap, "queue_backlog").active


def test_a_queue_that_empties_for_much_of_the_window_is_no_backlog():
    s = Scenario(engine({"queue_backlog": {"for_seconds": 0}}, window=20), step=2)
    s.run(20, running=10, kv=0.4)
    for _ in range(6):  # requests wait at 2 readings of 5: arrivals queue for a moment and are admitted
        for waiting in (2, 0, 0, 1, 0):
            snap = s.run(2, running=10, waiting=waiting, kv=0.4)
            assert not verdict(snap, "queue_backlog").active


def test_a_condition_that_flaps_inside_for_never_activates():
    s = Scenario(engine({"queue_backlog": {"for_seconds": 20}}, window=4))
    for _ in range(10):
        s.run(10, waiting=5, running=64, kv=0.5)  # backlog for 10 s ...
        snap = s.run(6, waiting=0)  # ... then the queue empties
        assert verdict(snap, "queue_backlog").state == "inactive"
    snap = s.run(30, waiting=5, running=64, kv=0.5)  # holds for longer than `for`
    assert verdict(snap, "queue_backlog").state == "active"


def test_queue_backlog_cause_follows_the_evidence():
    s = Scenario(engine({"queue_backlog": {"for_seconds": 0}}))
    snap = s.run(30, waiting=5, running=20, kv=1.0, preempt_per_step=1)
    assert verdict(snap, "queue_backlog").cause == "kv_capacity"
    s = Scenario(engine({"queue_backlog": {"for_seconds": 0}}))
    snap = s.run(30, waiting=5, running=64, kv=0.4)
    v = verdict(snap, "queue_backlog")
    assert v.cause == "concurrency_cap"
    assert any("max_num_seqs=64" in e.text for e in v.evidence)
    s = Scenario(engine({"queue_backlog": {"for_seconds": 0}}))
    snap = s.run(30, waiting=5, running=10, kv=0.4)
    assert verdict(snap, "queue_backlog").cause == "unknown"


def test_a_scrape_gap_shorter_than_stale_after_changes_no_state():
    s = Scenario(engine({"kv_cache_saturated": {"for_seconds": 0, "clear_seconds": 60}}))
    snap = s.run(30, running=60, waiting=10, kv=1.0, preempt_per_step=2)
    assert verdict(snap, "kv_cache_saturated").state == "active"
    snap = s.fail(10)  # a timed-out scrape or two: under stale_after (15 s), the window's readings are judged
    v = verdict(snap, "kv_cache_saturated")
    assert v.state == "active" and not v.held
    assert v.stale and "failing since" in v.stale[0] and "cannot reach" in v.stale[0]
    assert all(x.state != "unknown" for x in snap.verdicts if x.condition in ("queue_backlog", "preemption_storm"))
    snap = s.run(4, running=60, waiting=10, kv=1.0, preempt_per_step=2)
    assert verdict(snap, "kv_cache_saturated").state == "active" and not verdict(snap, "kv_cache_saturated").stale


def test_scrapes_that_fail_now_and_then_are_no_outage():
    """A timeout or a dropped connection every few scrapes (a busy API server) must not page."""
    s = Scenario(engine({"vllm_unreachable": {"for_seconds": 0}}))
    for _ in range(6):
        snap = s.run(6, running=4)
        assert verdict(snap, "vllm_unreachable").state == "inactive"
        snap = s.fail(10)
        assert verdict(snap, "vllm_unreachable").state == "inactive"
    snap = s.fail(8)  # 18 s of failures: an outage
    assert verdict(snap, "vllm_unreachable").state == "active"


def test_a_gap_keeps_the_for_clock_of_a_pending_condition():
    # client_underload holds all along with a 120 s `for`; one failed scrape every 40 s must not reset it
    s = Scenario(engine())
    snap = None
    for _ in range(4):
        s.run(38, running=4)
        snap = s.fail(2)
    snap = s.run(6, running=4)
    v = verdict(snap, "client_underload")
    assert v.state == "active", (v.state, v.raw)


def test_a_verdict_whose_for_ends_while_vllm_fails_waits_for_a_scrape_that_succeeds():
    """A vLLM killed while a verdict is pending: the readings from before the kill are stale evidence, and raising a
    saturation 6 s into an outage would page on the past. The activation waits; a scrape that succeeds raises it."""
    s = Scenario(engine({"kv_cache_saturated": {"for_seconds": 20}}))
    s.run(14, running=60, waiting=10, kv=1.0, preempt_per_step=2)
    snap = s.fail(10)  # the `for` ends inside the failures, under stale_after (15 s)
    v = verdict(snap, "kv_cache_saturated")
    assert v.raw and v.stale and v.state == "inactive", (v.raw, v.stale, v.state)
    snap = s.run(2, running=60, waiting=10, kv=1.0, preempt_per_step=2)
    assert verdict(snap, "kv_cache_saturated").state == "active"  # the for's clock was kept: it held for 26 s


def test_an_outage_past_stale_after_makes_layer1_unknown_holds_active_verdicts_then_lets_go():
    s = Scenario(engine({"kv_cache_saturated": {"for_seconds": 0, "clear_seconds": 60}}))
    s.run(30, running=60, waiting=10, kv=1.0, preempt_per_step=2)
    snap = s.fail(20)
    v = verdict(snap, "kv_cache_saturated")
    assert v.state == "unknown" and v.held and v.active  # its alert does not flap on the outage
    assert any("stale_after" in m for m in v.missing)
    assert verdict(snap, "vllm_unreachable").state == "inactive"  # failing >= stale_after (15 s), then for 15 s
    snap = s.fail(20)
    v = verdict(snap, "vllm_unreachable")
    assert v.state == "active" and "failing for" in v.evidence[0].text
    assert snap.primary == "vllm_unreachable"
    snap = s.fail(50)  # unknown for longer than kv_cache_saturated's clear_for: let go
    v = verdict(snap, "kv_cache_saturated")
    assert v.state == "unknown" and not v.held and not v.active
    snap = s.run(40)
    assert verdict(snap, "vllm_unreachable").state == "inactive"
    assert verdict(snap, "kv_cache_saturated").state == "inactive"


def test_an_unknown_pending_condition_starts_its_for_over():
    s = Scenario(engine({"kv_cache_saturated": {"for_seconds": 60}}))
    s.run(20, running=60, waiting=10, kv=1.0, preempt_per_step=2)
    s.fail(30)  # past stale_after: unknown
    snap = s.run(20, running=60, waiting=10, kv=1.0, preempt_per_step=2)
    assert verdict(snap, "kv_cache_saturated").state == "inactive"  # 20 s of 60 since the inputs came back
    snap = s.run(44, running=60, waiting=10, kv=1.0, preempt_per_step=2)
    assert verdict(snap, "kv_cache_saturated").state == "active"


def test_waiting_requests_clear_client_underload_at_once():
    s = Scenario(engine({"client_underload": {"for_seconds": 0, "clear_seconds": 60}}))
    assert verdict(s.run(30, running=4), "client_underload").state == "active"
    snap = s.run(12, running=60, waiting=20, kv=0.9)
    v = verdict(snap, "client_underload")
    assert v.state == "inactive", "requests waiting contradict underload: no 60 s clear_for"
    assert any("cleared at once" in e.text for e in v.evidence)
    # a predicate that merely stops holding still waits out its clear_for
    s = Scenario(engine({"client_underload": {"for_seconds": 0, "clear_seconds": 60}}))
    s.run(30, running=4)
    assert verdict(s.run(12, running=40), "client_underload").state == "active"


def test_one_story_per_server_primary_and_suppression():
    s = Scenario(engine({c: {"for_seconds": 0} for c in ("kv_cache_saturated", "queue_backlog", "preemption_storm", "client_underload")}))
    snap = s.run(30, running=60, waiting=10, kv=1.0, preempt_per_step=4)
    assert snap.primary == "kv_cache_saturated"
    roles = {v.condition: v.role for v in snap.verdicts if v.active}
    assert roles["kv_cache_saturated"] == "primary" and roles["queue_backlog"] == "secondary"
    assert snap.to_json()["primary"] == "kv_cache_saturated"
    # healthy: no primary
    snap = Scenario(engine()).run(10)
    assert snap.primary is None and not any(v.role for v in snap.verdicts)


def test_client_underload_needs_traffic_and_low_concurrency():
    fast = {"client_underload": {"for_seconds": 0}}
    s = Scenario(engine(fast))
    snap = s.run(30, running=0, finish_per_step=0)
    v = verdict(snap, "client_underload")
    assert v.state == "inactive" and any("idle" in e.text for e in v.evidence)
    s = Scenario(engine(fast))
    snap = s.run(30, running=4)  # 4 of 64
    assert verdict(snap, "client_underload").state == "active"
    s = Scenario(engine(fast))
    snap = s.run(30, running=40)  # 40 of 64
    assert verdict(snap, "client_underload").state == "inactive"
    s = Scenario(engine(fast))
    snap = s.run(30, running=4, waiting=2)
    assert verdict(snap, "client_underload").state == "inactive"


def test_preemption_storm_both_sides():
    fast = {"preemption_storm": {"for_seconds": 0}}
    s = Scenario(engine(fast))
    snap = s.run(30, preempt_per_step=4, finish_per_step=4)  # 2/s
    assert verdict(snap, "preemption_storm").state == "active"
    s = Scenario(engine(fast))
    snap = s.run(30, preempt_per_step=0, finish_per_step=4)
    assert verdict(snap, "preemption_storm").state == "inactive"
    snap = s.run(30, preempt_per_step=0, finish_per_step=0)  # no traffic at all: not a storm, not unknown
    assert verdict(snap, "preemption_storm").state == "inactive"


def test_request_errors_both_sides():
    fast = {"request_errors": {"for_seconds": 0}}
    s = Scenario(engine(fast))
    snap = s.run(30, finish_per_step=10, errors_per_step=1)
    assert verdict(snap, "request_errors").state == "active"
    s = Scenario(engine(fast))
    snap = s.run(30, finish_per_step=10, errors_per_step=0)
    assert verdict(snap, "request_errors").state == "inactive"


def test_ttft_high_reports_its_threshold_from_config():
    s = Scenario(engine({"ttft_high": {"for_seconds": 0}}))
    snap = s.run(30, ttft=4.0)
    assert verdict(snap, "ttft_high").state == "active"
    s = Scenario(engine({"ttft_high": {"for_seconds": 0, "thresholds": {"ttft_p95_max_seconds": 8.0}}}))
    snap = s.run(30, ttft=4.0)
    v = verdict(snap, "ttft_high")
    assert v.state == "inactive"
    assert any("ttft_p95_max_seconds" in e.text and e.threshold == 8.0 for e in v.evidence)


def test_fragmentation_block_waste_side():
    fast = {"kv_fragmentation_suspected": {"for_seconds": 0}}
    s = Scenario(engine(fast))
    # 200 running x 16/2 tokens = 1600 of 16000 capacity: 10 % waste at 90 % usage
    snap = s.run(30, running=200, kv=0.9)
    v = verdict(snap, "kv_fragmentation_suspected")
    assert v.state == "active" and v.cause == "block_waste"
    s = Scenario(engine(fast))
    snap = s.run(30, running=200, kv=0.5)  # same waste, but KV has room: nothing to suspect
    assert verdict(snap, "kv_fragmentation_suspected").state == "inactive"


def test_disabled_condition_is_absent():
    config = load(env={})
    settings = dict(config.conditions)
    settings["itl_high"] = dataclasses.replace(settings["itl_high"], enabled=False)
    snap = Scenario(Engine(settings, 20)).run(4)
    assert "itl_high" not in {v.condition for v in snap.verdicts}


def test_a_hung_engine_is_engine_wedged_within_seconds_and_clears_when_tokens_flow():
    s = Scenario(engine(window=60.0))
    s.run(60, running=4, waiting=2)
    stalled = [s.run(2, running=4, waiting=2, producing=False) for _ in range(15)]
    states = [verdict(snap, "engine_wedged").state for snap in stalled]
    # active once 20 s of standstill held for its 5 s `for`: the 14th page after the last token
    assert states.index("active") in (12, 13, 14), states
    wedged = verdict(stalled[-1], "engine_wedged")
    assert wedged.cause == "unknown" and any("not visible" in e.text for e in wedged.evidence)
    assert stalled[-1].primary == "engine_wedged"
    assert stalled[-1].signals[engine_scope("m", "0")]["seconds_since_last_token"] == 30.0
    # the frozen gauges make no other story: the queue and the idle GPU are the hang's
    assert verdict(stalled[-1], "queue_backlog").suppressed_by == "engine_wedged"
    resumed = s.run(2, running=4)
    assert verdict(resumed, "engine_wedged").state == "inactive"  # at once, not after clear_for


def test_a_hang_is_engine_wedged_for_as_long_as_it_lasts_and_clients_that_leave_are_no_hang():
    """A hung engine core sends vLLM no counts: its gauges stand still (8 running for 5 minutes), and it stays hung while
    nothing moves, after the readings that saw the stall begin left the window. Clients that go away instead (a load that
    ends, a gateway's timeouts) are aborted by a live scheduler: its counts fall to 0 with no request counted finished
    (vLLM does not count aborts: vllm-project/vllm#31503) and no token after: no hang."""
    s = Scenario(engine(window=60.0))
    s.run(60, running=8)
    hung = [s.run(2, running=8, finish_per_step=0, producing=False) for _ in range(150)]
    states = [verdict(snap, "engine_wedged").state for snap in hung]
    first = states.index("active")
    assert first in (12, 13, 14), states[:16]  # 20 s of standstill and its 5 s `for`
    assert set(states[first:]) == {"active"}, states
    assert hung[first].signals[engine_scope("m", "0")]["requests_stalled"] == 8
    resumed = [s.run(2, running=8) for _ in range(6)]  # tokens flow again
    assert verdict(resumed[-1], "engine_wedged").state == "inactive"

    s = Scenario(engine(window=60.0))
    s.run(60, running=8)
    s.run(2, running=8, finish_per_step=0, producing=False)  # read between the last token and the aborts
    gone = [s.run(2, running=0, finish_per_step=0, producing=False) for _ in range(30)]
    assert {verdict(snap, "engine_wedged").state for snap in gone} == {"inactive"}
    assert gone[-1].signals[engine_scope("m", "0")]["seconds_stalled_with_requests_pending"] == 0.0


def test_requests_that_finish_during_a_pause_are_no_hang():
    s = Scenario(engine(window=60.0))
    s.run(60, running=8)
    # no token for 30 s, but the 8 requests end and none waits
    s.run(2, running=0, finish_per_step=8, producing=False)
    quiet = [s.run(2, running=0, finish_per_step=0, producing=False) for _ in range(15)]
    assert {verdict(snap, "engine_wedged").state for snap in quiet} == {"inactive"}


def test_a_thrash_that_recomputes_without_a_token_is_not_a_hang():
    """No token for 30 s while requests wait, but vLLM preempts all along: its scheduler runs (recomputing what it
    preempted), a hung engine preempts nothing. The same standstill without preemptions is a hang."""
    s = Scenario(engine(window=60.0))
    s.run(60, running=16, waiting=40, kv=1.0, preempt_per_step=2)
    thrash = [s.run(2, running=16, waiting=40, kv=1.0, preempt_per_step=1, finish_per_step=0, producing=False) for _ in range(15)]
    assert {verdict(snap, "engine_wedged").state for snap in thrash} == {"inactive"}
    assert thrash[-1].signals[engine_scope("m", "0")]["seconds_since_last_token"] == 30.0  # no token indeed
    hung = [s.run(2, running=16, waiting=40, kv=1.0, finish_per_step=0, producing=False) for _ in range(15)]
    assert verdict(hung[-1], "engine_wedged").state == "active"


def test_a_hung_engine_takes_its_cause_from_where_its_stack_dump_finds_it():
    """The host alone says an engine core that uses no CPU is blocked; its stack dump (taken once the verdict is active)
    says where: in a collective, waiting for requests that never reached it, ... The cause names the place, and the
    evidence the function. A hung kernel the GPU shows stays hung_kernel, with the function beside it."""
    from vllm_triage.model import PROCESS_SOURCE, Reading, make_labels

    def hung(stuck: tuple[tuple[str, str, str], ...]):
        eng, store, c = engine(window=60.0), Store(200), Counters()
        snapshot = None
        for t in range(0, 100, 2):
            producing = t < 60
            if producing:
                c.generation_tokens += 32
                c.finished += 1
            store.add(reading(float(t), page(4, 2, 0.3, c)))
            labels = make_labels({"role": "engine_core", "index": "0"})
            cpu = 0.5 * t if producing else 30.0  # no CPU since the hang: blocked
            store.add(Reading(PROCESS_SOURCE, t + 0.5, True, {("process_cpu_seconds_total", labels): cpu, ("process_stopped", labels): 0.0}))
            snapshot = evaluate(eng, store, t + 0.6, stuck if t >= 90 else (), derive_settings=DERIVE)
        assert snapshot is not None
        return verdict(snapshot, "engine_wedged")

    assert hung(()).cause == "blocked"
    wedged = hung((("engine_core", "collective", "all_reduce (vllm/distributed/parallel_state.py:512)"),))
    assert wedged.active and wedged.cause == "collective"
    assert any("waits in a collective for its tensor-parallel peers, in all_reduce (vllm/distributed/parallel_state.py:512)" in e.text for e in wedged.evidence)
    assert wedged.next_actions[0].startswith("cause=collective:")
    idle = hung((("engine_core", "waiting_for_requests", "Queue.get (queue.py:171)"),))
    assert idle.cause == "waiting_for_requests"


def test_an_idle_engine_or_a_long_prefill_is_not_wedged():
    s = Scenario(engine())
    idle = [s.run(2, running=0, finish_per_step=0, producing=False) for _ in range(20)]
    assert {verdict(snap, "engine_wedged").state for snap in idle[1:]} == {"inactive"}  # the first page: no step yet
    assert idle[-1].signals[engine_scope("m", "0")]["seconds_since_last_token"] == 20.0  # the whole window: at least that long
    # prefills of 12 s were seen: one request prefilling for 30 s produces no token and is no hang yet
    s = Scenario(engine(window=60.0))
    for _ in range(10):
        s.c.prefill.append(12.0)
        s.run(2, running=1)
    long_prefill = [s.run(2, running=1, finish_per_step=0, producing=False) for _ in range(15)]
    v = verdict(long_prefill[-1], "engine_wedged")
    assert v.state == "inactive" and any("a stall counts from" in e.text for e in v.evidence), [e.text for e in v.evidence]


def test_an_engine_that_steps_through_a_long_prefill_is_not_wedged_and_one_that_stops_stepping_is():
    """A 100k-token prompt prefills in 2,048-token chunks for a minute: no token counts until its first, but the engine
    steps (vllm:iteration_tokens_total's count rises), so it is no hang, with no earlier prefill to raise the bar. The same
    minute with the step count standing still is one."""
    for stepping in (True, False):
        s = Scenario(engine(window=60.0))
        s.c.steps, s.c.step_tokens = 1.0, 8.0
        s.run(10, running=0, finish_per_step=0, producing=False)
        snapshots = []
        for _ in range(30):
            if stepping:
                s.c.steps += 10
                s.c.step_tokens += 10 * 2048
            snapshots.append(s.run(2, running=1, finish_per_step=0, producing=False))
        wedged = [snap.timestamp for snap in snapshots if verdict(snap, "engine_wedged").active]
        if stepping:
            assert not wedged and snapshots[-1].signals[engine_scope("m", "0")]["engine_steps_per_second"] == 5.0
        else:
            assert wedged, [e.text for e in verdict(snapshots[-1], "engine_wedged").evidence]


def backlog_cause(deferred: float | None) -> str | None:
    """queue_backlog's cause with 6 waiting (KV full, as a capacity queue looks) and `deferred` of them deferred."""
    eng, store, c = engine({"queue_backlog": {"for_seconds": 0}}), Store(120), Counters()
    snapshot = None
    for t in range(0, 40, 2):
        c.finished += 1
        c.generation_tokens += 64
        store.add(reading(float(t), page(8, 6, 0.99, c, deferred=deferred)))
        snapshot = evaluate(eng, store, float(t), derive_settings=DERIVE)
    assert snapshot is not None
    v = verdict(snapshot, "queue_backlog")
    assert v.state == "active"
    return v.cause


def test_queue_backlogs_cause_comes_from_vllms_reason_where_it_says_one():
    assert backlog_cause(deferred=5) == "deferred"  # LoRA budget, KV transfer: no capacity fix applies
    assert backlog_cause(deferred=0) == "kv_capacity"  # waiting for capacity: inferred as before
    assert backlog_cause(deferred=None) == "kv_capacity"  # vLLM before 0.26 says no reason


def spec_decode_run(accepted_per_draft: float, drafts_per_second: float = 20.0):
    """Pages of an engine speculating 4 tokens per draft, `accepted_per_draft` of them accepted on average."""
    eng, store, c = engine({"spec_decode_ineffective": {"for_seconds": 0}}), Store(120), Counters()
    snapshot = None
    for t in range(0, 40, 2):
        c.finished += 1
        c.generation_tokens += 64
        drafts = drafts_per_second * t
        labels = 'engine="0",model_name="m"'
        text = page(4, 0, 0.3, c) + (
            f"vllm:spec_decode_num_drafts_total{{{labels}}} {drafts}\n"
            f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {4 * drafts}\n"
            f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {accepted_per_draft * drafts}\n"
        )
        store.add(reading(float(t), text))
        snapshot = evaluate(eng, store, float(t), derive_settings=DERIVE)
    assert snapshot is not None
    return verdict(snapshot, "spec_decode_ineffective"), snapshot.signals[engine_scope("m", "0")]


def test_speculative_decoding_whose_drafts_are_rejected_is_ineffective():
    rejected, signals = spec_decode_run(accepted_per_draft=0.4)  # 10 % of 4 drafted tokens
    assert rejected.state == "active" and signals["spec_decode_acceptance_ratio"] == 0.1
    assert any("yields 1.40 tokens" in e.text for e in rejected.evidence)
    accepted, _ = spec_decode_run(accepted_per_draft=2.8)  # 70 %: it pays
    assert accepted.state == "inactive"
    off = verdict(Scenario(engine()).run(40, running=4), "spec_decode_ineffective")
    assert off.state == "inactive" and any("speculative decoding is off" in e.text for e in off.evidence)


def test_high_itl_from_prefill_chunks_advises_a_max_num_batched_tokens_within_the_slo():
    # decode steps of 30 ms, every 10th step carries a prefill chunk (400 ms); prompts of 2000 tokens prefill in 0.5 s
    eng, store, c = engine({"itl_high": {"for_seconds": 0}}), Store(120), Counters()
    snapshot = None
    for t in range(0, 40, 2):
        c.generation_tokens += 400
        c.itl += [0.03] * 90 + [0.4] * 10
        c.prefill += [0.5] * 4
        c.prompt_lengths += [2000.0] * 4
        store.add(reading(float(t), page(8, 0, 0.5, c)))
        snapshot = evaluate(eng, store, float(t), derive_settings=DERIVE)
    assert snapshot is not None
    v, values = verdict(snapshot, "itl_high"), snapshot.signals[engine_scope("m", "0")]
    assert v.state == "active", [e.text for e in v.evidence]
    (advice,) = v.advice
    chunk = int(advice.split()[1].rstrip(":"))
    per_token = values["prefill_time_seconds_mean"] / values["prompt_tokens_mean"]
    # the largest multiple of 256 whose chunk keeps a step (the ITL median + the chunk's prefill) within 100 ms
    assert chunk % 256 == 0 and values["inter_token_latency_seconds_p50"] + chunk * per_token <= 0.1
    assert values["inter_token_latency_seconds_p50"] + (chunk + 256) * per_token > 0.1


def host(t: float, server: tuple[int, float] | None, exits: int = 0, view: bool = True, ignored: int = 0):
    """A process reading at `t`: the API server (pid, started at) or none, the API servers seen exiting so far, whether the
    sidecar sees beyond its own processes, and how many vLLM-titled processes belong to another port."""
    from vllm_triage.model import PROCESS_SOURCE, ProcessEntry, ProcessMeta, Reading, make_labels

    samples = {("process_exits_total", make_labels({"role": "api_server"})): float(exits)}
    processes: list[ProcessEntry] = []
    if server is not None:
        pid, started = server
        labels = make_labels({"role": "api_server", "index": "0"})
        samples |= {("process_start_time_seconds", labels): started, ("process_stopped", labels): 0.0, ("process_cpu_seconds_total", labels): t}
        processes.append(ProcessEntry(pid=pid, role="api_server", index=0, status="running"))
    meta = ProcessMeta(processes=processes, binding="test", ignored_processes=ignored, process_view=view)
    if exits:  # each seen at the end of a 30 s life (20 s up, 10 s gone), as the crash loop below
        meta["api_server_exit_times"] = [30.0 * n - 10 for n in range(1, exits + 1)]
    return Reading(PROCESS_SOURCE, t + 0.5, True, samples, meta=meta)


def never_answering(eng: Engine, seconds: float, server_at=lambda t: None, exits_at=lambda t: 0, view: bool = True, ignored: int = 0) -> list[Snapshot]:
    """vLLM refusing connections for `seconds` from the sidecar's start, the host read every 2 s beside it."""
    store, snapshots = Store(eng.horizon_seconds + 10), []
    for t in range(2, int(seconds) + 1, 2):
        store.add(failed(float(t)))
        store.add(host(float(t), server_at(t), exits_at(t), view, ignored))
        snapshots.append(evaluate(eng, store, t + 0.6, derive_settings=DERIVE))
    return snapshots


def first_unreachable(snapshots: list[Snapshot]) -> Snapshot | None:
    return next((s for s in snapshots if verdict(s, "vllm_unreachable").active), None)


def test_a_vllm_loading_its_model_is_starting_and_one_that_never_starts_is_unreachable_within_3_minutes():
    """Starting means loading: an API server process that runs while its port does not answer yet is starting, for the
    startup grace (the chart's startup probe). No vLLM process at all, one that keeps exiting, or one started for another
    port is an outage within about 3 minutes, with its cause. Without a view of the processes the wait alone decides."""
    loading = never_answering(engine(), 600, server_at=lambda t: (4242, 0.0))  # 10 minutes of model load
    assert first_unreachable(loading) is None and all(s.vllm_starting for s in loading)
    v = verdict(loading[-1], "vllm_unreachable")
    assert any(e.text.startswith("starting: vLLM is loading: its API server has run 600 s") for e in v.evidence), [e.text for e in v.evidence]
    assert loading[-1].primary is None and loading[-1].vllm_starting_seconds == 598.6  # since the first failed scrape, at 2 s
    assert "STARTING: vLLM has not answered for 599 s (starting?); starting: vLLM is loading" in format_report(loading[-1], "test")

    stuck = never_answering(engine({"vllm_unreachable": {"thresholds": {"startup_grace_seconds": 300}}}), 360, server_at=lambda t: (4242, 0.0))
    first = first_unreachable(stuck)  # a load that never ends: unreachable after the grace and the condition's `for`
    assert first is not None and 300 <= first.timestamp <= 2 + 300 + 15 + 2 and not first.vllm_starting

    never = never_answering(engine(), 240)  # nothing started: a typo in the command, an image that never ran
    first = first_unreachable(never)
    assert first is not None and first.timestamp <= 180, first and first.timestamp
    assert verdict(first, "vllm_unreachable").cause == "not_started" and first.primary == "vllm_unreachable"
    assert all(s.vllm_starting for s in never if s.timestamp < 150) and not any(s.vllm_starting for s in never if s.timestamp >= 2 + 150 + 1)

    # a crash loop: each API server lives 20 s and is restarted 10 s after it died, under a new pid
    crashing = never_answering(engine(), 240, server_at=lambda t: (1000 + t // 30, t - t % 30) if t % 30 < 20 else None, exits_at=lambda t: (t + 10) // 30)
    first = first_unreachable(crashing)
    assert first is not None and first.timestamp <= 50 + 15 + 2, first and first.timestamp
    assert verdict(first, "vllm_unreachable").cause == "crash_loop"
    assert any("2 vLLM API server processes exited in the last 10 minutes" in e.text for e in verdict(first, "vllm_unreachable").evidence)

    elsewhere = never_answering(engine(), 240, ignored=1)  # vLLM serves, started for another port than vllm_url's
    first = first_unreachable(elsewhere)
    assert first is not None and verdict(first, "vllm_unreachable").cause == "not_listening"

    blind = never_answering(engine(), 660, view=False)  # no shared process namespace: the shorter grace alone
    assert all(s.vllm_starting for s in blind if s.timestamp < 600)
    texts = [e.text for e in verdict(blind[298], "vllm_unreachable").evidence]  # at 598.6 s
    assert any(t.startswith("starting? vLLM has not answered for 597 s; without a view of its processes") for t in texts), texts
    first = first_unreachable(blind)
    assert first is not None and 600 <= first.timestamp <= 2 + 600 + 15 + 2 and verdict(first, "vllm_unreachable").cause == "unknown"

    s = Scenario(engine())
    s.run(10)
    snap = s.fail(40)  # answered once, then down: an outage at once
    assert verdict(snap, "vllm_unreachable").state == "active" and not snap.vllm_starting


def test_a_stopped_engine_core_that_runs_again_with_its_clients_gone_is_no_longer_hung():
    """Measured on the CPU build: vLLM does not count the requests whose clients left during a SIGSTOP as finished
    (request_success_total{finished_reason="abort"} stayed 0), and after SIGCONT its gauges read 0 and no token comes.
    The host sees the engine core run again: the verdict clears and stays cleared. Resumed but still frozen (its
    gauges still count the requests, no token), it is hung again once it has run for the stall bar."""
    from vllm_triage.model import PROCESS_SOURCE, Reading, make_labels

    def run(eng: Engine, store: Store, c: Counters, t0: float, seconds: float, running: int, stopped: bool, producing: bool) -> list:
        snapshots = []
        for t in range(int(t0), int(t0 + seconds), 2):
            if producing:
                c.generation_tokens += 8 * running
                c.finished += 1
            store.add(reading(float(t), page(running, 0, 0.3, c)))
            stop = {("process_stopped", make_labels({"role": "engine_core", "index": "0"})): 1.0 if stopped else 0.0}
            store.add(Reading(PROCESS_SOURCE, float(t) + 0.5, True, stop))
            snapshots.append(evaluate(eng, store, float(t) + 0.6, derive_settings=DERIVE))
        return snapshots

    for still_frozen in (False, True):
        eng, store, c = engine(window=60.0), Store(200), Counters()
        run(eng, store, c, 0, 60, 4, False, True)
        hung = run(eng, store, c, 60, 40, 4, True, False)  # SIGSTOP: the gauges hold their last counts
        assert verdict(hung[-1], "engine_wedged").state == "active" and verdict(hung[-1], "engine_wedged").cause == "process_stopped"
        after = run(eng, store, c, 100, 120, 4 if still_frozen else 0, False, False)  # SIGCONT; nothing is produced
        states = [verdict(s, "engine_wedged").state for s in after]
        if still_frozen:
            assert "inactive" in states[:6] and states[-1] == "active", states  # it ran (cleared after clear_for), then stood still again
        else:
            assert set(states) == {"inactive"}, states  # at once, and for the next two minutes


def test_each_condition_has_its_own_precedence_and_is_suppressed_only_by_conditions_ranked_before_it():
    """Precedence and suppression are fields of each entry: two conditions of equal precedence would tell two stories
    in an order nobody chose, a misspelt id in suppressed_by would suppress nothing, and a condition suppressed by
    one ranked after it could be the primary while the one that explains it holds."""
    from vllm_triage.diagnosis.conditions import CONDITIONS, CONDITIONS_BY_ID, PRECEDENCE

    assert len({c.id for c in CONDITIONS}) == len(CONDITIONS), "two conditions share an id"
    ranks = [c.precedence for c in CONDITIONS] + [rank for c in CONDITIONS for _, rank in c.precedence_by_cause]
    assert len(set(ranks)) == len(ranks), sorted((c.precedence, c.id) for c in CONDITIONS)
    assert all(cause in c.causes for c in CONDITIONS for cause, _ in c.precedence_by_cause)
    assert sorted(PRECEDENCE) == sorted(CONDITIONS_BY_ID)
    for c in CONDITIONS:
        for other, why in c.suppressed_by:
            assert other in CONDITIONS_BY_ID and other != c.id and why, (c.id, other)
            assert CONDITIONS_BY_ID[other].precedence < c.precedence, (c.id, other)
