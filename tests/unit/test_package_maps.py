"""Each package's ``__init__`` is its map: it names every module and subpackage it holds, so a newcomer reading
it (or docs/architecture.md, which points there) never meets a module the map does not mention."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "isoprobe"


def packages() -> list[Path]:
    return sorted(init.parent for init in PACKAGE.rglob("__init__.py") if "__pycache__" not in init.parts)


def unnamed(package: Path) -> list[str]:
    """The modules and subpackages of ``package`` its ``__init__`` docstring does not name (``name.py``,
    ``name/`` or ``name`` as a word)."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) or ""
    held = [p.stem for p in package.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    held += [p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    return sorted(name for name in held if not re.search(rf"(?<![\w.]){re.escape(name)}(\.py|/)?(?!\w)", doc))


@pytest.mark.parametrize("package", packages(), ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_the_packages_init_names_every_module_it_holds(package):
    assert unnamed(package) == [], f"{package / '__init__.py'}: add a line for each to its docstring"


def test_a_module_the_map_does_not_name_is_found(tmp_path):
    (tmp_path / "__init__.py").write_text('"""The map.\n\n    named.py  is here\n"""\n')
    for name in ("named.py", "forgotten.py", "named_too_long.py"):
        (tmp_path / name).write_text("")
    assert unnamed(tmp_path) == ["forgotten", "named_too_long"]


def test_every_module_docs_architecture_names_exists():
    """docs/architecture.md's tables (what each package holds, where each noun lives) name modules by path;
    a module moved or renamed without the page is found here, not by a newcomer."""
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:[a-z_]+/)*[a-z_]+\.py)`", text))
    assert named, "the page names no module: the pattern no longer matches how it names them"

    def exists(path: str) -> bool:  # from the repository, from the package, or a bare name anywhere in it
        return ((PACKAGE.parent / path).exists() or (PACKAGE / path).exists()
                or ("/" not in path and any(PACKAGE.rglob(path))))

    missing = sorted(path for path in named if not exists(path))
    assert missing == [], f"docs/architecture.md names modules that do not exist under isoprobe/: {missing}"
