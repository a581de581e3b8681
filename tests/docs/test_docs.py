"""The docs run: every fenced block of README.md and docs/*.md is checked against the code it describes.

A renamed flag, a renamed spec field or a renamed result field then fails here instead of leaving
the docs wrong. Each check is one parameter named ``FILE:LINE`` (the block's, or the command's,
line), so a failure says where to look. The conventions a docs page follows:

- Every fence names its language, one of ``LANGUAGES``: a block without one would be checked by nothing.
- ``yaml``: a spec (it has ``model:`` or ``command:``) is validated as a file, as ``isoprobe validate`` does; a
  fragment (neither) is deep-merged into specs/small-cnn.yaml and the result validated. A
  YAML block that is deliberately no spec is marked on the line before its fence:
  ``<!-- not a spec: WHY -->`` (or written as ``text``).
- ``bash``/``sh``/``console``: every ``isoprobe`` command (also inside ``$(...)``, after ``VAR=``
  assignments, ``exec`` or ``eval``, before a pipe or a redirection, a path ending in
  ``/isoprobe``, and ``docker|podman run ... isoprobe ARGS``, the image's entrypoint) is parsed by
  the CLI's own argument parser. In a ``console`` block, a command is a line starting with ``$ ``
  and the lines after it are its output: such a command is run for real (``python -m isoprobe``,
  on the CPU, with an empty cache), so it must be one that answers in seconds (``FAST``), and each
  output line shown must match a line it prints by its first words, numbers masked (numbers vary
  between machines; a renamed field or label does not).
- ``python``: compiled, and its imports resolved (in a fresh interpreter); then executed from the
  repository's root, unless marked ``<!-- compile only: WHY -->`` (a block that probes, or uses
  names the reader brings).

Fast by design: the specs are validated in this process, the real commands are ``validate``,
``show`` and ``estimate`` on small files, and the imports are resolved in one interpreter.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from conftest import REPO, cli, run_cli
from isoprobe.cli.main import _parser, split_command  # the parser `isoprobe` itself uses: a flag the docs show must exist there

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LANGUAGES = {"yaml", "bash", "sh", "console", "python", "text"}
SHELLS = {"bash", "sh", "console"}
MARKERS = {"not a spec": "yaml", "compile only": "python"}
BASE_SPEC = REPO / "specs" / "small-cnn.yaml"
#: Subcommands whose shown output is checked by running them: each answers in seconds on the CPU.
FAST = {"validate", "schema", "show", "estimate"}
#: How many of each kind the docs held when this test was written: fewer means the parsing broke
#: (or blocks were dropped on purpose: then lower the number in the same change).
AT_LEAST = {"spec": 2, "fragment": 5, "not a spec": 0, "command": 18, "run": 6, "python": 4, "executed": 1}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # the opening fence's, 1-based
    language: str
    text: str
    marker: str  # the kind of a ``<!-- KIND: WHY -->`` on the line before the fence, else ""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


@dataclass(frozen=True)
class Command:
    where: str
    argv: tuple[str, ...]
    output: tuple[str, ...] | None  # the lines a console block shows after it; None: no output shown


def read_blocks(page: Path) -> list[Block]:
    """The fenced blocks of one page, indented ones (inside a list item) included."""
    lines = page.read_text().split("\n")
    found, index = [], 0
    while index < len(lines):
        opening = re.match(r"^( *)```(\S*)\s*$", lines[index])
        if not opening:
            index += 1
            continue
        indent, language = opening.group(1), opening.group(2)
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        assert end < len(lines), f"{page.relative_to(REPO)}:{index + 1}: a fence that is never closed"
        before = next((text.strip() for text in reversed(lines[:index]) if text.strip()), "")
        marker = re.match(r"^<!-- ([a-z ]+): \S.* -->$", before)
        body = "\n".join(text[len(indent):] if text.startswith(indent) else text for text in lines[index + 1:end])
        found.append(Block(page, index + 1, language, body + "\n", marker.group(1) if marker else ""))
        index = end + 1
    return found


BLOCKS = [block for page in PAGES for block in read_blocks(page)]


def _by_where(items):
    return [pytest.param(item, id=item.where) for item in items]


# ---------------------------------------------------------------- commands: isoprobe's argv out of shell text


def _substitutions(text: str) -> tuple[str, list[str]]:
    """``text`` with every ``$(...)`` replaced by a word, and the commands inside them (nested ones too)."""
    inner, out, index = [], [], 0
    while index < len(text):
        if text.startswith("$(", index):
            depth, end = 1, index + 2
            while end < len(text) and depth:
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                end += 1
            body, nested = _substitutions(text[index + 2:end - 1])
            inner += [body, *nested]
            out.append("SUBSTITUTED")
            index = end
        else:
            out.append(text[index])
            index += 1
    return "".join(out), inner


def _simple_commands(text: str) -> list[list[str]]:
    """The simple commands of one shell line: split at pipes, ``;``, ``&&``, ``||``; redirections dropped."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands, current, skip = [], [], False
    for token in lexer:
        if skip:
            skip = False
        elif token in ("|", "||", "&&", ";", "&"):
            commands.append(current)
            current = []
        elif set(token) <= set("<>&"):
            skip = True  # the redirection's target
            if current and current[-1].isdigit():
                current.pop()  # the descriptor of 2> or 1>
        else:
            current.append(token)
    return [command for command in commands + [current] if command]


