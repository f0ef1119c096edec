"""`vllm-triage trace` on a real torch profiler trace recorded on the H200 (harness/gpu/record_trace.py):
0.6 s of tiny kernels with Python between them, then bf16 matmuls, then pinned host-to-device copies."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from vllm_triage import cli
from vllm_triage.traces import TraceError, short_kernel_name, summarize

TRACE = Path(__file__).resolve().parents[1] / "data" / "trace-h200.pt.trace.json.gz"
# vLLM 0.26.0's own profiler output on the H200 (harness/gpu/real_vllm.py, scenario `profiled`): the engine
# worker's trace (rank0.*) and the API-server frontend's (*.async_llm.*, no GPU rows), as vLLM lays them out
VLLM_PROFILE = Path(__file__).resolve().parents[1] / "data" / "vllm-0.26.0-h200-profile-underload"


def test_the_three_parts_of_the_trace_show_in_the_timeline_and_the_findings():
    summary = summarize(TRACE, slices=10)
    (gpu,) = summary.gpus
    assert gpu.kernels == summary.launches == 1431 and gpu.tiny_kernels > 1300
    early, last = gpu.timeline[:7], gpu.timeline[-1]
    assert all(t["busy_ratio"] < 0.05 for t in early)  # the GPU waited on Python
    assert last["memcpy_ratio"] > 0.9 and last["kernel_ratio"] < 0.05  # the copies came last
    assert max(t["kernel_ratio"] for t in gpu.timeline) > 0.3  # the matmuls in between
    assert set(gpu.memcpy_seconds) == {"HtoD"} and 0.1 < gpu.memcpy_seconds["HtoD"] < 0.2
    name, count, seconds = gpu.top_kernels[0]
    assert count == 40 and "<" not in name and seconds > 0.9 * gpu.kernel_seconds
    assert summary.host_outside_ops_ratio is not None and summary.host_outside_ops_ratio > 0.8
    starved, copies, dominant = summary.findings
    assert "gpu_starved" in starved and "1389 of 1431 kernels" in starved
    assert "gpu_busy_not_computing" in copies and "HtoD" in copies
    assert name in dominant


def test_cli_prints_the_report_and_json(capsys):
    assert cli.main(["trace", str(TRACE), "--top", "2"]) == 0
    text = capsys.readouterr().out
    assert "GPU 0: busy 22%" in text and "findings:" in text and "aten::mul" in text
    assert cli.main(["trace", str(TRACE), "--json"]) == 0
    (document,) = json.loads(capsys.readouterr().out)
    assert 0.15 < document["gpus"][0]["busy_ratio"] < 0.3 and len(document["gpus"][0]["timeline"]) == 10


def test_a_folder_of_worker_traces_gets_one_summary_per_worker(tmp_path, capsys):
    for worker in ("VllmWorker-0", "VllmWorker-1"):
        (tmp_path / f"{worker}.1796002107849.pt.trace.json.gz").write_bytes(TRACE.read_bytes())
    (tmp_path / "notes.txt").write_text("not a trace")
    assert cli.main(["trace", str(tmp_path), "--json"]) == 0
    assert [Path(s["file"]).name.split(".")[0] for s in json.loads(capsys.readouterr().out)] == ["VllmWorker-0", "VllmWorker-1"]
    assert cli.main(["trace", str(tmp_path / "empty")]) == 2  # a missing path is named, not a traceback
    (tmp_path / "empty").mkdir()
    assert cli.main(["trace", str(tmp_path / "empty")]) == 2
    assert "no *.pt.trace.json" in capsys.readouterr().err


def test_vllms_profiler_folder_is_summarised_and_the_frontends_trace_skipped_with_a_note(capsys):
    """An eager 1B Llama serving 2 clients: the GPU idles between thousands of tiny kernels a second."""
    assert cli.main(["trace", str(VLLM_PROFILE), "--json"]) == 0
    captured = capsys.readouterr()
    (worker,) = json.loads(captured.out)
    assert Path(worker["file"]).name.startswith("rank0.")
    assert "skipped" in captured.err and "async_llm" in captured.err and "no GPU activity" in captured.err
    (gpu,) = worker["gpus"]
    assert gpu["busy_ratio"] < 0.15 and gpu["kernels"] > 5000 and gpu["tiny_kernels"] > 0.7 * gpu["kernels"]
    assert any("gpu_starved" in finding for finding in worker["findings"])
    frontend = next(VLLM_PROFILE.glob("*.async_llm.*"))
    assert cli.main(["trace", str(frontend)]) == 2  # named on its own, a host-only trace is an error
    assert "no GPU activity" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (lambda raw: raw[: len(raw) // 2], "truncated or garbled"),
        (lambda raw: b"not a trace at all", "truncated or garbled"),
        (lambda raw: gzip.compress(b'{"schemaVersion": 1}'), "no traceEvents"),
        (lambda raw: json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2}]}).encode(), "no GPU activity"),
    ],
    ids=["truncated", "garbage", "no-events", "cpu-only"],
)
def test_a_bad_trace_gets_a_message_naming_the_file_and_exit_2(content, message, tmp_path, capsys):
    bad = tmp_path / "worker.pt.trace.json.gz"
    bad.write_bytes(content(TRACE.read_bytes()))
    with pytest.raises(TraceError, match=message):
        summarize(bad)
    assert cli.main(["trace", str(bad)]) == 2
    assert str(bad) in capsys.readouterr().err


@pytest.mark.parametrize(
    ("raw", "short"),
    [
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>, std::array<char*, 2ul> >(int, at::native::AddFunctor<float>)",
            "at::native::vectorized_elementwise_kernel",
        ),
        ("void at::native::(anonymous namespace)::grid_kernel<float, 4>(at::TensorIteratorBase&)", "at::native::(anonymous namespace)::grid_kernel"),
        ("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT", "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT"),
    ],
)
def test_kernel_names_lose_their_template_and_call_arguments(raw, short):
    assert short_kernel_name(raw) == short
