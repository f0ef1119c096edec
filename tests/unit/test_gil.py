"""The GIL source against real processes whose GIL duty cycle is known, and without ptrace rights."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import psutil
import pytest
import vllm_triage
from vllm_triage.model import ProcessTargets
from vllm_triage.sources.gil import GilSource, dump_stacks, find_py_spy, hot_functions, where_stuck

from harness.gil_target import read_ratio, sample_known_duty


@pytest.mark.parametrize("nonblocking", [True, False], ids=["nonblocking (the default)", "blocking"])
@pytest.mark.parametrize("duty", [0.0, 0.5, 0.9])
def test_gil_held_ratio_matches_a_known_duty_cycle(duty, nonblocking, tmp_path):
    # Blocking mode read 0.03-0.07 below the truth here at every duty, nonblocking within 0.02; 0.15 leaves
    # room for a loaded CI machine and still fails a ratio that is wrong in kind (0, 1, or not GIL-only).
    reading, held, truth = sample_known_duty(duty, tmp_path, nonblocking=nonblocking)
    if abs(held - truth) > 0.15:
        # A burst of contention on the 2-core machine biases one window: blocking mode stops the target for every
        # sample (0.67 read for 0.89 held, once in many runs); at duty 0.9 a target preempted while it holds the GIL
        # measures less than py-spy sees held (0.85 read for 0.68 measured, nonblocking, once, right after a CI run
        # tore down its containers). A second window must then read right.
        first = (held, truth)
        reading, held, truth = sample_known_duty(duty, tmp_path, nonblocking=nonblocking)
        assert abs(held - truth) <= 0.15, (first, (held, truth))
    hot = [dict(labels) for (name, labels), _ in reading.samples.items() if name == "gil_hot_function_ratio"]
    assert abs(held - truth) <= 0.15, (held, truth)
    if duty:
        assert any(h["function"] == "spin_a_share_of_each_period" and h["role"] == "engine_core" for h in hot)
        assert all("line" not in h and ":" not in h["file"] for h in hot)  # no line numbers in labels


@pytest.mark.parametrize("duty", [0.3, 0.7])
def test_nonblocking_reads_a_churning_stack_among_90_threads_by_counting_failed_reads_as_held(duty, tmp_path):
    # vLLM's engine core: ~90 threads and a stack that changes all the time. A nonblocking read of the GIL
    # holder's stack then fails for a quarter to half of the held samples; read as "not held", the ratio
    # came out ~0.25 low here.
    reading, held, truth = sample_known_duty(duty, tmp_path, idle=90, churn=True)
    failed = read_ratio(reading, "gil_failed_sample_ratio")
    assert abs(held - truth) <= 0.15, (held, truth, failed)


def test_hot_functions_parse_py_spy_raw_lines():
    raw = "worker (a.py:3);spin (/x/b.py:10) 40\nworker (a.py:3);spin (/x/b.py:11) 20\n<module> (c.py:1) 5\n"
    assert hot_functions(raw, 5) == [("spin", "b.py", 60), ("<module>", "c.py", 5)]


NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")


@pytest.fixture(scope="module")
def readable_by_nobody():
    """The GIL source's code, psutil and py-spy copied where user nobody can read them: the checkout
    and its venv may sit in a folder only root can read (a clone under /root, a mktemp -d folder)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop privileges")
    interpreter = os.path.realpath(sys.executable)
    if subprocess.run([*NOBODY, interpreter, "-c", "pass"], capture_output=True).returncode != 0:
        pytest.skip(f"user nobody cannot run this Python ({interpreter})")
    directory = tempfile.mkdtemp(prefix="gil-as-nobody-", dir="/tmp")
    for module in (vllm_triage, psutil):
        source = os.path.dirname(module.__file__ or "")
        shutil.copytree(source, os.path.join(directory, os.path.basename(source)), ignore=shutil.ignore_patterns("__pycache__"))
    py_spy = find_py_spy()
    if py_spy:
        shutil.copy(py_spy, os.path.join(directory, "py-spy"))
    subprocess.run(["chmod", "-R", "a+rX", directory], check=True)
    yield interpreter, directory
    shutil.rmtree(directory)


