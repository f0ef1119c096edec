"""Configuration: precedence, per-condition overrides, and messages that name the wrong key."""

from __future__ import annotations

import os

import jsonschema
import pytest
import yaml
from vllm_triage.catalog import GpuOptions
from vllm_triage.config import OPTIONS
from vllm_triage.config_loader import config_schema, load
from vllm_triage.options import ConfigError

from harness.components import start_sidecar


def write(tmp_path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


def test_defaults():
    config = load(env={})
    assert config.vllm_url == "http://127.0.0.1:8000"
    assert config.listen == "0.0.0.0:10290"
    assert config.conditions["kv_cache_saturated"].thresholds["usage_min"] == 0.8
    assert config.conditions["prefix_cache_ineffective"].for_seconds == 300


def test_file_then_env_then_flags(tmp_path):
    path = write(tmp_path, "vllm_url: http://file:8000\nwindow_seconds: 30\nscrape_interval_seconds: 3\n")
    env = {"VLLM_TRIAGE_WINDOW_SECONDS": "45", "VLLM_TRIAGE_SCRAPE_INTERVAL_SECONDS": "4"}
    config = load(path, env=env, flags={"scrape_interval_seconds": "5"})
    assert config.vllm_url == "http://file:8000"  # file only
    assert config.window_seconds == 45  # env beats file
    assert config.scrape_interval_seconds == 5  # flag beats env
    assert config.conditions["ttft_high"].window_seconds == 45  # conditions inherit W


def test_condition_overrides(tmp_path):
    path = write(
        tmp_path,
        "conditions:\n  kv_cache_saturated:\n    usage_min: 0.9\n    for_seconds: 10\n    clear_for_seconds: 15\n"
        "    window_seconds: 30\n  itl_high:\n    enabled: false\n",
    )
    config = load(path, env={})
    kv = config.conditions["kv_cache_saturated"]
    assert (kv.thresholds["usage_min"], kv.for_seconds, kv.clear_seconds, kv.window_seconds) == (0.9, 10, 15, 30)
    assert config.conditions["itl_high"].enabled is False


def test_the_start_up_budget_is_one_setting_that_both_start_up_waits_follow(tmp_path):
    """vllm_startup_seconds (the chart's vllm.startupSeconds) sets how long a loading vLLM counts as starting, with or
    without the process view; a condition's own value still wins, and the wait for a vLLM process that never came stays."""
    default = load(env={}).conditions["vllm_unreachable"].thresholds
    assert (default["startup_grace_seconds"], default["startup_grace_no_process_seconds"], default["not_started_seconds"]) == (1800, 600, 150)
    budget = load(env={"VLLM_TRIAGE_VLLM_STARTUP_SECONDS": "3600"}).conditions["vllm_unreachable"].thresholds
    assert (budget["startup_grace_seconds"], budget["startup_grace_no_process_seconds"], budget["not_started_seconds"]) == (3600, 3600, 150)
    path = write(tmp_path, "vllm_startup_seconds: 900\nconditions:\n  vllm_unreachable: {startup_grace_seconds: 1200}\n")
    tuned = load(path, env={}).conditions["vllm_unreachable"].thresholds
    assert (tuned["startup_grace_seconds"], tuned["startup_grace_no_process_seconds"]) == (1200, 900)


BAD_FILES = [
    ("vllm_startup_seconds: 0\n", ["vllm_startup_seconds", ">= 1.0"]),
    ("conditions:\n  kv_cache_saturated:\n    usage_min: 1.7\n", ["conditions.kv_cache_saturated.usage_min", "1.7", "<= 1.0"]),
    ("conditions:\n  kv_cache_saturated:\n    usage_mni: 0.9\n", ["conditions.kv_cache_saturated.usage_mni", "usage_min"]),
    ("conditions:\n  kv_cache_saturatd: {}\n", ["conditions.kv_cache_saturatd", "kv_cache_saturated"]),
    ("scrape_interval_seconds: fast\n", ["scrape_interval_seconds", "'fast'", "a number"]),
    ("scrape_interval_seconds: 0\n", ["scrape_interval_seconds", ">= 0.1"]),
    ("vllm_url: localhost:8000\n", ["vllm_url", "http://"]),
    ("listen: 10290\n", ["listen", "HOST:PORT"]),
    ("max_num_seqs: 2.5\n", ["max_num_seqs", "an integer"]),
    ("log_level: loud\n", ["log_level", "debug, info"]),
    ("scrap_interval: 2\n", ["scrap_interval", "unknown key"]),
    ("- just\n- a list\n", ["expected a mapping"]),
    ("key: [unclosed\n", ["not valid YAML"]),
]


@pytest.mark.parametrize(("text", "names"), BAD_FILES)
def test_a_wrong_value_names_the_key_the_value_and_what_is_allowed(tmp_path, text, names):
    with pytest.raises(ConfigError) as info:
        load(write(tmp_path, text), env={})
    for name in names:
        assert name in str(info.value)


@pytest.mark.parametrize("text", [text for text, _ in BAD_FILES[:-2]])
def test_the_charts_schema_refuses_what_the_sidecar_refuses(text):
    """values.schema.json embeds config_schema(): `helm install` stops a config the sidecar would refuse."""
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(yaml.safe_load(text), config_schema())


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.key)
def test_the_charts_schema_accepts_every_default_the_sidecar_accepts(tmp_path, option):
    default = list(option.default) if isinstance(option.default, tuple) else option.default
    path = write(tmp_path, yaml.safe_dump({option.key: default}))
    try:
        load(path, env={})
    except ConfigError:
        return  # not a value a file can hold (an empty list): the schema may refuse it too
    jsonschema.validate({option.key: default}, config_schema())


