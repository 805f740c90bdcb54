"""The docs say what the code does (issue 31 item 6), with the code as the source.

- Every `engram …` command line in README.md and docs/*.md names only flags its command has,
  and, where it spells a command out, every flag that command requires, never bracketed as
  optional. A synopsis (a line with `[optional]` parts) lists every flag and positional of its
  command, unless it says it leaves some out (`...` or `…`).
- The command table of docs/admin.md gives every `engram admin` command, each in full.
- The migrations table of docs/admin.md lists exactly the migrations of
  engram_core/store/duckdb/migrations.py, in order (read from the module, so a new migration
  needs its row).

The parser is the one behind every `engram … --help` (``engram_core.cli.build_parser``).
"""

from __future__ import annotations

import argparse
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from engram_core.cli import build_parser as _build_parser
from engram_core.install_hints import SEMANTIC_INSTALL
from engram_core.store.duckdb.migrations import MIGRATIONS

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
ADMIN_DOC = REPO / "docs" / "admin.md"
COMMANDS = ("serve", "mcp", "init", "doctor", "admin", "policy", "console")
ELISIONS = ("...", "…")
_FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.M | re.S)
_SHELL_FENCES = ("", "sh", "bash", "shell", "console")  # other fences (toml, yaml, text) only mention commands
_SPAN = re.compile(r"`([^`\n]+(?:\n[^`\n]+)*)`")
_START = re.compile(rf"(?:^|(?<=[\s/\"'(]))engram\s+(?=(?:{'|'.join(COMMANDS)})\b)")
_TOKEN = re.compile(r"\[|\]|[^\s\[\]]+")
_FLAG = re.compile(r"--[a-z0-9][a-z0-9-]*")
_END = re.compile(r"\s(?:&&|;|&|>|2>|#)(?:\s|$)|\s\|\s(?![^\[]*\])")  # shell operators, a comment


@functools.cache
def build_parser() -> argparse.ArgumentParser:
    """The parser `engram --help` prints, built once (nothing here changes it)."""
    return _build_parser()


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(found[0].choices) if found else {}


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {opt: a for a in parser._actions for opt in a.option_strings if opt.startswith("--") and opt != "--help"}


def _positionals(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not a.option_strings and not isinstance(a, argparse._SubParsersAction)]


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


@dataclass
class Level:
    """What one command line says about one parser on its path (engram, engram admin, ...)."""

    path: tuple[str, ...]
    parser: argparse.ArgumentParser
    flags: dict[str, bool] = field(default_factory=dict)  # flag -> written inside [brackets]
    positionals: int = 0
    elided: bool = False
    problems: list[str] = field(default_factory=list)


def _levels(line: str) -> list[list[Level]]:
    """The command line ``line`` (from `engram` on) read against the parser, one list of levels per
    command it names (`policy test|check|bundle` names three)."""
    # `[--tool NAME]…` says the option repeats; only a free-standing `…` leaves something out
    tokens = [t.strip("\"'") for t in _TOKEN.findall(re.sub(r"\](?:\.\.\.|…)", "]", line))]
    readings: list[list[Level]] = [[Level(("engram",), build_parser())]]
    depth = 0
    i = 1  # tokens[0] is `engram`
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token in ("[", "]"):
            depth += 1 if token == "[" else -1
            continue
        if token == "|":
            continue
        if token == "<command>":  # a synopsis of a command group: what follows is the command's own
            break
        if token in ELISIONS:
            for levels in readings:
                levels[-1].elided = True
            continue
        names = token.split("|")
        subs = _subparsers(readings[0][-1].parser)
        if depth == 0 and subs and all(name in subs for name in names):
            readings = [[*levels, Level((*levels[-1].path, name), _subparsers(levels[-1].parser)[name])]
                        for levels in readings for name in names]
            continue
        if token.startswith("--"):
            takes_value = False
            for flag in _FLAG.findall(token.split("=", 1)[0]):  # prose writes `--tls-cert/--tls-key`
                if flag == "--help":
                    continue
                for levels in readings:
                    levels[-1].flags[flag] = depth > 0
                    action = _options(levels[-1].parser).get(flag)
                    if action is None:
                        levels[-1].problems.append(f"{' '.join(levels[-1].path)} has no {flag}")
                    takes_value = takes_value or (action is not None and _takes_value(action))
            if takes_value and "=" not in token and i < len(tokens) and \
                    tokens[i] not in ("[", "]", "|") and not tokens[i].startswith("--"):
                i += 1  # the flag's value
            continue
        for levels in readings:
            levels[-1].positionals += 1
    return readings


