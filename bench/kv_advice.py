"""The KV advice, proven by a rerun on the real vLLM (CPU build, tiny model, 40 blocks of 128 tokens):
drive it into saturation at its configured --max-num-seqs, read the --max-num-seqs the sidecar advises,
restart vLLM with it, drive the same load again, and compare the verdicts and what the server delivered.
Prints a table and writes JSON; enforces nothing. About 10 minutes on 2 cores.

    .venv/bin/python -m bench.kv_advice [--seconds 150] [--out kv-advice.json]
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from harness import vllm_server
from harness.components import FAST_CADENCE, get, start_load, start_sidecar

# The load of the integration suite's saturation: 64 clients of 200-word prompts and 500 tokens out.
CLIENTS, PROMPT_WORDS, MAX_TOKENS = 64, 200, 500
# Short windows and `for` so that 150 s of load holds a steady stretch; thresholds keep their defaults.
SETTINGS = FAST_CADENCE.replace("window_seconds: 10", "window_seconds: 20") + (
    "conditions:\n" + "".join(f"  {c}: {{for_seconds: 5, clear_for_seconds: 5}}\n" for c in ("kv_cache_saturated", "queue_backlog", "preemption_storm"))
)
WATCHED = ("kv_cache_saturated", "preemption_storm", "queue_backlog")


def vllm_totals(url: str) -> dict[str, float]:
    page = get(url + "/metrics")[1].decode()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        for s in family.samples:
            if s.name in ("vllm:generation_tokens_total", "vllm:num_preemptions_total", "vllm:request_success_total"):
                totals[s.name] = totals.get(s.name, 0.0) + s.value
    return totals


def run(max_num_seqs: int, seconds: float, folder: Path) -> dict[str, object]:
    folder.mkdir(parents=True, exist_ok=True)
    server = vllm_server.start(folder / "vllm.log", niceness=0, max_num_seqs=max_num_seqs)
    sidecar = start_sidecar(folder, server.url, SETTINGS, "--sources", "vllm,process")
    load = start_load(server.url, CLIENTS, PROMPT_WORDS, MAX_TOKENS)
    active = {c: 0 for c in WATCHED}
    ticks, advice = 0, []
    try:
        time.sleep(40)  # the batch fills, the window fills
        before, started = vllm_totals(server.url), time.monotonic()
        while time.monotonic() - started < seconds:
            time.sleep(2)
            diagnosis = sidecar.diagnosis()
            ticks += 1
            for verdict in diagnosis["conditions"]:
                if verdict["condition"] in active and verdict["state"] == "active":
                    active[verdict["condition"]] += 1
                if verdict["condition"] == "kv_cache_saturated" and verdict.get("advice"):
                    advice = verdict["advice"]
        after, ended = vllm_totals(server.url), time.monotonic()
    finally:
        load.stop()
        sidecar.process.terminate()
        server.stop()
    elapsed = ended - started
    return {
        "max_num_seqs": max_num_seqs,
        "active_share": {c: round(n / ticks, 2) for c, n in active.items()},
        "generated_tokens_per_second": round((after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]) / elapsed, 1),
        "finished_requests_per_second": round((after["vllm:request_success_total"] - before["vllm:request_success_total"]) / elapsed, 3),
        "preemptions_per_second": round((after["vllm:num_preemptions_total"] - before["vllm:num_preemptions_total"]) / elapsed, 3),
        "advice": advice,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--out", default="kv-advice.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = run(vllm_server.MAX_NUM_SEQS, args.seconds, Path(tmp) / "before")
        advised = next((int(m.group(1)) for a in before["advice"] if (m := re.match(r"--max-num-seqs (\d+):", str(a)))), None)  # type: ignore[attr-defined]
        if advised is None:
            raise SystemExit(f"no --max-num-seqs advice in the saturated run: {before}")
        after = run(advised, args.seconds, Path(tmp) / "after")
    Path(args.out).write_text(json.dumps({"before": before, "after": after}, indent=1))
    print("| | max_num_seqs | kv_cache_saturated | preemption_storm | queue_backlog | tokens/s | requests/s | preemptions/s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in (("as configured", before), ("as advised", after)):
        share = r["active_share"]
        assert isinstance(share, dict)
        print(
            f"| {name} | {r['max_num_seqs']} | {share['kv_cache_saturated']:.0%} | {share['preemption_storm']:.0%} | {share['queue_backlog']:.0%} | "
            f"{r['generated_tokens_per_second']} | {r['finished_requests_per_second']} | {r['preemptions_per_second']} |"
        )
    print("advice:", *before["advice"], sep="\n  ")  # type: ignore[misc]


if __name__ == "__main__":
    main()
