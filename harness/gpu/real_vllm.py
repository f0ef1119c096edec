"""A real vLLM on the GPU machine, driven through scenarios whose truth is written down before the run
(SCENARIOS), recorded by the sidecar with all four sources. Runs on the device after
harness/gpu/stage_vllm.sh's payload is unpacked (/tmp/site: vLLM 0.26.0 and what it needs):

    python3 -m harness.gpu.real_vllm OUT_DIR SCENARIO [SCENARIO ...]

Each scenario starts vLLM with its model and flags, records `OUT_DIR/<scenario>.jsonl.gz` (the capture,
its phases in the header and in `<scenario>.json`) while a bounded load drives the phases, saves vLLM's
own /metrics page at the end of each loaded phase, and stops vLLM. The captures replay in CI
(tests/unit/test_real_vllm_captures.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from vllm_triage import traces as traces_module
from vllm_triage.cli import observe
from vllm_triage.config_loader import load
from vllm_triage.history.capture import CaptureWriter

from harness.cadence import every
from harness.load import Phase, run_load, run_load_processes
from harness.vllm_server import wait_healthy

PORT = 8000
LOAD_PROCESSES = 4  # streamed clients run in load processes of their own: the recorder's event loop is the sidecar's
URL = f"http://127.0.0.1:{PORT}"
MODELS = Path("/tmp/models")
SITE = "/tmp/site"  # vLLM and its dependencies, unpacked by the staging payload


@dataclass(frozen=True)
class Scenario:
    model: str  # a key of MODEL_SHAPES
    flags: tuple[str, ...]
    phases: tuple[Phase, ...]
    truth: str  # what each phase must show, written before the run
    profile_at: tuple[tuple[str, float], ...] = ()  # (phase, seconds into it): a PROFILE_SECONDS torch profile
    stop_engine: tuple[str, float, float] | None = None  # (phase, seconds into it, for how long): SIGSTOP the engine core
    # (phase, seconds into it, action, its argument), at the same time as the phase's load:
    #   contend N: the engine core's threads pinned to one CPU shared with N busy loops, for the rest of the phase
    #   hang_kernel S: a kernel that runs S seconds enqueued in the engine core (see HANG_HOOK)
    #   kill_api_server: SIGKILL the API server alone (an OOM kill); its engine core lives on
    #   kill_vllm: SIGKILL the API server and every engine core (a crash, a node's OOM killer); nothing listens after
    #   launch: vLLM started now (the sidecar records from before its launch, a pod's rollout); the phase lasts until it answers
    #   foreign_process: another program (bf16 matmuls in torch) computes on vLLM's GPU for the rest of the phase
    #   relaunch: vLLM stopped and started again with `relaunch_flags` (a rollout that changes a flag, or none); the phase
    #     lasts until it answers
    actions: tuple[tuple[str, float, str, float], ...] = ()
    cuda_graphs: bool = False  # vLLM's defaults (torch.compile and CUDA graphs) instead of --enforce-eager
    relaunch_flags: tuple[str, ...] | None = None  # every flag of the relaunched vLLM, --enforce-eager where it runs eager


PROFILE_DIR = Path("/tmp/vllm-profile")  # vLLM's torch_profiler_dir; each profile is moved to OUT_DIR/traces/<phase>
PROFILE_SECONDS = 1.0  # an eager 1B model writes ~10 MB of gzip trace per second
SERVING_FLAGS = ("--max-num-seqs", "32", "--num-gpu-blocks-override", "48", "--block-size", "16", "--max-model-len", "512")

SCENARIOS = {
    # The demo: a 1B Llama with a 48-block KV cache (block 16: 768 tokens), max 32 sequences.
    # Phase lengths let every verdict rise and clear at the default settings.
    "serving": Scenario(
        "1b",
        SERVING_FLAGS,
        (
            Phase("idle", 30),
            Phase("underload", 190, 2, 40, 160),
            Phase("kv_saturation", 190, 40, 40, 160),
            Phase("recovery", 150),
        ),
        "idle: nothing. underload: 2 of 32 running, nothing waiting, SMs mostly idle -> client_underload, unless the "
        "engine core's thread is saturated with idle SMs, then gpu_starved leads and underload is suppressed. "
        "kv_saturation: kv_cache_saturated primary, queue_backlog cause kv_capacity, preemption_storm; no "
        "kv_fragmentation_suspected. recovery: everything clears.",
    ),
    # The engine core's Python loop is the limit: a tiny model, many short requests; 130 s, so that the
    # GIL source's second window (120 s after its first) falls inside it.
    "cpu_bound": Scenario(
        "tiny",
        ("--max-num-seqs", "256"),
        (Phase("idle", 15), Phase("cpu_bound", 130, 128, 8, 16), Phase("idle", 15)),
        "cpu_bound: gpu_starved naming the engine core's main thread; no compute_bound or memory_bandwidth_bound.",
    ),
    # The GPU does the work: long prompts (prefill), then a big decode batch.
    "gpu_heavy": Scenario(
        "1b",
        ("--max-num-seqs", "256"),
        (Phase("prefill_heavy", 70, 32, 900, 1), Phase("decode_heavy", 80, 128, 16, 400), Phase("idle", 10)),
        "prefill_heavy: SM activity and tensor activity well above decode's; decode_heavy: DRAM bandwidth above "
        "prefill's. Whether either crosses compute_bound's or memory_bandwidth_bound's thresholds is what this "
        "run measures (eager mode, one 1B model).",
    ),
    # vLLM's own torch profiler (its /start_profile and /stop_profile) on the serving setup: a 1 s torch profile late in each loaded
    # phase, once the sidecar's verdict for that phase has had time to rise; `vllm-triage trace` summarises.
    "profiled": Scenario(
        "1b",
        (*SERVING_FLAGS, "--profiler-config", json.dumps({"profiler": "torch", "torch_profiler_dir": str(PROFILE_DIR), "torch_profiler_with_stack": False})),
        (Phase("idle", 10), Phase("underload", 190, 2, 40, 160), Phase("kv_saturation", 150, 40, 40, 160), Phase("recovery", 20)),
        "underload (profile at 170 s): the sidecar says client_underload (or gpu_starved launch_overhead if the engine "
        "core's thread is saturated); the trace shows the GPU busy well under half the window with many short gaps "
        "between steps (the host's pace, not the GPU's). kv_saturation (profile at 120 s): the sidecar says "
        "kv_cache_saturated; the trace shows the GPU busier than in underload, no GPU-side verdict.",
        profile_at=(("underload", 170.0), ("kv_saturation", 120.0)),
    ),
    # vLLM's own FLOPs and bytes estimates (--enable-mfu-metrics) against the H200's peaks, then a hung engine:
    # the engine core stopped with SIGSTOP while 8 requests are in flight, and continued.
    "efficiency_wedge": Scenario(
        "1b",
        ("--max-num-seqs", "256", "--enable-mfu-metrics"),
        (
            Phase("idle", 10),
            Phase("prefill_heavy", 60, 32, 900, 1),
            Phase("decode_heavy", 60, 128, 16, 400),
            Phase("wedged", 75, 8, 40, 900),
            Phase("recovery", 30),
        ),
        "prefill_heavy: model FLOPs utilization well above decode's, under the compute roof (roofline_memory_bound 0). "
        "decode_heavy: under the memory roof (roofline_memory_bound 1), model bandwidth utilization above prefill's. "
        "wedged (engine core stopped 15-50 s into the phase): engine_wedged with cause process_stopped within 30 s of the "
        "stop, primary, the GPU idle in its evidence; it clears within 5 s of SIGCONT; no gpu_starved, client_underload or "
        "queue_backlog during the stop. idle and recovery: nothing.",
        stop_engine=("wedged", 15.0, 35.0),
    ),
    # A noisy neighbour: the engine core (which launches the GPU's work at TP 1) pinned to one CPU shared with three
    # busy loops, the load unchanged; then the CPU is freed. Wide layers (dummy weights: nothing to write) keep the
    # GPU busy at full CPU: the 1B model's eager steps are CPU-bound already (gpu_starved at baseline, first run).
    "contention": Scenario(
        "wide",
        ("--max-num-seqs", "256", "--load-format", "dummy", "--dtype", "bfloat16"),
        (
            Phase("idle", 10),
            Phase("serving", 90, 128, 300, 128),
            Phase("contended", 100, 128, 300, 128),
            Phase("recovered", 150, 128, 300, 128),
            Phase("idle", 10),
        ),
        "serving and recovered: no gpu_starved (the GPU keeps up). contended (engine core and three busy loops on one CPU): "
        "gpu_starved within 90 s with cause cpu_contention, the engine core's thread waiting for its CPU in the evidence; "
        "tokens per second and SM activity well below serving's. It clears after recovered starts.",
        actions=(("contended", 0.0, "contend", 3.0),),
    ),
    # A rollout that turns CUDA graphs off: the 1B model at vLLM's defaults (torch.compile, CUDA graphs) under 32 clients,
    # then relaunched with --enforce-eager under the same load (every decode step's kernels launched one by one from
    # Python: the engine core's thread is the limit, gpu_starved in the demo's underload).
    "eager_change": Scenario(
        "1b",
        ("--max-num-seqs", "256"),
        (Phase("idle", 5), Phase("graphs", 120, 32, 40, 160), Phase("relaunch", 5), Phase("eager", 120, 32, 40, 160), Phase("idle", 10)),
        "graphs: nothing (no regression: no change seen yet). relaunch (the API server stopped, vLLM started again with "
        "--enforce-eager added; the phase lasts until it answers): no regression. eager (the same 32 clients): output tokens "
        "per second per request in flight well below graphs' (CUDA graphs off), regression_after_change within 90 s naming "
        "--enforce-eager and the ratio.",
        actions=(("relaunch", 0.0, "relaunch", 0.0),),
        cuda_graphs=True,
        relaunch_flags=("--max-num-seqs", "256", "--enforce-eager"),
    ),
    # Weights offloaded to host memory from a GPU with room for them: --cpu-offload-gb 1 leaves half the 1B model's ~2 GB
    # of bf16 weights in pinned host memory, which vLLM's UVA offloader reads over PCIe at every forward pass, while
    # --gpu-memory-utilization 0.5 leaves half the GPU free; then relaunched without the flag under the same 32 clients.
    "cpu_offload": Scenario(
        "1b",
        ("--max-num-seqs", "256", "--cpu-offload-gb", "1"),
        (Phase("idle", 10), Phase("offloaded", 150, 32, 40, 160), Phase("relaunch", 5), Phase("resident", 120, 32, 40, 160), Phase("idle", 10)),
        "offloaded: feature_ineffective with cause cpu_offload within its for, the flag and the GPU's free memory (tens of "
        "GiB, far more than 1 GiB) in its evidence, advice to drop --cpu-offload-gb 1; PCIe busier than resident's. "
        "relaunch (vLLM started again without --cpu-offload-gb): no cpu_offload. resident (the same 32 clients): no "
        "cpu_offload cause; output tokens per second above offloaded's.",
        actions=(("relaunch", 0.0, "relaunch", 0.0),),
        relaunch_flags=("--max-num-seqs", "256", "--enforce-eager"),
    ),
    # Another program computing on vLLM's GPU (a training job or a notebook left on a shared GPU): in a tensor-parallel
    # group the rank on that GPU is the straggler; here, one GPU, what NVML and GPM read of it.
    "foreign": Scenario(
        "wide",
        ("--max-num-seqs", "256", "--load-format", "dummy", "--dtype", "bfloat16"),
        (
            Phase("idle", 10),
            Phase("serving", 60, 128, 300, 128),
            Phase("shared", 90, 128, 300, 128),
            Phase("recovered", 60, 128, 300, 128),
            Phase("idle", 10),
        ),
        "shared (another process running bf16 matmuls on the GPU): NVML lists it beside vLLM's engine core, "
        "gpu_foreign_compute_processes 1 (0 in serving and recovered); SM activity above serving's and vLLM's tokens per "
        "second below it. No tensor-parallel verdict (one GPU: no group).",
        actions=(("shared", 0.0, "foreign_process", 0.0),),
    ),
    # The same, recorded since the GPU source reads NVML's per-process SM samples and tells vLLM's own tree apart.
    "gpu_shared": Scenario(
        "wide",
        ("--max-num-seqs", "256", "--load-format", "dummy", "--dtype", "bfloat16"),
        (
            Phase("idle", 10),
            Phase("serving", 40, 128, 300, 128),
            Phase("shared", 90, 128, 300, 128),
            Phase("recovered", 45, 128, 300, 128),
            Phase("idle", 10),
        ),
        "shared: another process takes a CUDA context and 1 GiB on the GPU and runs no kernel for 30 s (no gpu_shared: "
        "NVML lists it, its per-process samples give it no SM time), then runs bf16 matmuls: gpu_shared within 30 s of "
        "foreign_computing, the primary verdict, its evidence naming the program's pid, its GPU memory and its share of "
        "the GPU's SM time (well above zero); vLLM's own processes not counted. serving and recovered: no gpu_shared (it "
        "clears within 30 s of the program's exit).",
        actions=(("shared", 0.0, "foreign_process", 30.0),),
    ),
    # KV thrash on the GPU: more sequences admitted than the cache holds (128 on 48 blocks of 16: two requests of
    # 340 tokens fit whole), so vLLM preempts all the time and its sampled gauges may read anything between scrapes.
    "kv_thrash": Scenario(
        "1b",
        ("--max-num-seqs", "128", "--num-gpu-blocks-override", "48", "--block-size", "16", "--max-model-len", "512"),
        (Phase("idle", 10), Phase("steady", 60, 3, 40, 100), Phase("thrash", 200, 128, 40, 300), Phase("recovery", 200)),
        "steady: nothing. thrash: kv_cache_saturated and queue_backlog within 90 s at the default settings and held to the "
        "phase's end whatever the usage gauge samples, preemption_storm too; kv_cache_saturated primary. recovery: every "
        "verdict clears within its window plus clear_for.",
    ),
    # A kernel that does not finish for 40 s on the engine's GPU, then it does.
    "hung_kernel": Scenario(
        "wide",
        ("--max-num-seqs", "256", "--load-format", "dummy", "--dtype", "bfloat16"),
        (Phase("idle", 10), Phase("serving", 40, 8, 40, 400), Phase("hung", 60, 8, 40, 400), Phase("recovery", 40, 8, 40, 400)),
        "serving: nothing. hung (a 40 s kernel enqueued 5 s in): engine_wedged within 40 s with cause hung_kernel (or blocked), "
        "util.gpu near 1 with idle SMs in its evidence; it clears once the kernel ends (about 45 s in).",
        actions=(("hung", 5.0, "hang_kernel", 40.0),),
    ),
    # The API server killed (an OOM kill) while its engine core lives on, holding the GPU (the first run's hang did not take).
    "hang_orphan": Scenario(
        "1b",
        ("--max-num-seqs", "256"),
        (Phase("idle", 10), Phase("serving", 50, 8, 40, 400), Phase("hung", 70, 8, 40, 400), Phase("orphaned", 60)),
        "orphaned (the API server SIGKILLed at its start): vllm_unreachable within 35 s, naming the engine core that outlived it and the GPU memory it holds.",
        actions=(("hung", 5.0, "hang_kernel", 200.0), ("orphaned", 0.0, "kill_api_server", 0.0)),
    ),
    # A rollout: the sidecar records from the pod's start, vLLM is launched 5 s later and loads its model (its real start,
    # from launch until it answers), then serves.
    "rollout": Scenario(
        "1b",
        ("--max-num-seqs", "256"),
        (Phase("loading", 5), Phase("serving", 90, 16, 40, 100), Phase("idle", 10)),
        "loading (vLLM launched 5 s in; the phase lasts until it answers): vllm_starting, nothing active. serving: nothing.",
        actions=(("loading", 5.0, "launch", 0.0),),
    ),
    # Where the cause lives in another layer than the symptom (the queue, the TTFT): each truth is written before its run.
    # The wide model (8 Llama-70B-shaped layers, dummy weights) at three loads: a healthy decode of 12 clients (the engine
    # core's thread spins in CUDA syncs at a full core), 128 clients (well sized), then 384 streamed clients of long prompts.
    "compute_limit": Scenario(
        "wide",
        ("--max-num-seqs", "512", "--load-format", "dummy", "--dtype", "bfloat16"),
        (
            Phase("idle", 10),
            Phase("healthy", 80, 12, 300, 128),
            Phase("well_sized", 80, 128, 300, 128),
            Phase("saturated", 150, 384, 900, 32, stream=True),
            Phase("idle", 10),
        ),
        "healthy (12 clients): the engine core's main thread near a full core, SM activity ~0.4, util.gpu ~0.5: no warning and "
        "no critical verdict (no gpu_starved: the thread spins in CUDA syncs while the GPU has a kernel half the time or more). "
        "well_sized (128 clients): no warning and no critical verdict. saturated (384 streamed clients of 900-word prompts): "
        "tensor activity >= 0.6 or SM activity >= 0.8, requests waiting while KV has room and running stays below 512: "
        "queue_backlog with cause gpu_compute (advice: replicas), compute_bound active, ttft_high (if its p95 passes 2 s) with "
        "cause queueing; no gpu_starved.",
    ),
    # The API server is the limit: a tiny model, hundreds of streamed clients asking for logprobs (one SSE chunk per token).
    "api_server_bound": Scenario(
        "tiny",
        ("--max-num-seqs", "512"),
        (Phase("idle", 10), Phase("streaming", 150, 384, 8, 256, stream=True, logprobs=5), Phase("idle", 10)),
        "streaming: the API server's main thread ~1 core with the GIL held most of the time, the engine core well under a core, "
        "SM activity near 0: gpu_starved with cause api_server and advice --api-server-count 2 or more; ttft_high (where its "
        "p95 passes 2 s) with cause api_server (vLLM's queue and prefill times a small part of its TTFT); no compute_bound.",
    ),
    # --max-num-seqs far below the offered load on a GPU-bound model: requests queue behind the cap.
    "seqs_cap": Scenario(
        "wide",
        ("--max-num-seqs", "8", "--load-format", "dummy", "--dtype", "bfloat16"),
        (Phase("idle", 10), Phase("capped", 130, 48, 300, 128), Phase("idle", 10)),
        "capped (48 clients on 8 sequences): 8 running, ~40 waiting, KV almost empty: queue_backlog with cause concurrency_cap "
        "and advice to raise --max-num-seqs, primary; ttft_high with cause queueing; no gpu_starved (a healthy decode).",
    ),
    # --max-num-batched-tokens small for long prompts: each prompt takes several steps; requests wait for the token budget.
    "token_budget": Scenario(
        "wide",
        ("--max-num-seqs", "128", "--max-num-batched-tokens", "256", "--load-format", "dummy", "--dtype", "bfloat16"),
        (Phase("idle", 10), Phase("budget", 130, 64, 900, 16), Phase("idle", 10)),
        "budget (64 clients of 900-word prompts on 256 tokens per step): tokens per step at the budget, requests waiting while "
        "KV has room and running stays below 128: queue_backlog with cause token_budget (advice: raise "
        "--max-num-batched-tokens), ttft_high with cause queueing; no concurrency_cap, no gpu_starved.",
    ),
    # KV offloading to CPU memory (--kv-offloading-size: vLLM's OffloadingConnector) on a GPU cache of 256 blocks of 16
    # (64 KiB a token for the 1B model: 4096 tokens), 16 clients of 120-word prompts (~8 blocks each): first every prompt
    # new (what is stored is never asked for again), then prompts drawn from 400 (~3,200 blocks: far more than the GPU
    # keeps, well within the 4 GiB offloaded).
    "kv_offload": Scenario(
        "1b",
        ("--max-num-seqs", "32", "--num-gpu-blocks-override", "256", "--block-size", "16", "--max-model-len", "512", "--kv-offloading-size", "4"),
        (Phase("idle", 10), Phase("unique", 150, 16, 120, 64), Phase("returning", 150, 16, 120, 64, prompt_pool=400), Phase("idle", 10)),
        "unique: vLLM stores KV blocks to CPU memory and loads none back (kv_offload_store_bytes_per_second > 0, loads 0 "
        "since start): feature_ineffective with cause kv_offload within its for. returning: loads > 0 (prompts found in "
        "CPU memory): it clears; no kv_offload cause.",
    ),
    # vLLM killed while idle after serving: nothing listens any more, its GPU memory freed.
    "killed": Scenario(
        "1b",
        ("--max-num-seqs", "256"),
        (Phase("idle", 10), Phase("serving", 60, 16, 40, 100), Phase("down", 180)),
        "down (every vLLM process SIGKILLed at its start): vllm_unreachable within 35 s, held to the end; no engine_wedged.",
        actions=(("down", 0.0, "kill_vllm", 0.0),),
    ),
}

# Installed in vLLM's processes through sitecustomize: a thread that waits for HANG_TRIGGER to name its pid, then
# enqueues a kernel that spins for the given seconds (in SM clock cycles at the GPU's maximum SM clock) on the legacy
# default stream, which every blocking stream waits for: the engine's next step and synchronize wait behind it. (A
# SIGUSR1 handler did not run in vLLM 0.26.0's engine core: the first run served on through it.)
HANG_TRIGGER = Path("/tmp/vllm-hang")
HANG_HOOK = f"""
import os, threading, time

