"""A child compiles isoprobe's own modules from source, whatever bytecode caches hold (``child.source_only``).

Why it matters: the CPU trial's memory was 1.4 MiB higher with bytecode present
than without, one sample of small-cnn at its edge (see the module's docstring).
The test makes the difference visible without measuring memory: a bytecode cache
that disagrees with its source (an unchecked-hash ``.pyc``, which Python trusts
without looking at the source) is what a normal import runs, and what the child
must not.
"""

from __future__ import annotations

import py_compile
import subprocess
import sys
import textwrap

from isoprobe.child import main as child_main
from isoprobe.child.source_only import SourceOnlyFinder


def _package_with_stale_bytecode(root):
    """A package named ``isoprobe`` whose module ``m`` says 'source' while its cached bytecode says 'bytecode'."""
    package = root / "isoprobe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    module = package / "m.py"
    module.write_text("ORIGIN = 'bytecode'\n")
    py_compile.compile(str(module), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    module.write_text("ORIGIN = 'source'\n")
    return root


def _origin(root, finder_source, install: bool) -> str:
    """What ``isoprobe.m`` says in a fresh interpreter, with or without the finder installed first."""
    script = textwrap.dedent(f"""
        import sys
        namespace = {{}}
        exec(compile(open({str(finder_source)!r}).read(), "source_only", "exec"), namespace)
        sys.path.insert(0, {str(root)!r})
        if {install}:
            sys.meta_path.insert(0, namespace["SourceOnlyFinder"]())
        import isoprobe.m
        print(isoprobe.m.ORIGIN)
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=root)
    return run.stdout.strip()


def test_a_stale_bytecode_cache_is_run_by_a_plain_import_and_ignored_by_the_finder(tmp_path):
    root = _package_with_stale_bytecode(tmp_path)
    finder_source = sys.modules[SourceOnlyFinder.__module__].__file__  # run by path: the package under test is
    assert _origin(root, finder_source, install=False) == "bytecode"  # the cache is what Python runs
    assert _origin(root, finder_source, install=True) == "source"


def test_only_isoprobe_is_taken_and_the_finder_is_installed_once(monkeypatch):
    import isoprobe

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    finder = SourceOnlyFinder()
    assert finder.find_spec("json") is None and finder.find_spec("isoprobe_extra") is None
    assert type(finder.find_spec("isoprobe.errors", isoprobe.__path__).loader).__name__ == "SourceOnlyLoader"
    child_main.main(["isoprobe.child", "--not-an-argument"])  # usage error: returns 2, after installing the finder
    child_main.main(["isoprobe.child", "--not-an-argument"])
    assert sum(isinstance(f, SourceOnlyFinder) for f in sys.meta_path) == 1
