"""The manuals' links: every relative link in the READMEs and docs/ names a file of the repository, and a link to a
section names a heading that exists (GitHub's anchors: lower case, punctuation dropped, spaces as dashes)."""

from __future__ import annotations

import re

import pytest

from harness.components import REPO

MANUALS = [REPO / "README.md", REPO / "helm" / "vllm-triage" / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def anchors(path) -> set[str]:
    headings = re.findall(r"^#+ (.+)$", path.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("manual", MANUALS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_names_a_file_and_a_heading_that_exist(manual):
    text = re.sub(r"```.*?```", "", manual.read_text(), flags=re.DOTALL)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (manual.parent / file).resolve() if file else manual
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in anchors(path)):
            broken.append(target)
    assert not broken, broken