def _wait_for_trigger():
    while True:
        time.sleep(0.5)
        try:
            pid, seconds = open("{HANG_TRIGGER}").read().split()
        except (OSError, ValueError):
            continue
        if int(pid) != os.getpid():
            continue
        os.unlink("{HANG_TRIGGER}")
        import pynvml, torch
        pynvml.nvmlInit()
        mhz = pynvml.nvmlDeviceGetMaxClockInfo(pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.NVML_CLOCK_SM)
        with torch.cuda.stream(torch.cuda.default_stream()):
            torch.cuda._sleep(int(float(seconds) * mhz * 1e6))
        print(f"sitecustomize: a {{seconds}} s kernel enqueued in pid {{pid}}", flush=True)

threading.Thread(target=_wait_for_trigger, daemon=True, name="hang-trigger").start()
"""
HOOKS = Path("/tmp/vllm-hooks")


MODEL_SHAPES = {  # Llama configs; the word-level tokenizer of the staging payload (vocab 768)
    "tiny": {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64},
    "wide": {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 8, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128},
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128},
}


def make_model(kind: str, staged: Path) -> Path:
    """A Llama with random bf16 weights, made here with transformers (nothing to download), and the
    staged tokenizer."""
    target = MODELS / kind
    if (target / "config.json").exists():
        return target
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    target.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (target / name).write_bytes((staged / name).read_bytes())
    config = LlamaConfig(vocab_size=768, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, **MODEL_SHAPES[kind])
    if kind == "wide":  # served with --load-format dummy: vLLM makes its own random weights
        config.torch_dtype = "bfloat16"
        config.save_pretrained(target)
        return target
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(target)
    print(f"made the {kind} model: {sum(p.numel() for p in model.parameters()) / 1e9:.3f} B parameters", flush=True)
    return target


def start_vllm(model: Path, flags: tuple[str, ...], log: Path, hang_seconds: float | None = None, eager: bool = True) -> subprocess.Popen[bytes]:
    paths = SITE
    if hang_seconds is not None:
        HOOKS.mkdir(parents=True, exist_ok=True)
        (HOOKS / "sitecustomize.py").write_text(HANG_HOOK)
        paths = f"{HOOKS}:{SITE}"
    env = {
        **os.environ,
        "PYTHONPATH": paths,
        "VLLM_USE_FLASHINFER_SAMPLER": "0",  # flashinfer is not staged
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
    }
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", "tiny"]
    length = () if "--max-model-len" in flags else ("--max-model-len", "1024")  # 48 blocks of 16 hold only 768 tokens
    command += ["--port", str(PORT), *length, *(["--enforce-eager"] if eager else []), "--gpu-memory-utilization", "0.5", *flags]
    process = subprocess.Popen(command, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env)
    try:
        wait_healthy(URL, process, log, 300)
    except RuntimeError:
        process.kill()
        raise
    return process


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()


def save_page(path: Path) -> None:
    with urllib.request.urlopen(URL + "/metrics", timeout=10) as response:
        path.write_bytes(response.read())


def post(path: str) -> None:
    urllib.request.urlopen(urllib.request.Request(URL + path, method="POST"), timeout=300).read()


async def take_profile(after: float, target: Path, profiles: list[tuple[str, float, float]]) -> None:
    """A PROFILE_SECONDS torch profile `after` seconds from now, its files moved to `target`."""
    await asyncio.sleep(after)
    started = time.time()
    await asyncio.to_thread(post, "/start_profile")
    await asyncio.sleep(PROFILE_SECONDS)
    await asyncio.to_thread(post, "/stop_profile")
    profiles.append((target.name, started, time.time()))
    target.mkdir(parents=True, exist_ok=True)
    for path in PROFILE_DIR.iterdir():
        path.rename(target / path.name)
    print(f"  profiled {target.name}: {sorted(p.name for p in target.iterdir())}", flush=True)


def engine_core_pid() -> int:
    import psutil

    return next(p.pid for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [""])[0].startswith("VLLM::EngineCore"))


async def stop_engine(after: float, seconds: float, marks: list[tuple[str, float]]) -> None:
    """SIGSTOP the engine core `after` seconds from now, SIGCONT it `seconds` later (the API server keeps answering)."""
    await asyncio.sleep(after)
    pid = engine_core_pid()
    os.kill(pid, signal.SIGSTOP)
    marks.append(("engine_stopped", time.time()))
    print(f"  stopped the engine core (pid {pid}) for {seconds:.0f} s", flush=True)
    try:
        await asyncio.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)
        marks.append(("engine_continued", time.time()))


def vllm_pids(title: str) -> list[int]:
    import psutil

    return [p.pid for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [""])[0].startswith(title)]


@dataclass
class Server:
    """The vLLM of a scenario: started before it, or by its `launch` action."""

    model: Path
    flags: tuple[str, ...]
    log: Path
    hang_seconds: float | None
    eager: bool = True
    relaunch_flags: tuple[str, ...] | None = None
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = start_vllm(self.model, self.flags, self.log, self.hang_seconds, self.eager)

    def relaunch(self) -> None:
        """Stopped as Kubernetes stops a pod (SIGTERM), then started with the relaunch flags (they say --enforce-eager)."""
        assert self.process is not None and self.relaunch_flags is not None
        stop(self.process)
        for pid in vllm_pids("VLLM::"):
            os.kill(pid, signal.SIGKILL)
        self.flags, self.eager = self.relaunch_flags, False
        self.start()


async def act(action: str, argument: float, after: float, server: Server, marks: list[tuple[str, float]], until: float) -> None:
    """One of Scenario.actions, `after` seconds from now; a contention ends at `until` (the phase's end)."""
    await asyncio.sleep(after)
    if action in ("launch", "relaunch"):
        marks.append(("vllm_launched", time.time()))
        await asyncio.to_thread(server.start if action == "launch" else server.relaunch)
        marks.append(("vllm_ready", time.time()))
        print(f"  vLLM {action}ed and answering after {marks[-1][1] - marks[-2][1]:.0f} s", flush=True)
        return
    assert server.process is not None
    if action == "contend":
        core = engine_core_pid()
        cpu = sorted(os.sched_getaffinity(core))[0]
        allowed = ",".join(map(str, sorted(os.sched_getaffinity(core))))
        spin = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
        hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(int(argument))]
        subprocess.run(["taskset", "-a", "-cp", str(cpu), str(core)], check=True, capture_output=True)
        marks.append(("contention_started", time.time()))
        print(f"  the engine core (pid {core}) pinned to CPU {cpu} with {len(hogs)} busy loops", flush=True)
        try:
            await asyncio.sleep(max(0.0, until - time.time()))
        finally:
            subprocess.run(["taskset", "-a", "-cp", allowed, str(core)], check=False, capture_output=True)
            for hog in hogs:
                hog.kill()
            marks.append(("contention_ended", time.time()))
    elif action == "foreign_process":
        # `argument` s holding its context and memory without a kernel (a notebook left open), then bf16 matmuls
        computing = time.time() + argument
        code = (
            "import time, torch\nx = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\ntorch.cuda.synchronize()\n"
            f"time.sleep(max(0.0, {computing} - time.time()))\nwhile True:\n    y = x @ x\n    torch.cuda.synchronize()"
        )
        other = subprocess.Popen([sys.executable, "-c", code])
        marks.append(("foreign_started", time.time()))
        print(f"  another program (pid {other.pid}) on the GPU, computing {argument:.0f} s from now", flush=True)
        try:
            if argument:
                await asyncio.sleep(max(0.0, computing - time.time()))
                marks.append(("foreign_computing", time.time()))
            await asyncio.sleep(max(0.0, until - time.time()))
        finally:
            other.kill()
            other.wait()
            marks.append(("foreign_ended", time.time()))
    elif action == "hang_kernel":
        core = engine_core_pid()
        HANG_TRIGGER.write_text(f"{core} {argument}")
        marks.append(("kernel_hung", time.time()))
        print(f"  the engine core (pid {core}) asked to enqueue a {argument:.0f} s kernel", flush=True)
    elif action == "kill_api_server":
        os.kill(server.process.pid, signal.SIGKILL)
        marks.append(("api_server_killed", time.time()))
        print(f"  SIGKILL to the API server (pid {server.process.pid}); engine cores alive: {vllm_pids('VLLM::EngineCore')}", flush=True)
    elif action == "kill_vllm":
        pids = [server.process.pid, *vllm_pids("VLLM::")]
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        marks.append(("vllm_killed", time.time()))
        print(f"  SIGKILL to every vLLM process: {pids}", flush=True)


