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
