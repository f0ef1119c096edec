"""Bad input and hostile conditions at the edges, each answered clearly while the daemon serves on: non-finite
values on vLLM's page, a failing tick, the listener under slow and malformed clients, a backward clock,
credentials in the URL, corrupt captures, bad config and CLI values, an unreachable vLLM in a one-shot
diagnosis, churning label sets."""

from __future__ import annotations

import dataclasses
import gzip
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from vllm_triage import daemon as daemon_module
from vllm_triage.cli import main
from vllm_triage.config_loader import load
from vllm_triage.history.capture import CaptureError, read_readings
from vllm_triage.model import Reading
from vllm_triage.options import ConfigError, redact_url
from vllm_triage.server import PROBE_LANE_SECONDS

from harness.components import get, start_sidecar

from .pages import Counters, page, reading
from .test_outlets import families, saturated_daemon, serve_and_get
from .test_vllm_source import free_port

DATA = Path(__file__).resolve().parents[1] / "data"


def strict_json(body: bytes) -> dict:
    """JSON as JavaScript's JSON.parse reads it: NaN and Infinity are errors."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(body, parse_constant=refuse)


@pytest.fixture
def fake_vllm(tmp_path):
    """A real HTTP server (python -m http.server) serving whatever page the test writes to `metrics`."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)], stderr=subprocess.DEVNULL)
    yield tmp_path / "metrics", port
    server.kill()
    server.wait()


def test_infinite_values_never_freeze_evaluation_and_credentials_never_show(tmp_path, fake_vllm):
    metrics, port = fake_vllm
    text = page(3, 2, 0.5, Counters(preemptions=4))
    metrics.write_text(text.replace('vllm:num_requests_running{engine="0",model_name="m"} 3', 'vllm:num_requests_running{engine="0",model_name="m"} +Inf'))
    sidecar = start_sidecar(tmp_path, f"http://scraper:s3cret-pw@127.0.0.1:{port}", "sources: [vllm]\nscrape_interval_seconds: 0.5\ntick_seconds: 0.5\n")
    try:

        def evaluations() -> float:
            return sidecar.metrics()["vllm_triage_evaluations"][0].value

        def refused() -> float:
            return sum(s.value for s in sidecar.metrics().get("vllm_triage_source_errors", []) if s.labels["reason"] == "non_finite_values")

        sidecar.wait_for(lambda: refused() >= 2, 30, "pages with +Inf refused and counted")
        first = evaluations()
        sidecar.wait_for(lambda: evaluations() >= first + 3, 30, "evaluations going on")
        status, body = get(sidecar.url + "/diagnosis")
        diagnosis = strict_json(body)
        assert status == 200 and get(sidecar.url + "/readyz")[0] == 200
        assert diagnosis["sources"]["vllm"]["up"] is True
        assert "infinite or out-of-range" in diagnosis["sources"]["vllm"]["last_error"]
        assert next(c for c in diagnosis["conditions"] if c["condition"] == "queue_backlog")["state"] != "unknown"
        # the user:password of --vllm-url appears nowhere a person or a scraper reads
        for path in ("/diagnosis", "/report", "/metrics", "/"):
            assert b"s3cret-pw" not in get(sidecar.url + path)[1], path
        metrics.unlink()  # a 404: the error message names the URL
        sidecar.wait_for(lambda: "HTTP 404" in str(sidecar.diagnosis()["sources"]["vllm"]["last_error"]), 30, "the 404")
        assert "***@127.0.0.1" in sidecar.diagnosis()["sources"]["vllm"]["last_error"]
        assert b"s3cret-pw" not in get(sidecar.url + "/diagnosis")[1]
    finally:
        sidecar.process.kill()
        sidecar.process.wait()
    assert b"s3cret-pw" not in sidecar.log_path.read_bytes()


def test_redact_url_hides_userinfo_and_query_values():
    assert redact_url("http://u:p@vllm:8000/metrics?token=abc&x=1") == "http://***@vllm:8000/metrics?token=***&x=***"
    assert redact_url("http://[::1]:8000/") == "http://[::1]:8000/"
    assert redact_url("http://vllm:8000") == "http://vllm:8000"


