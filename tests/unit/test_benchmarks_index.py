"""benchmarks/ stays findable (issue 48): every script is in benchmarks/README.md's index, and every
``benchmarks/...`` path that the docs, tests, code or the benchmarks themselves name exists.

The scripts moved into folders by kind (harness/, studies/, simulations/, specs/); a page or a test that
still names an old place would send a reader, or a test's import, nowhere. docs/results/ is left out: its
files are records of runs, whose commands are kept as they were run.
"""

from __future__ import annotations

import re

import pytest

from conftest import REPO

BENCHMARKS = REPO / "benchmarks"
INDEX = BENCHMARKS / "README.md"
#: A path below benchmarks/ as text names it: folders and a file with an extension (a trailing dot or
#: backtick is prose, not path).
PATH = re.compile(r"(?<![\w/.])benchmarks/[\w./-]*[\w-](?:\.(?:py|yaml|md))?")
SOURCES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted(BENCHMARKS.rglob("*.py")),
           *sorted(BENCHMARKS.rglob("*.yaml")), INDEX, *sorted((REPO / "tests").rglob("*.py")),
           *sorted((REPO / "tests").rglob("*.yaml")), *sorted((REPO / "isoprobe").rglob("*.py"))]


def _named() -> list[tuple[str, str]]:
    found = set()
    for source in SOURCES:
        if not source.is_file():  # tests/bad_specs holds a folder named like a spec, on purpose
            continue
        for match in PATH.finditer(source.read_text(errors="replace")):
            found.add((str(source.relative_to(REPO)), match.group(0).rstrip("/")))
    return sorted(found)


def test_gpu_check_stays_where_the_guide_sends_everyone():
    assert (BENCHMARKS / "gpu_check.py").is_file()


@pytest.mark.parametrize("script", sorted(str(p.relative_to(BENCHMARKS)) for p in BENCHMARKS.glob("*/*.py")
                                          if p.parent.name in {"harness", "studies", "simulations"}))
def test_every_script_is_in_the_index(script: str):
    assert f"`{script}`" in INDEX.read_text(), f"benchmarks/README.md does not list {script}"


def test_no_script_lies_loose_beside_gpu_check():
    loose = sorted(p.name for p in BENCHMARKS.glob("*.py") if p.name != "gpu_check.py")
    assert not loose, f"put {loose} in harness/, studies/ or simulations/ and index them in benchmarks/README.md"


def test_every_benchmarks_path_named_exists():
    placeholder = re.compile(r"/[A-Z]+\.\w+$")  # benchmarks/specs/heldout/NAME.yaml: the reader fills it in
    missing = [f"{source}: {path}" for source, path in _named()
               if not (REPO / path).exists() and not placeholder.search(path)]
    assert not missing, "paths that name nothing (moved?):\n" + "\n".join(missing)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in page.read_text().split("\n"):
        heading = re.match(r"^#{1,6} (.+)$", line)
        if heading:
            slug = _slug(re.sub(r"`", "", heading.group(1)))
            found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return found


def test_every_link_into_the_measurements_page_lands_on_a_heading():
    """docs/measurements.md opens with the figures that hold today and keeps the notebook below: links into
    either, from any page, must name a heading that is there."""
    target = REPO / "docs" / "measurements.md"
    anchors = _anchors(target)
    broken = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), INDEX]:
        for match in re.finditer(r"\]\(([\w./-]*)#([\w-]+)\)", page.read_text()):
            linked, anchor = match.groups()
            resolved = (page.parent / linked).resolve() if linked else page.resolve()
            if resolved == target.resolve() and anchor not in anchors:
                broken.append(f"{page.relative_to(REPO)}: #{anchor}")
    for source in sorted((REPO / "isoprobe").rglob("*.py")):  # the code links its constants' figures there
        for anchor in re.findall(r"docs/measurements\.md#([\w-]*\w)", source.read_text()):
            if anchor not in anchors:
                broken.append(f"{source.relative_to(REPO)}: #{anchor}")
    assert not broken, "links to no heading of docs/measurements.md:\n" + "\n".join(broken)