def gil_as_nobody(readable: tuple[str, str], target_pid: int, py_spy: str | None = None, setpriv_options: tuple[str, ...] = ()) -> dict:
    """One GIL window taken by a GilSource running as user nobody, as the image's non-root sidecar does."""
    interpreter, directory = readable
    py_spy = py_spy or os.path.join(directory, "py-spy")
    code = (
        "import asyncio, json; from vllm_triage.model import ProcessTargets; from vllm_triage.sources.gil import GilSource; "
        f"r = asyncio.run(GilSource(ProcessTargets([('engine_core', {target_pid})]), window_seconds=1, py_spy={py_spy!r}).collect()); "
        "print(json.dumps({'ok': r.ok, 'reason': r.error_reason, 'error': r.error, 'samples': [[k[0], v] for k, v in r.samples.items()]}))"
    )
    env = {**os.environ, "PYTHONPATH": directory}
    result = subprocess.run([*NOBODY, *setpriv_options, interpreter, "-c", code], capture_output=True, text=True, env=env, timeout=60, cwd="/tmp")
    assert result.returncode == 0 and result.stdout.strip(), f"the GIL source as nobody failed: {result.stderr[-2000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_without_ptrace_rights_the_message_names_the_fix(readable_by_nobody):
    """py-spy run as an unprivileged user against a root-owned process: a real EPERM."""
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        outcome = gil_as_nobody(readable_by_nobody, target.pid)
    finally:
        target.kill()
    assert not outcome["ok"] and outcome["reason"] == "no_permission"
    assert "CAP_SYS_PTRACE" in outcome["error"] and "shareProcessNamespace" in outcome["error"]


@pytest.fixture
def py_spy_with_file_capability():
    """py-spy as the Dockerfile installs it: `setcap cap_sys_ptrace+ep`, runnable by any user."""
    if os.geteuid() != 0 or not shutil.which("setcap") or find_py_spy() is None:
        pytest.skip("needs root, setcap (libcap2-bin) and py-spy")
    directory = tempfile.mkdtemp(prefix="py-spy-cap-", dir="/tmp")
    os.chmod(directory, 0o755)
    binary = os.path.join(directory, "py-spy")
    shutil.copy(find_py_spy(), binary)
    subprocess.run(["setcap", "cap_sys_ptrace+ep", binary], check=True)
    yield binary
    shutil.rmtree(directory)


# The target must run from a binary nobody may read (py-spy reads the interpreter's symbols), as
# vLLM's image python is; this machine's own venv lives under /root.
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason="needs a system python")
def test_non_root_py_spy_with_the_file_capability_samples_a_root_process(readable_by_nobody, py_spy_with_file_capability):
    target = subprocess.Popen([SYSTEM_PYTHON, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        outcome = gil_as_nobody(readable_by_nobody, target.pid, py_spy_with_file_capability)
    finally:
        target.kill()
    assert outcome["ok"], outcome["error"]
    assert dict(outcome["samples"])["gil_held_ratio"] > 0.8


def test_container_without_sys_ptrace_gets_the_fix_not_a_crash(readable_by_nobody, py_spy_with_file_capability):
    """Pod without SYS_PTRACE: the kernel refuses to exec a binary whose file capability it cannot grant."""
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        outcome = gil_as_nobody(readable_by_nobody, target.pid, py_spy_with_file_capability, ("--bounding-set=-sys_ptrace",))
    finally:
        target.kill()
    assert not outcome["ok"] and outcome["reason"] == "no_permission"
    assert "permission denied" in outcome["error"] and "SYS_PTRACE" in outcome["error"]


def test_without_py_spy_one_clear_message():
    source = GilSource(ProcessTargets([("engine_core", os.getpid())]))
    source.py_spy = None  # as on a machine where the binary is missing
    reading = asyncio.run(source.collect())
    assert not reading.ok and reading.error_reason == "no_py_spy" and "pip install py-spy" in (reading.error or "")


def test_a_target_that_exits_mid_window_is_reported_gone_not_as_a_py_spy_crash():
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.8)"])
    time.sleep(0.3)
    reading = asyncio.run(GilSource(ProcessTargets([("engine_core", target.pid)]), window_seconds=2).collect())
    target.wait()
    assert not reading.ok and reading.error_reason == "target_gone", reading.error


def test_a_process_titled_like_the_engine_core_that_is_not_python_is_named_so():
    target = subprocess.Popen(["bash", "-c", "exec -a VLLM::EngineCore sleep 30"])
    try:
        time.sleep(0.2)
        reading = asyncio.run(GilSource(ProcessTargets([("engine_core", target.pid)]), window_seconds=1).collect())
    finally:
        target.kill()
    assert not reading.ok and reading.error_reason == "not_python", reading.error
    assert "no Python" in (reading.error or "")


def py_spy_children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.name() == "py-spy"]


