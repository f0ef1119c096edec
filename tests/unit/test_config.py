"""Configuration: precedence, per-condition overrides, and messages that name the wrong key."""

from __future__ import annotations

import pytest
from vllm_triage.config import ConfigError, load


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


@pytest.mark.parametrize(
    ("text", "names"),
    [
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
    ],
)
def test_a_wrong_value_names_the_key_the_value_and_what_is_allowed(tmp_path, text, names):
    with pytest.raises(ConfigError) as info:
        load(write(tmp_path, text), env={})
    for name in names:
        assert name in str(info.value)


def test_wrong_env_value_is_named():
    with pytest.raises(ConfigError) as info:
        load(env={"VLLM_TRIAGE_GPM": "maybe"})
    assert "gpm" in str(info.value) and "true or false" in str(info.value)


def test_sources_and_gpus_lists():
    config = load(env={"VLLM_TRIAGE_SOURCES": "gpu, vllm", "VLLM_TRIAGE_GPUS": "0,GPU-abc"})
    assert config.sources == ("gpu", "vllm") and config.gpus == ("0", "GPU-abc")
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