async def drive(scenario: Scenario, name: str, out: Path, marks: list[tuple[str, float]], server: Server) -> None:
    profiles: list[tuple[str, float, float]] = []
    for phase in scenario.phases:
        marks.append((phase.name, time.time()))
        print(f"{time.strftime('%H:%M:%S')} {name}: phase {phase.name} ({phase.seconds:.0f} s, {phase.clients} clients)", flush=True)
        if phase.clients:
            load = (
                run_load_processes(URL, "tiny", phase, LOAD_PROCESSES)
                if phase.stream
                else run_load(URL, "tiny", phase.clients, phase.seconds, phase.prompt_words, phase.max_tokens, prompt_pool=phase.prompt_pool)
            )
            profile_at = dict(scenario.profile_at).get(phase.name)
            acts = [act(a, arg, after, server, marks, time.time() + phase.seconds) for p, after, a, arg in scenario.actions if p == phase.name]
            if acts:
                result, *_ = await asyncio.gather(load, *acts)
            elif profile_at is not None:
                result, _ = await asyncio.gather(load, take_profile(profile_at, out / "traces" / phase.name, profiles))
            elif scenario.stop_engine is not None and scenario.stop_engine[0] == phase.name:
                result, _ = await asyncio.gather(load, stop_engine(*scenario.stop_engine[1:], marks))
            else:
                result = await load
            await asyncio.to_thread(save_page, out / f"{name}-{phase.name}.metrics.txt")
            print(f"  {result}", flush=True)
        else:
            acts = [act(a, arg, after, server, marks, time.time() + phase.seconds) for p, after, a, arg in scenario.actions if p == phase.name]
            await asyncio.gather(asyncio.sleep(phase.seconds), *acts)
    marks.append(("end", time.time()))
    if profiles:
        (out / f"{name}-profiles.json").write_text(json.dumps(profiles))