SYNOPSIS, INVOCATION, MENTION = "synopsis", "invocation", "mention"


def _kind(line: str, *, fenced: bool) -> str:
    """A synopsis shows [optional] parts; a fenced line is a command to paste; any other inline
    span only mentions a command and some of its flags (`engram serve --metrics`)."""
    return SYNOPSIS if "[" in line else INVOCATION if fenced else MENTION


def _check(line: str, *, kind: str) -> list[str]:
    """Every flag exists (all kinds); the required flags are there and not [optional] (synopses and
    invocations); every flag and positional is there (synopses that elide nothing)."""
    synopsis = kind == SYNOPSIS
    problems: list[str] = []
    for levels in _levels(line):
        for number, level in enumerate(levels):
            problems += level.problems
            if kind == MENTION:
                continue
            leaf = number == len(levels) - 1
            said = bool(level.flags or level.positionals)
            if not (said or (leaf and synopsis and len(levels) > 1)):
                continue  # a command named in passing (`engram admin revoke`), not spelled out
            name = " ".join(level.path)
            options = _options(level.parser)
            for flag, action in options.items():
                if action.required and flag not in level.flags and flag == action.option_strings[-1]:
                    problems.append(f"{name} requires {flag}")
                elif action.required and level.flags.get(flag):
                    problems.append(f"{name}: {flag} is required, not [optional]")
            for group in level.parser._mutually_exclusive_groups:  # one of them required (serve: --data | --store)
                flags = [a.option_strings[-1] for a in group._group_actions]
                if not group.required:
                    continue
                if not any(f in level.flags for f in flags):
                    problems.append(f"{name} requires {' or '.join(flags)}")
                elif all(level.flags[f] for f in flags if f in level.flags):
                    problems.append(f"{name}: one of {' '.join(flags)} is required, not [optional]")
            if synopsis and not level.elided and (leaf or level.flags):
                missing = sorted(f for f, a in options.items() if f not in level.flags and f == a.option_strings[-1])
                if missing:
                    problems.append(f"{name}: the synopsis leaves out {' '.join(missing)}")
                wanted = len(_positionals(level.parser))
                if leaf and level.positionals != wanted:
                    problems.append(f"{name}: {level.positionals} positional argument(s) shown, {wanted} taken")
    return problems


def _command_lines(text: str) -> list[tuple[int, str, str]]:
    """(line number, text from `engram` on, kind) of every command line: in fenced blocks (one per
    line, `\\` continuations joined) and in inline code spans."""
    found: list[tuple[int, str, str]] = []

    def starts(chunk: str, line_no: int, fenced: bool) -> None:
        for match in _START.finditer(chunk):
            rest = chunk[match.start():]
            end = _END.search(rest)
            line = " ".join((rest[:end.start()] if end else rest).split())
            found.append((line_no, line, _kind(line, fenced=fenced)))

    for block in _FENCE.finditer(text):
        line_no = text.count("\n", 0, block.start(2)) + 1
        shell = block.group(1).strip() in _SHELL_FENCES
        # a line ending in `\\`, or a synopsis wrapped onto an indented `[...]` line, continues
        joined = re.sub(r"\\\n\s*|\n\s+(?=\[)", " ", block.group(2))
        for offset, line in enumerate(joined.splitlines()):
            if shell:
                line = re.sub(r"(?:^|\s)#.*", "", line)  # a comment is prose
            starts(line, line_no + offset, shell)
    outside = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for span in _SPAN.finditer(outside):
        starts(span.group(1), outside.count("\n", 0, span.start()) + 1, False)
    return found