def test_a_failing_tick_shows_in_readyz_and_a_counter_and_keeps_the_last_snapshot(monkeypatch):
    daemon = saturated_daemon()
    served = daemon.exposition.render(openmetrics=False)
    monkeypatch.setattr(daemon.pipeline, "evaluate", lambda *inputs: 1 / 0)
    daemon._tick_if_fed()
    (ready, metrics) = serve_and_get(daemon, [("/readyz", {}), ("/metrics", {})])
    assert ready[0] == 503 and b"evaluation failing: ZeroDivisionError" in ready[2]
    assert families(metrics[2].decode())["vllm_triage_evaluation_failures"].samples[0].value == 1
    assert b"vllm_triage_condition_active" in metrics[2] and served
    last_good = daemon.snapshot
    daemon._tick_if_fed()  # failing again: counted, the same error not logged twice
    assert daemon.snapshot is not None and last_good is not None and daemon.snapshot.verdicts == last_good.verdicts
    ((_, _, body),) = serve_and_get(daemon, [("/diagnosis", {})])
    assert json.loads(body)["sidecar"] == {
        "evaluation_failures": 2,
        "evaluation_error": "ZeroDivisionError: division by zero",
        "config_reload_successful": True,
    }
    monkeypatch.undo()
    daemon._tick_if_fed()
    (ready, diagnosis) = serve_and_get(daemon, [("/readyz", {}), ("/diagnosis", {})])
    assert ready[0] == 200
    assert json.loads(diagnosis[2])["sidecar"] == {"evaluation_failures": 2, "evaluation_error": None, "config_reload_successful": True}


def sidecar_fds(pid: int) -> int:
    return psutil.Process(pid).num_fds()


def test_probes_are_answered_while_idle_half_requests_hold_every_slot(tmp_path):
    """The review's attack: more half-requests than the cap, renewed as they time out. A kubelet restarts vLLM after 3
    failed liveness probes; none may fail, while /metrics over the cap still gets 503."""
    sidecar = start_sidecar(tmp_path, "http://127.0.0.1:9", "sources: [vllm]\nmax_connections: 16\nengine_liveness_endpoint: true\n")
    port = int(sidecar.url.rsplit(":", 1)[1])
    clients: list[socket.socket] = []
    try:
        for _ in range(40):
            client = socket.create_connection(("127.0.0.1", port))
            client.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # headers never finished
            clients.append(client)
        time.sleep(0.3)
        probes = [get(sidecar.url + path, timeout=5)[0] for _ in range(5) for path in ("/engine-liveness", "/healthz")]
        assert probes == [200] * 10
        assert get(sidecar.url + "/metrics", timeout=5)[0] == 503
        # a probe that sends its request line slowly, in pieces, within the lane's deadline, is answered too
        with socket.create_connection(("127.0.0.1", port)) as slow:
            for piece in (b"GET /engine-", b"liveness HTTP/1.1\r\n", b"Host: x\r\n\r\n"):
                slow.sendall(piece)
                time.sleep(0.2)
            slow.settimeout(5)
            assert slow.recv(1024).startswith(b"HTTP/1.1 200 OK")
    finally:
        for client in clients:
            client.close()
        sidecar.process.terminate()
        sidecar.process.wait(timeout=15)
    assert b"Traceback" not in sidecar.log_path.read_bytes()


