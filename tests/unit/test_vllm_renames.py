"""A vLLM metric rename is one entry of the rename table (sources/vllm.py's RENAMES): give every family the alert
rules, the chart's rules and the dashboards select an older spelling there, and every rule, recording rule, panel
and variable selects that spelling too, and the sidecar reads a page written with the old names as today's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "tests" / "data" / "vllm-0.32.0-cpu-kv-saturated.metrics.txt"  # a real vLLM's, under load

# Generates every rule and panel query twice: as today, then with a made-up older spelling ("vllm:v0_<name>") of every
# family they select added to RENAMES alone.
GENERATE = r"""
import importlib, json, re, sys
from vllm_triage.model import HISTOGRAM_SUFFIXES
from vllm_triage.sources import vllm as source

def queries():
    import mixin.rules as rules, mixin.dashboards as dashboards
    rules, dashboards = importlib.reload(rules), importlib.reload(dashboards)
    found = []
    for name, document in (("rules", rules.rules_file()), ("chart rules", rules.chart_rules_file())):
        found += [(f"{name}: {r.get('alert') or r.get('record')}", r["expr"]) for g in document["groups"] for r in g["rules"]]
    for uid, build in dashboards.DASHBOARDS.items():
        board = build()
        found += [(f"{uid}: {title}", expr) for title, expr in dashboards.panel_queries(board)]
        found += [(f"{uid}: ${v['name']}", v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query", ""))
                  for v in board["templating"]["list"] if v.get("type") == "query"]
    return found

today = queries()
families = set()
for _, expr in today:
    for token in re.findall(r"vllm:[A-Za-z0-9_:]+", expr):
        base = next((token[: -len(s)] for s in HISTOGRAM_SUFFIXES if token.endswith(s)), token)
        families.add(source.RENAMES.get(base, base))
renamed = {f"vllm:v0_{name[len('vllm:'):]}": name for name in sorted(families)}
source.RENAMES.update(renamed)
source._canonical.cache_clear()
page = open(sys.argv[1]).read()
old_page = page
for old, new in renamed.items():
    old_page = re.sub(re.escape(new) + r"(?=(_bucket|_count|_sum|_created)?[{ ])", old, old_page)
print(json.dumps({"renamed": renamed, "queries": queries(),
                  "today": sorted(k[0] for k in source.parse_page(page)[0]), "read": sorted(k[0] for k in source.parse_page(old_page)[0]),
                  "old_page_names": sorted(set(re.findall(r"^(vllm:v0_[a-z_]+)", old_page, re.M)))}))
"""


def test_a_rename_in_the_table_is_followed_by_every_rule_panel_and_page():
    run = subprocess.run([sys.executable, "-c", GENERATE, str(PAGE)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout)
    renamed: dict[str, str] = seen["renamed"]
    # The families the mixin selects (waiting and running requests, KV usage, tokens, preemptions, the latency
    # histograms, request outcomes) all got an older spelling.
    assert {"vllm:num_requests_waiting", "vllm:time_to_first_token_seconds", "vllm:kv_cache_usage_perc"} <= set(renamed.values())
    assert len(renamed) >= 8
    selecting = 0
    for where, expr in seen["queries"]:
        tokens = set(re.findall(r"vllm:[A-Za-z0-9_:]+", expr))
        for old, new in renamed.items():
            for suffix in ("", "_bucket", "_count", "_sum"):
                if f"{new}{suffix}" in tokens:  # each place that selects today's name selects the older one beside it
                    selecting += 1
                    assert f"{old}{suffix}" in tokens, f"{where} selects {new}{suffix} but not {old}{suffix}: {expr}"
    assert selecting >= 30  # every alert, recording rule, panel and variable on vLLM's own metrics was checked
    # The page: written with the old names, read as today's.
    assert seen["old_page_names"], "the page was not rewritten"
    assert seen["read"] == seen["today"]