def test_wrong_env_value_is_named():
    with pytest.raises(ConfigError) as info:
        load(env={"VLLM_TRIAGE_GPM": "maybe"})
    assert "gpm" in str(info.value) and "true or false" in str(info.value)


def test_sources_and_gpus_lists():
    config = load(env={"VLLM_TRIAGE_SOURCES": "gpu, vllm", "VLLM_TRIAGE_GPUS": "0,GPU-abc"})
    assert config.sources == ("gpu", "vllm") and config.options(GpuOptions).gpus == ("0", "GPU-abc")
    with pytest.raises(ConfigError) as info:
        load(env={"VLLM_TRIAGE_SOURCES": "vllm,nvml"})
    assert "sources" in str(info.value) and "vllm, process, gpu" in str(info.value)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError) as info:
        load(str(tmp_path / "nope.yaml"), env={})
    assert "nope.yaml" in str(info.value)


def test_listen_without_host_means_every_interface():
    assert load(env={}, flags={"listen": ":9999"}).listen == "0.0.0.0:9999"
    assert load(env={}, flags={"max_num_seqs": "auto"}).max_num_seqs is None


def test_a_changed_config_file_is_picked_up_without_a_restart_and_an_invalid_one_is_refused(tmp_path):
    """As a mounted ConfigMap changes (kubelet swaps the file in): a valid new config takes effect in the
    same process; an invalid one is refused with the key named, and the running configuration stays."""
    sidecar = start_sidecar(tmp_path, "http://127.0.0.1:9", "conditions:\n  kv_cache_saturated: {usage_min: 0.8}\n", "--demo")
    config = tmp_path / "sidecar.yaml"

    def swap(text: str) -> None:
        staged = tmp_path / "staged.yaml"
        staged.write_text(text)
        os.replace(staged, config)

    def usage_min() -> float:
        samples = sidecar.metrics()["vllm_triage_condition_threshold"]
        return next(s.value for s in samples if s.labels == {"condition": "kv_cache_saturated", "threshold": "usage_min"})

    def reload_ok() -> float:
        return sidecar.metrics()["vllm_triage_config_last_reload_successful"][0].value

    try:
        assert usage_min() == 0.8 and reload_ok() == 1
        swap("conditions:\n  kv_cache_saturated: {usage_min: 0.7}\n")
        sidecar.wait_for(lambda: usage_min() == 0.7, 30, "the new threshold in force")
        swap("conditions:\n  kv_cache_saturated: {usage_min: lots}\n")
        sidecar.wait_for(lambda: reload_ok() == 0, 30, "the invalid file refused")
        assert usage_min() == 0.7 and sidecar.process.poll() is None
        assert sidecar.diagnosis()["sidecar"]["config_reload_successful"] is False  # /diagnosis says so too
        assert "conditions.kv_cache_saturated.usage_min" in sidecar.log_path.read_text()
        swap("conditions:\n  kv_cache_saturated: {usage_min: 0.75}\n")
        sidecar.wait_for(lambda: usage_min() == 0.75 and reload_ok() == 1, 30, "the fixed file in force")
        # a web config named by a reload cannot change the running listener: refused, saying so, not a silent success
        (tmp_path / "web.yml").write_text("basic_auth_users:\n  prometheus: '$2b$04$abcdefghijklmnopqrstuuWdG4lJ3H9XhCTQZyL1rXQ5mHf4M7Y1K'\n")
        swap(f"web_config_file: {tmp_path / 'web.yml'}\nconditions:\n  kv_cache_saturated: {{usage_min: 0.75}}\n")
        sidecar.wait_for(lambda: reload_ok() == 0, 30, "the web_config_file change refused")
        assert "changed web_config_file: that needs a restart" in sidecar.log_path.read_text()
        assert usage_min() == 0.75  # /metrics still answers without credentials: the listener is as it was
        assert sidecar.process.poll() is None  # one process throughout: the pod's containers are untouched
    finally:
        sidecar.process.terminate()
        assert sidecar.process.wait(timeout=30) == 0