def _admin_table() -> list[tuple[int, str]]:
    """The code spans of the first column of the command table under docs/admin.md's "## Commands"."""
    text = ADMIN_DOC.read_text(encoding="utf-8")
    section = text[text.index("## Commands"):]
    section = section[:section.index("\n## ", 1)]
    base = text.count("\n", 0, text.index("## Commands")) + 1
    rows = []
    for offset, line in enumerate(section.splitlines()):
        if line.startswith("| `"):
            first = re.split(r"(?<!\\)\|", line)[1].replace("\\|", "|")
            rows += [(base + offset, span) for span in re.findall(r"`([^`]+)`", first)]
    return rows


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_command_line_in_the_docs_fits_the_cli(doc: Path) -> None:
    problems = []
    for line_no, line, kind in _command_lines(doc.read_text(encoding="utf-8")):
        problems += [f"{doc.name}:{line_no}: {kind} `{line}`: {p}" for p in _check(line, kind=kind)]
    assert problems == []


def test_the_admin_command_table_gives_every_command_in_full() -> None:
    documented: set[str] = set()
    problems = []
    for line_no, span in _admin_table():
        line = f"engram admin {span}"
        problems += [f"admin.md:{line_no}: `{span}`: {p}" for p in _check(line, kind=SYNOPSIS)]
        for levels in _levels(line):
            documented.add(" ".join(levels[-1].path[2:]))
    assert problems == []
    assert documented == set(_subparsers(_subparsers(build_parser())["admin"]))


def test_the_checker_catches_what_issue_31_found() -> None:
    # the synopsis the issue quotes: history needs its scope
    assert _check("engram admin history [--record ID] [--disputed]", kind=SYNOPSIS) == [
        "engram admin history requires --tenant", "engram admin history requires --workspace",
        "engram admin history: the synopsis leaves out --tenant --workspace"]
    assert _check("engram admin history --tenant T --workspace W [--record ID] [--disputed]", kind=SYNOPSIS) == []
    assert _check("engram serve --data DIR --nonsense", kind=INVOCATION) == ["engram serve has no --nonsense"]
    assert _check("engram serve --listen H:P", kind=INVOCATION) == ["engram serve requires --data or --store"]
    assert _check("engram serve --store URL --key-dir DIR", kind=INVOCATION) == []
    assert _check("engram serve --metrics", kind=MENTION) == []
    assert "engram init: the synopsis leaves out --force --serving --store" in \
        _check("engram init [DIR] [--host-config FILE] [--core HOST:PORT] [--tenant T] [--workspace W]", kind=SYNOPSIS)
    assert _check("engram init [DIR] [--host-config FILE] ...", kind=SYNOPSIS) == []
    problems = _check("engram admin --host-key K [--tenant T] activate --workspace W", kind=SYNOPSIS)
    assert "engram admin has no --tenant" in problems and "engram admin activate requires --tenant" in problems
    assert len(_levels("engram policy test|check|bundle [DIR] …")) == 3
    assert _check("engram admin --host-key K activate --tenant T --workspace W [--tool NAME]…", kind=SYNOPSIS) == \
        ["engram admin: the synopsis leaves out --core --json --timeout --tls-ca --tls-cert --tls-key "
         "--tls-server-name"]
    assert _command_lines("run `engram doctor --host-config F` now\n```sh\nengram serve \\\n  --data D &\n```\n") == [
        (3, "engram serve --data D", INVOCATION), (1, "engram doctor --host-config F", MENTION)]


def _migrations_table() -> list[tuple[int, str]]:
    text = ADMIN_DOC.read_text(encoding="utf-8")
    section = text[text.index("## Migrations"):]
    section = section[:section.index("\n## ", 1)]
    return [(int(m.group(1)), m.group(2).strip()) for m in re.finditer(r"^\| (\d+) \|([^\n]*)\|$", section, re.M)]


def test_the_migrations_table_lists_exactly_the_migrations_of_the_code() -> None:
    rows = _migrations_table()
    assert [version for version, _ in rows] == [m.version for m in MIGRATIONS]
    assert all(what for _, what in rows)


def test_the_readme_says_in_one_line_how_to_turn_the_semantic_channel_on() -> None:
    # the same words as `engram serve`'s warning and `engram doctor` (issue 31 item 5)
    lines = [line for line in (REPO / "README.md").read_text(encoding="utf-8").splitlines()
             if "leaves the semantic channel off" in line]
    assert len(lines) == 1 and f"`{SEMANTIC_INSTALL}`" in lines[0] and "A plain `pip install .`" in lines[0]