async def record(scenario: Scenario, name: str, out: Path, server: Server) -> None:
    # Recorded every 2 s and py-spy every 120 s, finer than the default cadence: a replay reads them at any longer one
    # (harness/cadence.py).
    config = load(env={}, flags={"vllm_url": URL, **every(2.0), "gil_interval_seconds": 120.0})
    marks: list[tuple[str, float]] = []
    description = {
        "scenario": name,
        "flags": list(scenario.flags),
        "model": scenario.model,
        "phases": [[p.name, p.seconds, p.clients] for p in scenario.phases],
        "truth": scenario.truth,
        "vllm_url": URL,
        "created": time.time(),
    }
    with CaptureWriter(out / f"{name}.jsonl.gz", description) as writer:
        observing = asyncio.create_task(observe(config, 3600, writer))
        await drive(scenario, name, out, marks, server)
        await asyncio.sleep(20)  # requests in flight finish after a phase ends
        observing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await observing
    (out / f"{name}.json").write_text(json.dumps(marks))


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    staged = Path(os.environ.get("STAGED_MODEL", "/tmp/staged-model"))
    for name in sys.argv[2:]:
        scenario = SCENARIOS[name]
        model = make_model(scenario.model, staged)
        hang = next((arg for _, _, action, arg in scenario.actions if action == "hang_kernel"), None)
        server = Server(model, scenario.flags, out / f"{name}-vllm.log", hang, not scenario.cuda_graphs, scenario.relaunch_flags)
        if not any(action == "launch" for _, _, action, _ in scenario.actions):
            server.start()
            print(f"{time.strftime('%H:%M:%S')} {name}: vLLM ready", flush=True)
        try:
            asyncio.run(record(scenario, name, out, server))
        finally:
            if server.process is not None:
                stop(server.process)
            for pid in vllm_pids("VLLM::"):  # an engine core that outlived its API server
                os.kill(pid, signal.SIGKILL)
        if (out / "traces").is_dir():
            summarize_traces(out / "traces", out / f"{name}-traces")
        print(f"{time.strftime('%H:%M:%S')} {name}: done", flush=True)


def summarize_traces(traces: Path, stem: Path) -> None:
    """`vllm-triage trace` over each phase's profile: the report and its JSON beside the capture."""
    reports, summaries = [], {}
    for phase in sorted(traces.iterdir()):
        found, _ = traces_module.summarize_paths([str(phase)])
        summaries[phase.name] = [s.to_json() for s in found]
        reports.append(f"## {phase.name}\n\n" + "\n\n".join(traces_module.report(s) for s in found))
    stem.with_suffix(".json").write_text(json.dumps(summaries, indent=1))
    stem.with_suffix(".txt").write_text("\n\n".join(reports))
    print(stem.with_suffix(".txt").read_text()[:6000], flush=True)


if __name__ == "__main__":
    main()