def test_half_open_clients_are_capped_and_timed_out_and_metrics_keeps_answering(tmp_path):
    sidecar = start_sidecar(tmp_path, "http://127.0.0.1:9", "sources: [vllm]\nmax_connections: 20\nhttp_header_timeout_seconds: 1\n")
    port = int(sidecar.url.rsplit(":", 1)[1])
    clients = []
    baseline = sidecar_fds(sidecar.process.pid)
    try:
        for _ in range(200):  # half a request line each, never finished
            client = socket.create_connection(("127.0.0.1", port))
            client.sendall(b"GET /metr")
            clients.append(client)
        time.sleep(PROBE_LANE_SECONDS + 0.5)
        assert sidecar_fds(sidecar.process.pid) <= baseline + 20 + 5, "connections over the cap are closed once the probe lane's deadline passes"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and get(sidecar.url + "/metrics", timeout=5)[0] != 200:
            time.sleep(0.2)
        assert get(sidecar.url + "/metrics", timeout=5)[0] == 200, "the header timeout frees the slots"
        closed = 0
        for client in clients:
            client.settimeout(3)
            try:
                data = client.recv(1024)
                closed += data == b"" or b"503" in data
            except ConnectionResetError:
                closed += 1
        assert closed == len(clients), "every half-open connection was closed by the sidecar (503 over the cap, else the timeout)"
        # a malformed request is one debug line, not a traceback per request
        with socket.create_connection(("127.0.0.1", port)) as bad:
            bad.sendall(b"\x16\x03\x01 not http at all\r\n\r\n")
            bad.settimeout(3)
            assert b"400" in bad.recv(1024)
    finally:
        for client in clients:
            client.close()
        sidecar.process.terminate()
        sidecar.process.wait(timeout=15)
    assert b"Traceback" not in sidecar.log_path.read_bytes()


def test_a_backward_wall_clock_step_neither_reorders_readings_nor_blinds_the_windows():
    wall = {"t": 1_700_000_000.0}
    monotonic = {"t": 100.0}
    clock = daemon_module.steady_wall_clock(lambda: wall["t"], lambda: monotonic["t"])
    first = clock()
    wall["t"] -= 3600  # NTP steps the clock back an hour
    monotonic["t"] += 2
    assert clock() == first + 2
    # the daemon and the one-shot commands use it by default
    assert daemon_module.Daemon(load(env={})).clock is not time.time


def write_capture(path, lines: list[str], header: str = '{"format":"vllm-triage-capture","version":1}') -> None:
    with gzip.open(path, "wt") as handle:
        handle.write(header + "\n")
        for line in lines:
            handle.write(line + "\n")


GOOD = '{"source":"vllm","t":1000.0,"ok":true,"samples":[["vllm:num_requests_running",{"engine":"0","model_name":"m"},1]]}'


@pytest.mark.parametrize(
    ("lines", "header", "says"),
    [
        ([GOOD, GOOD.replace("1000.0", "692200.0")], None, "a reading has a wrong timestamp"),  # 8 days after the first
        ([GOOD, GOOD.replace("1000.0", "-1e12")], None, "is not a time"),
        ([GOOD, GOOD.replace("1000.0", "NaN")], None, "is not a time"),
        ([GOOD, GOOD.replace("1000.0", "Infinity")], None, "is not a time"),
        ([GOOD.replace("1000.0", "1e17")], None, "is not a time"),  # adding a tick no longer moves such a clock
        ([GOOD.replace("1000.0", "1e15")], None, "is not a time"),  # past the calendar: once a `year out of range`
        ([GOOD, '{"source":"vllm","t":1001.0,"ok":true,"error":"' + "x" * (33 * 2**20) + '"}'], None, "decompressed"),  # 33 MiB in 33 kB
        # past the live path's limits: a page the vLLM source would have refused (a 5,000-engine capture took 588 MB)
        (
            [
                GOOD.replace(
                    '{"engine":"0","model_name":"m"},1]',
                    ",".join(f'{{"engine":"{i}","model_name":"m"}},1],["vllm:num_requests_running"' for i in range(40)) + ',{"engine":"x","model_name":"m"},1]',
                )
            ],
            None,
            "over max_engines 32",
        ),
        (
            [GOOD.replace('["vllm:num_requests_running",{"engine":"0","model_name":"m"},1]', ",".join(f'["s{i}",{{}},1]' for i in range(15_001)))],
            None,
            "over max_series 15000",
        ),
        ([GOOD, "[1, 2, 3]"], None, "expected a JSON object"),
        ([GOOD, GOOD.replace('{"engine":"0","model_name":"m"}', '["engine","0"]')], None, "a sample must be"),
        ([GOOD], '{"format":"vllm-triage-capture","version":"1"}', "version '1'"),
    ],
)
def test_a_corrupt_capture_is_one_clear_error(tmp_path, capsys, lines, header, says):
    capture = tmp_path / "bad.jsonl.gz"
    write_capture(capture, lines, *([header] if header else []))
    with pytest.raises(CaptureError, match=says):
        list(read_readings(capture))
    for command in (["replay", str(capture)], ["diagnose", "--capture", str(capture)], ["serve", "--demo", "--demo-capture", str(capture)]):
        assert main(command) == 2, command
        assert says.split()[0] in capsys.readouterr().err


