"""The command line as a user meets it: help, bad config, replay and diagnose of the demo capture."""

from __future__ import annotations

import gzip
import json
import re
import signal
import subprocess
import tarfile
import threading
import time

import pytest
from vllm_triage.bundle import MARKER
from vllm_triage.cli import main
from vllm_triage.config import OPTIONS
from vllm_triage.history.capture import CaptureWriter, demo_capture_path, read_description, read_readings

from harness.components import BIN, start_sidecar
from harness.vllm_server import free_port


def test_serve_help_documents_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    for option in OPTIONS:
        assert option.flag in out
        assert option.env in out.replace("\n", " ").replace("  ", " ") or option.env in out
    # defaults as one writes them in the flag or the env variable, not as Python prints its values
    flat = " ".join(out.split())
    assert "default vllm,process,gpu,gil]" in flat and "('" not in flat and "default None]" not in flat


def test_bad_config_value_stops_startup_with_a_named_key(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("conditions:\n  ttft_high:\n    ttft_p95_max_seconds: -1\n")
    assert main(["serve", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "conditions.ttft_high.ttft_p95_max_seconds" in err and "-1" in err and ">= 0" in err


def test_bad_flag_value_is_named(capsys):
    assert main(["serve", "--vllm-url", "ftp://x"]) == 2
    assert "vllm_url" in capsys.readouterr().err


def test_replay_of_a_missing_or_foreign_file_is_a_clear_error(tmp_path, capsys):
    assert main(["replay", str(tmp_path / "nope.jsonl.gz")]) == 2
    assert "cannot open capture" in capsys.readouterr().err
    foreign = tmp_path / "foreign.jsonl.gz"
    with gzip.open(foreign, "wt") as handle:
        handle.write('{"hello": 1}\n')
    assert main(["replay", str(foreign)]) == 2
    assert "not a vllm-triage capture" in capsys.readouterr().err


def test_demo_replay_walks_through_idle_underload_and_saturation(capsys):
    """The bundled capture was recorded from a real vLLM 0.26.0 on an H200 (harness/gpu/real_vllm.py,
    scenario serving); replayed with default settings it must show the story it was recorded for, in
    order: with 2 clients the engine core's thread is the limit while the SMs idle (starvation leads,
    underload is suppressed), then the KV cache saturates, then everything clears."""
    assert main(["replay", "demo", "--json"]) == 0
    changes = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    activations = [(c["offset_seconds"], c["condition"]) for c in changes if c["state"] == "active"]
    first = {}
    for offset, condition in activations:
        first.setdefault(condition, offset)
    assert "gpu_starved" in first and "kv_cache_saturated" in first and "queue_backlog" in first
    assert first["gpu_starved"] < first["kv_cache_saturated"]
    assert "client_underload" not in first and "kv_fragmentation_suspected" not in first
    assert "vllm_unreachable" not in first
    backlog = next(c for c in changes if c["condition"] == "queue_backlog" and c["state"] == "active")
    assert backlog["cause"] == "kv_capacity"
    # by the end (recovery) the saturation has cleared
    last_state = {}
    for change in changes:
        last_state[change["condition"]] = change["state"]
    assert last_state["kv_cache_saturated"] == "inactive"


def test_replaying_twice_gives_identical_output(capsys):
    main(["replay", "demo"])
    first = capsys.readouterr().out
    main(["replay", "demo"])
    assert capsys.readouterr().out == first
    assert "kv_cache_saturated" in first


def test_diagnose_capture_at_a_moment_prints_an_actionable_report(capsys):
    readings = list(read_readings(demo_capture_path()))
    span = readings[-1].timestamp - readings[0].timestamp
    assert main(["diagnose", "--capture", "demo", "--at", str(span * 0.62), "--seconds", "60"]) == 0  # in the saturation
    report = capsys.readouterr().out
    assert "WHAT IS WRONG" in report
    assert "kv_cache_saturated" in report and "next actions:" in report
    assert "max_num_seqs=32 (from the vLLM command line" in report
    assert "PRIMARY: kv_cache_saturated" in report
    assert "COULD NOT JUDGE" not in report  # every layer is in the capture: vLLM, GPU, processes, GIL
    # as a check: the saturation's warnings fail --fail-on warning, not --fail-on critical (none is critical there)
    moment = ["diagnose", "--capture", "demo", "--at", str(span * 0.62), "--seconds", "60"]
    assert main([*moment, "--fail-on", "warning"]) == 1 and "kv_cache_saturated" in capsys.readouterr().err
    assert main([*moment, "--fail-on", "critical"]) == 0


def test_capture_round_trip(tmp_path):
    readings = list(read_readings(demo_capture_path()))[:20]
    path = tmp_path / "copy.jsonl.gz"
    with CaptureWriter(path, {"phases": [["idle", 45, 0]]}) as writer:
        for reading in readings:
            writer.write(reading)
    assert list(read_readings(path)) == readings
    assert read_description(path)["phases"] == [["idle", 45, 0]]
    assert [p[0] for p in read_description(demo_capture_path())["phases"]] == ["idle", "underload", "kv_saturation", "recovery"]


def test_generated_docs_are_current():
    from pathlib import Path

    from mixin.generate import main as generate

    assert generate([str(Path(__file__).resolve().parents[2]), "--check"]) == 0, "run `make generate` and commit"


def test_a_capture_cut_short_replays_what_it_holds(tmp_path, capsys):
    """A recorder that was killed leaves a gzip stream without its end: the readings before the
    cut are still evidence."""
    whole = tmp_path / "whole.jsonl.gz"
    readings = list(read_readings(demo_capture_path()))[:60]
    with CaptureWriter(whole) as writer:
        for reading in readings:
            writer.write(reading)
    cut = tmp_path / "cut.jsonl.gz"
    data = whole.read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3])
    kept = list(read_readings(cut))
    assert 0 < len(kept) < len(readings)
    assert kept == readings[: len(kept)]
    assert main(["replay", str(cut)]) == 0


def test_report_reads_a_running_sidecar_without_curl(tmp_path, capsys):
    """`kubectl exec <pod> -c vllm-triage -- vllm-triage report`: the image has no curl (nor jq)."""
    sidecar = start_sidecar(tmp_path, "http://127.0.0.1:9", "", "--demo")
    try:
        assert main(["report", "--url", sidecar.url]) == 0
        report = capsys.readouterr().out
        assert "vLLM version: 0.26.0" in report
        assert main(["report", "--url", sidecar.url, "--json", "--condition", "kv_cache_saturated"]) == 0
        verdict = json.loads(capsys.readouterr().out)
        assert verdict["condition"] == "kv_cache_saturated" and verdict["state"] in ("inactive", "pending", "active") and verdict["next_actions"]
        assert main(["report", "--url", sidecar.url, "--json", "--condition", "kv_cache_saturatd"]) == 2
        assert "kv_cache_saturated" in capsys.readouterr().err
    finally:
        sidecar.process.terminate()
        sidecar.process.wait(timeout=30)
    assert main(["report", "--url", sidecar.url, "--timeout", "2"]) == 1
    assert f"no sidecar answers at {sidecar.url}/report" in capsys.readouterr().err


def test_bundle_fetches_a_running_sidecar_s_incident_bundle_that_replays(tmp_path, capsys):
    """`kubectl exec <pod> -c vllm-triage -- vllm-triage bundle` before a restart: the sidecar's window, its verdicts and
    what it found of vLLM, as one .tar.gz whose capture replays."""
    sidecar = start_sidecar(tmp_path, "http://127.0.0.1:9", "", "--demo")
    try:
        time.sleep(4)  # a few of the demo's readings in the window
        out = tmp_path / "incident.tar.gz"
        assert main(["bundle", "--url", sidecar.url, "--out", str(out)]) == 0
        assert f"wrote {out}" in capsys.readouterr().err
    finally:
        sidecar.process.terminate()
        sidecar.process.wait(timeout=30)
    with tarfile.open(out) as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    (folder,) = (tmp_path / "unpacked").iterdir()
    assert folder.name.endswith("-asked")
    assert sorted(p.name for p in folder.iterdir()) == [MARKER, "README.txt", "capture.jsonl.gz", "diagnosis.json", "load.json", "stacks.json", "verdicts.json"]
    assert json.loads((folder / "diagnosis.json").read_text())["discovery"]["vllm_version"] == "0.26.0"
    assert list(read_readings(folder / "capture.jsonl.gz")) and main(["replay", str(folder / "capture.jsonl.gz")]) == 0
    assert main(["bundle", "--url", sidecar.url, "--timeout", "2"]) == 1
    assert f"no sidecar answers at {sidecar.url}/bundle.tar.gz" in capsys.readouterr().err


def test_the_demo_replays_faster_on_a_clock_as_fast(tmp_path, capsys):
    """`serve --demo --demo-speed 20`: the demo's KV saturation (kv_cache_saturated 284 s into the capture at speed 1,
    `vllm-triage replay demo`) is active within a minute, judged at the default settings in capture time."""
    sidecar = start_sidecar(tmp_path, "http://127.0.0.1:9", "", "--demo", "--demo-speed", "20")
    try:
        started = time.monotonic()
        active: list[str] = []
        while "kv_cache_saturated" not in active and time.monotonic() - started < 60:
            time.sleep(1)
            assert main(["report", "--url", sidecar.url, "--json"]) == 0
            active = [v["condition"] for v in json.loads(capsys.readouterr().out)["conditions"] if v["state"] == "active"]
        assert "kv_cache_saturated" in active, active
    finally:
        sidecar.process.kill()


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["diagnose", "--prometheus", "http://127.0.0.1:9", "--selector", "pod=x"], "expected label matchers in braces"),
        (["diagnose", "--prometheus", "http://127.0.0.1:9", "--at", "2026-12-01T02:40:00"], "give the time zone"),
        (["diagnose", "--prometheus", "http://127.0.0.1:9", "--at", "yesterday"], "expected Unix seconds, an ISO 8601 time"),
        (["diagnose", "--prometheus", "http://user:secret@127.0.0.1:9"], "did not answer"),
        (["replay", "--prometheus", "http://127.0.0.1:9"], "needs --from"),
        (["diagnose", "--prometheus", "http://127.0.0.1:9", "--at", "1e30"], "after the year 2100"),  # a 2 s step no longer moves time there
        (["fleet", "--prometheus", "http://127.0.0.1:9", "--at", "1e30"], "after the year 2100"),
        (["replay", "--prometheus", "http://127.0.0.1:9", "--from", "1796000000", "--to", "1795000000"], "--from must come before --to"),
        (["trace", "x.json", "--slices", "1000000"], "between 1 and 1000 slices"),
        (["replay"], "needs a capture file or --prometheus"),
    ],
)
def test_history_from_prometheus_names_what_is_wrong(argv, said, capsys):
    try:
        status = main(argv)
    except SystemExit as exited:  # argparse's own refusal of a flag's value
        status = exited.code
    assert status == 2
    err = capsys.readouterr().err
    assert said in err and "secret" not in err, err


