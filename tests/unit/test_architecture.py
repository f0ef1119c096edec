"""The house's import rules (docs/development.md, How it works), read from the source: the judge is handed values, settings
are a leaf, evaluation knows no outlet, and nothing imports in a circle."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "exporter" / "vllm_triage"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """module -> the package's modules it imports (anywhere in it: a TYPE_CHECKING import is an edge too)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")
                base = base[: len(base) - node.level + 1] if node.level else []
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
                for alias in node.names:  # `from . import x` imports a module x; `from .m import f` imports m
                    edges.add(f"{target}.{alias.name}" if (PACKAGE.parent / f"{target}.{alias.name}".replace(".", "/")).with_suffix(".py").exists() else target)
            elif isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names)
    return {name: {e for e in edges if e.startswith("vllm_triage") and e != name} for name, edges in graph.items()}


def reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for target in graph.get(todo.pop(), set()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_the_judge_imports_no_store_signals_discovery_or_derive():
    graph = imports()
    forbidden = ("vllm_triage.store", "vllm_triage.signals", "vllm_triage.discovery", "vllm_triage.derive", "vllm_triage.registry", "vllm_triage.sources")
    for module in (m for m in graph if m.startswith("vllm_triage.diagnosis")):
        assert not [t for t in reaches(graph, module) if t.startswith(forbidden)], module


def test_settings_import_no_source_and_evaluation_no_outlet():
    graph = imports()
    for settings in ("vllm_triage.config", "vllm_triage.config_loader"):
        assert not [t for t in reaches(graph, settings) if t.startswith(("vllm_triage.sources", "vllm_triage.registry"))], settings
    outlets = ("vllm_triage.exposition", "vllm_triage.server", "vllm_triage.report", "vllm_triage.html_report", "vllm_triage.cli", "vllm_triage.daemon")
    for module in ("vllm_triage.pipeline", "vllm_triage.derive", "vllm_triage.store", "vllm_triage.diagnosis.engine"):
        assert not [t for t in reaches(graph, module) if t.startswith(outlets)], module


def test_no_module_imports_itself_in_a_circle():
    graph = imports()
    circles = sorted(m for m in graph if m in reaches(graph, m) and not m.endswith("__init__") and m != "vllm_triage")
    assert not circles, {m: sorted(graph[m]) for m in circles}


def test_benchmarks_and_the_harness_import_no_test_module():
    """bench/ measures with the real parts in harness/; neither reaches into tests/ (whose modules assert)."""
    repo = PACKAGE.parents[1]
    offenders = []
    for path in [*(repo / "bench").rglob("*.py"), *(repo / "harness").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names] if isinstance(node, ast.Import) else []
            offenders += [f"{path.relative_to(repo)}: {name}" for name in names if name == "tests" or name.startswith("tests.")]
        if '"tests.' in path.read_text():  # a module started as `python -m tests.…`
            offenders.append(f"{path.relative_to(repo)}: runs a tests.* module")
    assert not offenders, offenders