def test_readings_days_apart_replay_in_the_ticks_of_their_windows_not_of_the_gap():
    """A capture whose two readings are 6.9 days apart (a 2 kB file) once replayed tick by tick for 6 minutes: the ticks
    where every window is past the last reading change nothing and are skipped; each reading is still judged."""
    from vllm_triage.pipeline import replay

    first = Reading.from_json(json.loads(GOOD))
    later = dataclasses.replace(first, timestamp=first.timestamp + 6.9 * 86_400)
    ticks: list[float] = []
    last = replay([first, later], load(env={}), lambda snapshot: ticks.append(snapshot.timestamp))
    assert last is not None and last.timestamp >= later.timestamp
    assert len(ticks) < 500 and ticks == sorted(ticks) and ticks[0] == first.timestamp


def test_corrupt_deflate_data_is_one_clear_error(tmp_path, capsys):
    capture = tmp_path / "bad.jsonl.gz"
    write_capture(capture, [GOOD.replace("1000.0", str(1000.0 + i)).replace(",1]]", f",{i * 7919 % 1000}]]") for i in range(2000)])
    data = bytearray(capture.read_bytes())
    assert len(data) > 2000
    data[-1000:-900] = b"\xff" * 100  # damage past the first readings
    capture.write_bytes(bytes(data))
    assert main(["replay", str(capture)]) in (0, 2)  # the readings before the damage, or a one-line error
    data[20:120] = b"\xff" * 100  # damage before the first reading: nothing to replay
    capture.write_bytes(bytes(data))
    assert main(["replay", str(capture)]) == 2
    assert "while decompressing" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("yaml_text", "key"),
    [
        ("max_series: .inf\n", "max_series"),
        ("window_seconds: .inf\n", "window_seconds"),
        ("window_seconds: .nan\n", "window_seconds"),
        ("gpus: {a: 1}\n", "gpus"),
        ("gpus: [0, 'GPU-$(rm -rf /)']\n", "gpus"),
        ("gpus: [" + ", ".join(str(i % 8) for i in range(1000)) + "]\n", "gpus"),  # no node holds a thousand GPUs
        ("sources: [[vllm]]\n", "sources"),
    ],
)
def test_bad_config_values_are_named_not_tracebacks(tmp_path, yaml_text, key):
    config = tmp_path / "c.yaml"
    config.write_text(yaml_text)
    with pytest.raises(ConfigError, match=f"'{key}'"):
        load(str(config), env={})


def test_a_config_file_that_is_not_utf8_is_named(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_bytes(b"window_seconds: 30\n# \xff\xfe\n")
    assert main(["serve", "--config", str(config)]) == 2
    assert "not UTF-8" in capsys.readouterr().err


@pytest.mark.parametrize("url", ["http://[::1", "http://127.0.0.1:99999"])
def test_bad_urls_are_named(capsys, url):
    assert main(["serve", "--vllm-url", url]) == 2
    assert "vllm_url" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value"), [("--seconds", "0"), ("--seconds", "-5"), ("--seconds", "nan"), ("--seconds", "inf"), ("--at", "nan"), ("--at", "inf"), ("--at", "-1")]
)
def test_bad_durations_are_refused(capsys, flag, value):
    with pytest.raises(SystemExit) as exited:
        main(["diagnose", "--capture", "demo", flag, value])
    assert exited.value.code == 2
    assert flag in capsys.readouterr().err


def test_diagnose_past_the_capture_end_says_so(capsys):
    assert main(["diagnose", "--capture", "demo", "--at", "1e12"]) == 2
    assert "past the capture's end" in capsys.readouterr().err