def test_fleet_names_replicas_out_of_balance():
    from vllm_triage.history.fleet import Server, imbalances
    from vllm_triage.model import Snapshot
    from vllm_triage.scope import AGGREGATE_SCOPE

    def server(pod: str, model: str, waiting: float) -> Server:
        snapshot = Snapshot(
            timestamp=0.0, signals={AGGREGATE_SCOPE: {"requests_waiting_mean": waiting}}, verdicts=(), sources=(), evaluations=1, window_seconds=60
        )
        return Server("llm", pod, "", model, snapshot)

    found = imbalances([server("a-0", "a", 12.0), server("a-1", "a", 0.0), server("b-0", "b", 9.0), server("b-1", "b", 8.0)])
    assert found == ["llm/a: llm/a-0 has 12.0 requests waiting on average while llm/a-1 has 0.0: requests are routed unevenly (adding replicas will not help)"]


@pytest.mark.parametrize("log_format", ["json", "logfmt"])
def test_log_format_writes_one_parseable_record_per_line(log_format):
    """For a log pipeline (Loki, Fluent Bit): every log line parses, as JSON or as logfmt's key=value pairs, with its
    time, level, logger and message."""
    process = subprocess.Popen(
        [str(BIN / "vllm-triage"), "serve", "--demo", "--log-format", log_format, "--listen", f"127.0.0.1:{free_port()}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    read: list[str] = []
    reader = threading.Thread(target=lambda: read.extend(process.stderr or ()), daemon=True)
    reader.start()
    deadline = time.monotonic() + 60  # until the demo says it replays (seconds on a machine other lanes keep busy)
    while time.monotonic() < deadline and not any("demo: replaying" in line for line in read):
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)
    reader.join(timeout=10)
    err = "".join(read)
    lines = [line for line in err.splitlines() if line.strip()]
    if log_format == "json":
        entries = [json.loads(line) for line in lines]
    else:  # key=value, a value quoted (JSON string rules) where it holds a space, a quote or =
        pairs = r'(\w+)=("(?:[^"\\]|\\.)*"|[^ ]+)'
        entries = []
        for line in lines:
            assert re.fullmatch(rf"{pairs}( {pairs})*", line), line
            entries.append({key: json.loads(value) if value.startswith('"') else value for key, value in re.findall(pairs, line)})
    assert any(e["msg"].startswith("demo: replaying") and e["level"] == "info" for e in entries), err
    assert all({"time", "level", "logger", "msg"} <= set(e) for e in entries)


def test_a_wrong_flag_is_named_with_its_commands_usage_and_help_lists_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--bogus"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "vllm-triage serve: error: unrecognized arguments: --bogus" in err and "usage: vllm-triage serve" in err
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "exit codes:" in out and re.search(r"^  2 +a wrong flag", out, re.M) and re.search(r"^  130 +interrupted", out, re.M)