def isoprobe_argv(line: str) -> list[list[str]]:
    """Every isoprobe command in one (joined) shell line, as the argv isoprobe's parser gets."""
    outer, inner = _substitutions(line)
    found = []
    for text in (outer, *inner):
        for words in _simple_commands(text):
            while words and (re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]) or words[0] in ("exec", "eval", "time")):
                words = words[1:]
            if not words:
                continue
            words = [re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", word) for word in words]  # ${VAR:-default}, unset
            if words[0] == "isoprobe" or words[0].endswith("/isoprobe"):
                found.append(words[1:])
            elif words[0] in ("docker", "podman") and words[1:2] == ["run"] and "isoprobe" in words[2:]:
                found.append(words[words.index("isoprobe", 2) + 1:])  # the image's entrypoint is isoprobe
            else:  # an argument that is itself a command line: sbatch --wrap '...', bash -c '...'
                found += [argv for flag, word in zip(words, words[1:]) if flag in ("--wrap", "-c")
                          for argv in isoprobe_argv(word)]
    return found


def _logical_lines(block: Block) -> list[tuple[int, str, list[str]]]:
    """(line, text, output) for each line of a shell block: continuations joined, comments dropped.

    In a ``console`` block only ``$ `` lines are commands, and the lines up to the next one are
    their output; elsewhere every line is a command and none has output.
    """
    lines = block.text.rstrip("\n").split("\n")
    result, index = [], 0
    while index < len(lines):
        start, text = index, lines[index]
        if block.language == "console":
            assert text.startswith("$ "), f"{block.where}: a console block's line {index + 1} is output with no command"
            text = text[2:]
        while text.endswith("\\") and index + 1 < len(lines):
            index += 1
            text = text[:-1] + " " + lines[index].strip()
        index += 1
        output = []
        if block.language == "console":
            while index < len(lines) and not lines[index].startswith("$ "):
                output.append(lines[index])
                index += 1
        if not text.lstrip().startswith("#"):
            result.append((block.line + 1 + start, text, output))
    return result


def _commands() -> list[Command]:
    found = []
    for block in BLOCKS:
        if block.language not in SHELLS:
            continue
        for line, text, output in _logical_lines(block):
            for argv in isoprobe_argv(text):
                shown = tuple(output) if block.language == "console" and output else None
                found.append(Command(f"{block.page.relative_to(REPO)}:{line}", tuple(argv), shown))
    return found


COMMANDS = _commands()


@pytest.mark.parametrize("command", _by_where(COMMANDS))
def test_every_command_shown_parses(command: Command):
    """The flags and subcommands a page shows exist, with the values it shows (argparse's own errors)."""
    parser = _parser()
    # The docs must name flags in full: argparse would take --log for a flag renamed --log-file.
    for each in [parser, *next(a for a in parser._actions if a.dest == "command").choices.values()]:
        each.allow_abbrev = False
    own, _ = split_command(list(command.argv))  # after '--' comes the user's command, not isoprobe's flags
    try:
        parser.parse_args(own)
    except SystemExit as exit:
        assert exit.code == 0, f"{command.where}: `isoprobe {shlex.join(command.argv)}` is refused by the parser"


def _words(line: str) -> tuple[str, ...]:
    """What a shown line must agree on: its first three words, numbers masked, up to an aside in parentheses.

    Numbers vary between machines and runs, and so do the asides (a CPU's name, a path); the
    leading words are the labels, fields and verdicts a rename would change.
    """
    words = []
    for word in line.split()[:3]:
        if word.startswith("("):
            break
        words.append(re.sub(r"\d+", "#", word))
    return tuple(words)


@pytest.mark.parametrize("command", _by_where([c for c in COMMANDS if c.output is not None]))
def test_every_command_shown_with_output_prints_it(command: Command):
    """Run for real, as the reader would (empty cache, the repository as the working folder)."""
    assert command.argv and command.argv[0] in FAST, (
        f"{command.where}: `isoprobe {shlex.join(command.argv)}` is shown with its output in a console block, "
        f"so it is run here, and only {sorted(FAST)} are fast: show a slow command's output in a text block")
    run = run_cli(*command.argv, timeout=120)
    assert run.returncode in (0, 2, 3, 4) and "Traceback" not in run.stderr, (command.where, run.stderr)
    printed = {_words(line) for line in (run.stdout + run.stderr).split("\n") if line.strip()}
    shown = [line for line in command.output if line.strip() and line.strip() != "..."]
    assert shown, f"{command.where}: a console command with no output line to compare"
    missing = [line for line in shown if _words(line) not in printed]
    assert not missing, (f"{command.where}: `isoprobe {shlex.join(command.argv)}` no longer prints these lines "
                         f"(first three words, numbers masked):\n" + "\n".join(missing)
                         + "\n--- it printed:\n" + run.stdout + run.stderr)


# ---------------------------------------------------------------- YAML: specs and fragments


def _merged(base: dict, fragment: dict) -> dict:
    merged = dict(base)
    for key, value in fragment.items():
        merged[key] = _merged(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return merged


YAML_BLOCKS = [block for block in BLOCKS if block.language == "yaml"]


def _whole(data: dict) -> bool:
    """A whole spec names what the trials run: a model, or the job's own command."""
    return "model" in data or "command" in data


@pytest.mark.parametrize("block", _by_where(YAML_BLOCKS))
def test_every_yaml_block_is_a_valid_spec_or_fragment(block: Block, tmp_path):
    """A spec as `isoprobe validate` reads it; a fragment merged into a small spec first."""
    if block.marker == "not a spec":
        return
    data = yaml.safe_load(block.text)
    assert isinstance(data, dict), f"{block.where}: a YAML block that is not a mapping (mark it <!-- not a spec: why -->)"
    spec = data if _whole(data) else _merged(yaml.safe_load(BASE_SPEC.read_text()), data)
    for source in (REPO / "specs").glob("*.py"):  # a spec's factory paths resolve beside it, as in specs/
        (tmp_path / source.name).symlink_to(source)
    path = tmp_path / "docs-block.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    run = cli("validate", str(path))
    assert run.returncode == 0, (f"{block.where}: this YAML block is no valid spec"
                                 f"{'' if 'model' in data else ' (a fragment merged into specs/small-cnn.yaml)'}; "
                                 f"if it is not meant to be one, mark it <!-- not a spec: why -->\n{run.stderr}")


# ---------------------------------------------------------------- Python


PYTHON_BLOCKS = [block for block in BLOCKS if block.language == "python"]

_RESOLVE = textwrap.dedent("""
    import importlib, importlib.util, json, sys
    failures = {}
    for where, imports in json.loads(sys.stdin.read()).items():
        for module, names in imports:
            try:
                if names is None:
                    assert importlib.util.find_spec(module) is not None, f"no module {module}"
                    continue
                imported = importlib.import_module(module)
                for name in names:
                    assert hasattr(imported, name) or importlib.util.find_spec(f"{module}.{name}"), \\
                        f"{module} has no {name}"
            except Exception as error:
                failures.setdefault(where, []).append(f"{module}: {type(error).__name__}: {error}")
    print(json.dumps(failures))
""")


@pytest.fixture(scope="module")
def unresolved_imports() -> dict[str, list[str]]:
    """Every Python block's imports resolved in one fresh interpreter: the failures, by block."""
    imports = {}
    for block in PYTHON_BLOCKS:
        found = []
        for node in ast.walk(ast.parse(block.text)):
            if isinstance(node, ast.Import):
                found += [(alias.name, None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                found.append((node.module, [alias.name for alias in node.names]))
        imports[block.where] = found
    done = subprocess.run([sys.executable, "-c", _RESOLVE], input=json.dumps(imports), capture_output=True,
                          text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("block", _by_where(PYTHON_BLOCKS))
def test_every_python_block_compiles_imports_and_runs(block: Block, unresolved_imports, tmp_path):
    compile(block.text, block.where, "exec")
    assert not unresolved_imports.get(block.where), (block.where, unresolved_imports[block.where])
    if block.marker == "compile only":
        return
    done = subprocess.run([sys.executable, "-c", block.text], capture_output=True, text=True, cwd=REPO,
                          timeout=120, env={**__import__("os").environ, "ISOPROBE_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0, f"{block.where}: the block fails when run\n{done.stderr}"


# ---------------------------------------------------------------- the rules themselves


@pytest.mark.parametrize("block", _by_where(BLOCKS))
def test_every_block_names_a_known_language_and_markers_fit_it(block: Block):
    assert block.language in LANGUAGES, (
        f"{block.where}: a fence with language {block.language!r}; use one of {sorted(LANGUAGES)} "
        "(text for what no test can check)")
    if block.marker:
        assert MARKERS.get(block.marker) == block.language, (
            f"{block.where}: <!-- {block.marker}: ... --> on a {block.language} block; markers: {MARKERS}")


def test_the_first_command_in_readme_is_the_first_run():
    first = next(c for c in COMMANDS if c.where.startswith("README.md:"))
    assert first.argv == ("run", "specs/resnet50.yaml"), first


def test_the_docs_hold_enough_blocks_of_each_kind():
    """So that a parsing slip (a fence the reader misses, a marker on everything) cannot pass unseen."""
    yaml_checked = [block for block in YAML_BLOCKS if block.marker != "not a spec"]
    counts = {
        "spec": sum(_whole(yaml.safe_load(block.text)) for block in yaml_checked),
        "fragment": sum(not _whole(yaml.safe_load(block.text)) for block in yaml_checked),
        "not a spec": len(YAML_BLOCKS) - len(yaml_checked),
        "command": len(COMMANDS),
        "run": sum(command.output is not None for command in COMMANDS),
        "python": len(PYTHON_BLOCKS),
        "executed": sum(block.marker != "compile only" for block in PYTHON_BLOCKS),
    }
    print(counts)
    assert all(counts[kind] >= least for kind, least in AT_LEAST.items()), (counts, AT_LEAST)


def test_the_command_finder_sees_through_shell():
    """The shapes the pages use, each found (and nothing found in what only mentions isoprobe)."""
    assert isoprobe_argv('eval "$(isoprobe run s.yaml --format env)"') == [["run", "s.yaml", "--format", "env"]]
    assert isoprobe_argv('exports=$(isoprobe run s.yaml --log "x-$A.log")') == [["run", "s.yaml", "--log", "x-$A.log"]]
    assert isoprobe_argv("ISOPROBE_CACHE_DIR=/c isoprobe run s.yaml --format json > /dev/null") == [
        ["run", "s.yaml", "--format", "json"]]
    assert isoprobe_argv("exec /opt/isoprobe/bin/isoprobe run s.yaml 2> err | head") == [["run", "s.yaml"]]
    assert isoprobe_argv("docker run --rm -v a:/cache isoprobe run r.yaml") == [["run", "r.yaml"]]
    assert isoprobe_argv("sbatch --wrap 'isoprobe run s.yaml > /dev/null'") == [["run", "s.yaml"]]
    assert isoprobe_argv('isoprobe run s.yaml --fallback-batch-size "${FALLBACK:-16}"') == [
        ["run", "s.yaml", "--fallback-batch-size", "16"]]
    assert isoprobe_argv("docker build -t isoprobe .") == []
    assert _words("device   cpu (Intel(R) Xeon(R))") == _words("device cpu (AMD EPYC)") == ("device", "cpu")
    assert _words('  "max_batch_size": 136,') == ('"max_batch_size":', "#,")
    assert isoprobe_argv("srun python train.py --batch-size \"$ISOPROBE_BATCH_SIZE\"") == []