def test_diagnose_of_an_unreachable_vllm_reports_the_outage_and_fails(capsys):
    assert main(["diagnose", "--vllm-url", f"http://127.0.0.1:{free_port()}", "--seconds", "2", "--sources", "vllm"]) == 1
    out = capsys.readouterr().out
    assert "NOTHING WRONG FOUND" not in out
    assert "vllm_unreachable" in out.split("WHAT IS WRONG")[1].split("\n")[1]


def test_sighup_with_a_broken_config_keeps_serving_and_sigterm_still_exits_cleanly(tmp_path):
    """kubectl's and systemd's reload is SIGHUP: an edit that broke the file is named, the running configuration
    serves on, and the usual stop still exits 0."""
    sidecar = start_sidecar(tmp_path, "http://127.0.0.1:9", "sources: [vllm]\n")
    (tmp_path / "sidecar.yaml").write_text("sources: [vllm]\nwindow_seconds: -3\n")
    sidecar.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while "changed but is invalid" not in sidecar.log_path.read_text():
        assert sidecar.process.poll() is None and time.monotonic() < deadline, sidecar.log_path.read_text()
        time.sleep(0.2)
    assert "'window_seconds'" in sidecar.log_path.read_text()
    assert get(sidecar.url + "/metrics", timeout=10)[0] == 200
    sidecar.process.terminate()
    assert sidecar.process.wait(timeout=60) == 0  # exit code 0 is the behaviour; the wait is for a busy machine


def test_churning_label_sets_are_bounded_by_bytes_not_entries():
    """A model_name that changes every scrape (4 KB names): the shared label table stays under its byte
    bound instead of growing by ~1 GB per 200,000 entries."""
    from vllm_triage import model

    for i in range(20_000):  # 80 MB of label text in total
        model.make_labels({"engine": "0", "model_name": f"{i:04096d}"})
    assert model._current_bytes + model._before_bytes <= model.MAX_INTERNED_LABEL_BYTES
    held = (*model._INTERNED_LABELS, *model._INTERNED_LABELS_BEFORE)
    assert sum(len(v) for labels in held for _, v in labels) <= model.MAX_INTERNED_LABEL_BYTES


def test_label_sets_no_page_uses_any_more_are_let_go_while_those_in_use_stay_shared(monkeypatch):
    """A model name new at every scrape: the label sets of the names gone are let go within two generations of the
    table, not kept up to its byte bound (+30 MB of RSS over an hour of one engine's churn); a label set every page
    uses keeps its one shared tuple throughout."""
    from vllm_triage import model

    monkeypatch.setattr(model, "LABEL_GENERATION_SECONDS", 0.0)  # a new generation at every new label set
    stable = {"engine": "0", "model_name": "stable"}
    kept = model.make_labels(stable)
    for i in range(1000):
        assert model.make_labels({"engine": "0", "model_name": f"churned-{i}"}) == (("engine", "0"), ("model_name", f"churned-{i}"))
        assert model.make_labels(stable) is kept
    held = {labels[1][1] for labels in (*model._INTERNED_LABELS, *model._INTERNED_LABELS_BEFORE)}
    assert held == {"stable", "churned-998", "churned-999"}