def test_cancelling_a_window_kills_py_spy_at_once():
    """At shutdown the daemon cancels the GIL task: py-spy must not go on pausing vLLM for its window."""
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    async def cancel_mid_window() -> list[int]:
        task = asyncio.create_task(GilSource(ProcessTargets([("engine_core", target.pid)]), window_seconds=30).collect())
        for _ in range(100):
            await asyncio.sleep(0.05)
            if py_spy_children():
                break
        running = [p.pid for p in py_spy_children()]
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.3)
        return running

    try:
        running = asyncio.run(cancel_mid_window())
        assert running, "py-spy never started"
        assert not [p for p in py_spy_children() if p.pid in running and p.status() != psutil.STATUS_ZOMBIE]
    finally:
        target.kill()


def test_a_py_spy_that_exits_as_it_times_out_is_not_a_crash():
    """The timeout handler kills a py-spy that may have exited a moment before: no ProcessLookupError."""
    from vllm_triage.sources import gil

    class Exited:
        returncode = None

        def kill(self) -> None:
            raise ProcessLookupError

    gil._kill(Exited())  # type: ignore[arg-type]  # must not raise


# A process whose main thread waits where vLLM's engine core waits, under vLLM's function names: idle in its input
# queue, in a collective, compiling a grammar; or in none of them.
WAITER = """
import queue, sys, time
def _process_input_queue(q):
    return q.get()
def all_reduce():
    time.sleep(60)
def compile_grammar():
    end = time.monotonic() + 60
    while time.monotonic() < end:
        pass
def somewhere_else():
    time.sleep(60)
print("ready", flush=True)
{"idle": lambda: _process_input_queue(queue.Queue()), "collective": all_reduce, "grammar": compile_grammar, "other": somewhere_else}[sys.argv[1]]()
"""


@pytest.mark.parametrize(
    ("waits", "place", "function"),
    [
        ("idle", "waiting_for_requests", "get"),
        ("collective", "collective", "all_reduce"),
        ("grammar", "grammar_compilation", "compile_grammar"),
        ("other", None, None),
    ],
)
def test_a_stack_dump_says_where_the_main_thread_waits(waits, place, function):
    """py-spy dump of a real process, read for the place its main thread waits (engine_wedged's cause from its stacks)."""
    process = subprocess.Popen([sys.executable, "-c", WAITER, waits], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        time.sleep(0.3)
        dump = asyncio.run(dump_stacks(process.pid))
        assert "stacks" in dump, dump
        found = where_stuck(dump["stacks"])
        if place is None:
            assert found is None, found
        else:
            assert found is not None and found[0] == place and function in found[1], (found, dump["stacks"])
    finally:
        process.kill()
        process.wait()


def test_every_place_a_dump_can_name_has_its_words_in_engine_wedged():
    """The places (sources/gil.py) and engine_wedged's words for them are two tables: a place without words would fail
    every evaluation once a dump named it."""
    from vllm_triage.diagnosis.conditions.liveness import STUCK_WORDS
    from vllm_triage.sources.gil import STUCK_PLACES

    assert {place for place, _ in STUCK_PLACES} == set(STUCK_WORDS)
