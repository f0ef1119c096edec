"""Live on a real NVIDIA GPU: run workloads with known bottlenecks next to the sidecar's GPU source,
then check every GPU verdict against each phase's truth (truth.py). Skipped without a GPU.

    pytest -m gpu tests/gpu           # GPU_CAPTURE_DIR=dir keeps the capture and phase marks

The same check runs in CI on the captures this test recorded on the H200 (tests/data/gpu-h200-*).
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from vllm_triage.sources.gpu import GpuSource

from .truth import STARVED_EXPECTED, STARVED_REPLAY_CONFIG, check, check_causes, read_phases, replay_config, write_phases

pytestmark = pytest.mark.gpu
PHASES = ("idle:15", "compute:30", "copy_d2d:30", "copy_h2d:30", "copy_h2d_only:30", "starved:30", "mixed:36", "idle:15")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def needs_gpu():
    probe = GpuSource().collect()
    if not probe.ok:
        pytest.skip(f"no GPU here: {probe.error}")


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "vllm_triage.cli", *args]


def test_every_gpu_verdict_matches_the_workload(tmp_path):
    out = Path(os.environ.get("GPU_CAPTURE_DIR", tmp_path))
    capture = out / "gpu-h200-live.jsonl.gz"
    seconds = sum(float(p.split(":")[1]) for p in PHASES) + 10
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'exporter'}:{REPO}"}
    recorder = subprocess.Popen(
        cli("record", "--sources", "gpu", "--gpu-interval-seconds", "0.5", "--seconds", str(seconds), "--out", str(capture)), env=env, cwd=REPO
    )
    time.sleep(3)
    marks = subprocess.run([sys.executable, "-m", "harness.gpu.workloads", *PHASES], capture_output=True, text=True, env=env, cwd=REPO, check=True)
    recorder.wait(timeout=seconds + 60)
    phase_file = out / "gpu-h200-live.json"
    write_phases(marks.stdout, phase_file)
    problems = check(capture, read_phases(phase_file), replay_config(tmp_path))
    assert not problems, "\n".join(problems[:20])


SERVING_PHASES = ("idle:20", "starved:45", "compute:45", "idle:10")
CAUSE_PHASES = ("idle:10", "starved:30", "launch:30", "pageable:30", "matmul_fp32:30", "matmul_fp64:30", "elementwise:30", "bursty:30", "idle:8")


def record_serving_loop(out: Path, name: str, phases: tuple[str, ...], port: str) -> Path:
    """Record all four sources next to harness/gpu/serving.py titled VLLM::EngineCore; returns the phase file."""
    capture = out / f"{name}.jsonl.gz"
    seconds = sum(float(p.split(":")[1]) for p in phases) + 12
    # Under another argv[0] a venv's python no longer finds its venv: hand it the site-packages.
    path = os.pathsep.join([str(REPO / "exporter"), str(REPO), *site.getsitepackages()])
    env = {**os.environ, "PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": "0"}
    errors = (out / f"{name}-loop.log").open("w")
    loop = subprocess.Popen(
        ["bash", "-c", f"exec -a VLLM::EngineCore {sys.executable} -m harness.gpu.serving {port} {' '.join(phases)}"],
        stdout=subprocess.PIPE,
        stderr=errors,
        text=True,
        env=env,
        cwd=REPO,
    )
    time.sleep(4)  # torch import and the first /metrics
    sampling = ["--sources", "vllm,process,gpu,gil", "--gil-interval-seconds", "10", "--gil-window-seconds", "3"]
    sampling += ["--process-interval-seconds", "1", "--gpu-interval-seconds", "0.5"]
    recorder = subprocess.run(
        cli("record", "--vllm-url", f"http://127.0.0.1:{port}", *sampling, "--seconds", str(seconds), "--out", str(capture)),
        env=env,
        cwd=REPO,
        timeout=seconds + 60,
    )
    marks, _ = loop.communicate(timeout=60)
    assert recorder.returncode == 0
    phase_file = out / f"{name}.json"
    write_phases(marks, phase_file)
    ran = [phase for phase, _, _ in read_phases(phase_file)]
    assert ran == [p.split(":")[0] for p in phases], (out / f"{name}-loop.log").read_text()[-2000:]
    return phase_file


def test_each_starvation_and_compute_cause_is_named(tmp_path):
    """Python between launches, launch overhead, pageable copies; CUDA cores vs tensor cores."""
    out = Path(os.environ.get("GPU_CAPTURE_DIR", tmp_path))
    phase_file = record_serving_loop(out, "gpu-causes-h200", CAUSE_PHASES, "18124")
    problems = check_causes(out / "gpu-causes-h200.jsonl.gz", read_phases(phase_file), replay_config(tmp_path, STARVED_REPLAY_CONFIG))
    assert not problems, "\n".join(problems[:20])


def test_gpu_starved_names_the_engine_core_and_only_when_the_gpu_waits(tmp_path):
    """The host layer end to end: the sidecar finds the serving loop as vLLM's engine core by its
    title, samples its threads and GIL, reads the GPU it uses, and judges gpu_starved per phase."""
    out = Path(os.environ.get("GPU_CAPTURE_DIR", tmp_path))
    phase_file = record_serving_loop(out, "gpu-starved-h200", SERVING_PHASES, "18123")
    problems = check(out / "gpu-starved-h200.jsonl.gz", read_phases(phase_file), replay_config(tmp_path, STARVED_REPLAY_CONFIG), STARVED_EXPECTED)
    assert not problems, "\n".join(problems[:20])


def test_serve_exports_the_gpu_layer(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'exporter'}:{REPO}"}
    port = "10399"
    server = subprocess.Popen(cli("serve", "--sources", "gpu", "--listen", f"127.0.0.1:{port}"), env=env, cwd=REPO)
    try:
        time.sleep(5)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        (tmp_path / "metrics.txt").write_text(body)
        assert 'vllm_triage_source_up{source="gpu"} 1.0' in body
        for family in (
            "vllm_triage_gpu_sm_active_ratio",
            "vllm_triage_gpu_utilization_ratio",
            "vllm_triage_gpu_window_busy_ratio",
            "vllm_triage_gpu_clock_event_active",
        ):
            assert family in body
        if "GPU_CAPTURE_DIR" in os.environ:
            (Path(os.environ["GPU_CAPTURE_DIR"]) / "metrics.txt").write_text(body)
    finally:
        server.terminate()
        server.wait(timeout=10)