def test_a_condition_with_its_own_window_keeps_it_under_a_short_global_window(tmp_path):
    # engine_wedged measures a 20 s stall inside its window: a 10 s window_seconds must not blind it
    config = load(env={}, flags={"window_seconds": "10"})
    assert config.conditions["engine_wedged"].window_seconds == 60
    assert config.conditions["kv_cache_saturated"].window_seconds == 10
    overridden = load(write(tmp_path, "conditions:\n  engine_wedged: {window_seconds: 30}\n"), env={}, flags={"window_seconds": "10"})
    assert overridden.conditions["engine_wedged"].window_seconds == 30


def test_a_huge_or_deeply_nested_config_is_refused_in_one_line(tmp_path):
    huge = tmp_path / "huge.yaml"
    huge.write_text("gpus:\n" + "".join(f"  - '{i}'\n" for i in range(300_000)))  # ~3 MB
    with pytest.raises(ConfigError, match="is over 1024 KiB"):
        load(str(huge), env={})
    deep = tmp_path / "deep.yaml"
    deep.write_text("conditions: " + "[" * 20_000 + "]" * 20_000 + "\n")
    with pytest.raises(ConfigError, match="nests too deeply"):
        load(str(deep), env={})


def test_settings_are_a_leaf_the_sources_and_the_engine_build_on():
    """Loading the config reads the condition table, the sources' catalog (with their signal tables and options), the
    options' parsers and the model, nothing that runs: no source, registry or engine (they import the config, never the other way round)."""
    import subprocess
    import sys

    code = "import sys, vllm_triage.config_loader; print(' '.join(sorted(m for m in sys.modules if m.startswith('vllm_triage'))))"
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())
    assert loaded == {
        "vllm_triage",
        "vllm_triage.catalog",
        "vllm_triage.config",
        "vllm_triage.config_loader",
        "vllm_triage.options",
        "vllm_triage.diagnosis",
        "vllm_triage.diagnosis.condition",
        "vllm_triage.diagnosis.conditions",
        "vllm_triage.diagnosis.conditions.capacity",
        "vllm_triage.diagnosis.conditions.changes",
        "vllm_triage.diagnosis.conditions.features",
        "vllm_triage.diagnosis.conditions.gpu",
        "vllm_triage.diagnosis.conditions.host",
        "vllm_triage.diagnosis.conditions.latency",
        "vllm_triage.diagnosis.conditions.liveness",
        "vllm_triage.diagnosis.conditions.queueing",
        "vllm_triage.diagnosis.judge",
        "vllm_triage.model",
        "vllm_triage.scope",
        "vllm_triage.signals",
        "vllm_triage.signals.gpu",
        "vllm_triage.signals.host",
        "vllm_triage.signals.vllm",
        "vllm_triage.signals.window",
        "vllm_triage.store",
    }


def test_a_vllm_url_given_with_its_metrics_path_is_taken_without_it():
    """`--vllm-url http://vllm:8000/metrics`, as Prometheus' targets are written, once fetched /metrics/metrics."""
    assert load(env={}, flags={"vllm_url": "http://vllm:8000/metrics"}).vllm_url == "http://vllm:8000"
    assert load(env={}, flags={"vllm_url": "http://vllm:8000/v1/metrics/"}).vllm_url == "http://vllm:8000/v1"
    assert load(env={}, flags={"vllm_url": "http://vllm:8000/prefix"}).vllm_url == "http://vllm:8000/prefix"