def test_model_names_that_change_every_scrape_cost_about_what_stable_names_cost():
    """31 engines with 600-character model names, new at every scrape, took the sidecar to 766 MB: each frame of the
    window remembered window maths for every engine scope seen after it, and each series kept its own copy of the name.
    The same pages are judged twice, once with a stable name and once with a new name at every scrape: the churning
    run holds at most twice the memory (8x before)."""
    import tracemalloc

    from vllm_triage.pipeline import Pipeline
    from vllm_triage.signals.vllm import VLLM_SAMPLES_READ
    from vllm_triage.sources.vllm import parse_page

    one_engine = (DATA / "vllm-0.32.0-cpu-kv-saturated.metrics.txt").read_text().splitlines()
    lines = [line.replace('engine="0"', f'engine="{e}"') for line in one_engine if line.startswith("vllm:") for e in range(4)]
    text = "\n".join(lines) + "\n"

    def held_bytes(churn: bool) -> int:
        pipeline, memo = Pipeline(load(env={})), {}
        tracemalloc.start()
        try:
            for tick in range(40):  # past the store's 68 s horizon at the default 2 s cadence
                name = f"{tick if churn else 0:04d}" + "x" * 596
                samples, meta = parse_page(text.replace('model_name="', f'model_name="{name}'), keep=VLLM_SAMPLES_READ, memo=memo)
                pipeline.feed(Reading("vllm", 2.0 * tick, True, samples, meta=meta))
                snapshot = pipeline.evaluate(2.0 * tick)
            assert sum(1 for scope in snapshot.signals if scope.model.startswith(name)) == 4  # today's engines are judged
            return tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()

    assert held_bytes(churn=True) <= 2 * held_bytes(churn=False)


def test_history_is_kept_per_source_only_as_long_as_its_windows_need():
    """vLLM pages for the longest window (60 s + a few scrapes), py-spy windows for their lookback (minutes):
    keeping every page as long as the py-spy lookback tripled the memory under label churn."""
    from vllm_triage.model import GIL_SOURCE
    from vllm_triage.pipeline import Pipeline

    config = load(env={})
    pipeline = Pipeline(config)
    step = int(config.scrape_interval_seconds)
    for t in range(0, 600, step):
        pipeline.feed(reading(float(t), page(1, 0, 0.1, Counters())))
        if t % 60 == 0:
            pipeline.feed(Reading(GIL_SOURCE, float(t), True, {}))
    kept = {source: len(pipeline.store.window(source, 0, 600)) for source in ("vllm", GIL_SOURCE)}
    assert kept["vllm"] <= (60 + 4 * step) // step + 1
    assert kept[GIL_SOURCE] >= 3


def test_a_reload_that_moves_the_listener_keeps_the_probes_answering_under_load(tmp_path):
    """A reload that changes the listener's own settings once waited for its slow connections to drain before the new
    listener started: 5 s without /engine-liveness under page load (a kubelet fails vLLM's probe on 1 s timeouts), and
    no readings meanwhile. The old socket now stops listening at once, the new one starts, and the old connections
    drain behind it."""
    import threading

    config = "engine_liveness_endpoint: true\nhttp_header_timeout_seconds: 5\nmax_connections: 64\n"
    sidecar = start_sidecar(tmp_path, "http://127.0.0.1:9", config, "--demo")
    port = int(sidecar.url.rsplit(":", 1)[1])
    slow = []
    for n in range(40):  # clients midway through their headers, and clients that ask for a page and do not read it
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", port))
        client.sendall(b"GET /report.html HTTP/1.1\r\nHost: x\r\n" + (b"\r\n" if n % 2 else b""))
        slow.append(client)
    stop = threading.Event()

    def page_load() -> None:
        while not stop.is_set():
            try:
                get(sidecar.url + "/report.html", timeout=5)
            except OSError:
                time.sleep(0.05)

    loaders = [threading.Thread(target=page_load, daemon=True) for _ in range(4)]
    try:
        for thread in loaders:
            thread.start()
        (tmp_path / "sidecar.yaml").write_text(config.replace("max_connections: 64", "max_connections: 65"))
        sidecar.process.send_signal(signal.SIGHUP)
        answered, failures, longest, last_ok = [], [], 0.0, time.monotonic()
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            try:
                status = get(sidecar.url + "/engine-liveness", timeout=1)[0]
            except OSError as error:
                status = type(error).__name__
            ok = status == 200
            if not ok:
                failures.append(status)
            now = time.monotonic()
            if ok:
                longest, last_ok = max(longest, now - last_ok), now
            answered.append(ok)
            time.sleep(0.05)
        log = sidecar.log_path.read_text()
        assert "continuing with it" in log, log
        assert not failures, (failures, longest, log[-2000:])
    finally:
        stop.set()
        for client in slow:
            client.close()
        sidecar.process.terminate()
        assert sidecar.process.wait(timeout=60) == 0
