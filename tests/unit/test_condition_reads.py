"""Each condition declares the signals it reads (Condition.reads): the dashboards' drill-down follows
the declarations, so they must name real signals and cover everything the predicates really read."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from vllm_triage.config_loader import load
from vllm_triage.derive import GLOBAL_SIGNALS
from vllm_triage.diagnosis import engine
from vllm_triage.diagnosis.conditions import CONDITIONS
from vllm_triage.history.capture import demo_capture_path, read_readings
from vllm_triage.pipeline import replay
from vllm_triage.signals.gpu import GPU_SIGNALS
from vllm_triage.signals.host import GIL_SIGNALS, HOST_SIGNALS
from vllm_triage.signals.vllm import VLLM_SIGNALS

DATA = Path(__file__).resolve().parents[1] / "data"
KNOWN = {s.id for table in (VLLM_SIGNALS, GPU_SIGNALS, HOST_SIGNALS, GIL_SIGNALS) for s in table} | set(GLOBAL_SIGNALS)


def test_every_declared_signal_exists_once():
    for condition in CONDITIONS:
        assert condition.reads, condition.id
        assert len(set(condition.reads)) == len(condition.reads), condition.id
        assert set(condition.reads) <= KNOWN, (condition.id, sorted(set(condition.reads) - KNOWN))


class _Recording(dict[str, float | None]):
    """A scope's signals that note each name asked for."""

    def __init__(self, values: dict[str, float | None], into: list[str]) -> None:
        super().__init__(values)
        self.into = into

    def get(self, key: str, default: float | None = None) -> float | None:  # type: ignore[override]
        self.into.append(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> float | None:
        self.into.append(key)
        return super().__getitem__(key)


@pytest.fixture
def reads_by_condition(monkeypatch):
    """Replay every real capture (vLLM on the CPU and on the H200, the GPU workloads) and record, per
    condition, each signal its predicate (through the Judge) and its `contradicted` asked for."""
    reads: dict[str, list[str]] = defaultdict(list)
    judging = [""]
    judge, judge_init = engine.Engine._judge, engine.Judge.__init__

    def recording(self, condition, settings, per_scope, *rest):  # type: ignore[no-untyped-def]
        judging[0] = condition.id
        per_scope = {scope: _Recording(values, reads[condition.id]) for scope, values in per_scope.items()}
        return judge(self, condition, settings, per_scope, *rest)

    def recording_judge(self, signals, *rest, **named):  # type: ignore[no-untyped-def]
        judge_init(self, _Recording(signals, reads[judging[0]]), *rest, **named)

    monkeypatch.setattr(engine.Engine, "_judge", recording)
    monkeypatch.setattr(engine.Judge, "__init__", recording_judge)
    for capture in (demo_capture_path(), *sorted(DATA.glob("*.jsonl.gz"))):
        replay(list(read_readings(capture)), load(env={}), lambda snapshot: None)
    return reads


def test_what_the_predicates_read_on_the_real_captures_is_declared(reads_by_condition):
    for condition in CONDITIONS:
        read = set(reads_by_condition[condition.id])
        assert read, f"{condition.id} was never judged on the captures"
        assert read <= set(condition.reads), (condition.id, sorted(read - set(condition.reads)))
