"""Just enough of Rego's surface syntax to take a test rule apart: where each ``test_*`` rule's
body is, its expressions one by one, and an expression's two sides around a top-level ``==``
and its ``with`` modifiers. The test runner uses this to explain a failing test
(``engram_core/policy/testing.py``); it never decides anything, and when a body is shaped in a
way this does not follow, the runner says so instead of guessing.

Scanning is by hand over characters (strings, raw strings, comments and bracket depth), linear
in the source: no regular expression sees the test text.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

_OPEN = {"(": ")", "[": "]", "{": "}"}
_CLOSE = {")", "]", "}"}
# An expression continues on the next line when its line ends in one of these.
_CONTINUES = ("(", "[", "{", ",", "|", "=", "+", "-", "*", "/", "&", ":", "!")


@dataclass(frozen=True)
class TestRule:
    """One ``test_*`` rule definition: its name, the 1-based line it starts on, its body."""

    name: str
    line: int
    body: str  # the text between the body's braces
    expressions: tuple[str, ...]


@dataclass(frozen=True)
class Comparison:
    """``left == right with ...``: the sides and the modifiers that apply to both."""

    left: str
    right: str
    modifiers: str  # "with input as ... with data.x as ..." or ""


def _tokens(text: str) -> Iterator[tuple[int, str, int]]:
    """(index, character, bracket depth) of every character outside strings and comments."""
    depth, i, n = 0, 0, len(text)
    while i < n:
        c = text[i]
        if c in _QUOTES:
            i = _string_end(text, i)
        elif c == "#":
            while i < n and text[i] != "\n":
                i += 1
            continue
        elif c in _OPEN:
            yield i, c, depth
            depth += 1
        elif c in _CLOSE:
            depth -= 1
            yield i, c, depth
        else:
            yield i, c, depth
        i += 1


def _cut_comment(line: str) -> str:
    """``line`` up to a ``#`` that starts a comment (outside strings), right-stripped."""
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c in _QUOTES:
            i = _string_end(line, i)
        elif c == "#":
            return line[:i].rstrip()
        i += 1
    return line.rstrip()


_QUOTES = ('"', "`")


def _string_end(text: str, i: int) -> int:
    """The index of the quote closing the string that opens at ``text[i]`` (``"…"`` with
    backslash escapes, or a raw ```…```), or ``len(text)`` when it is not closed."""
    quote, i, n = text[i], i + 1, len(text)
    while i < n and text[i] != quote:
        i += 2 if quote == '"' and text[i] == "\\" else 1
    return i


def test_rules(source: str) -> list[TestRule]:
    """Every ``test_*`` rule defined with a body (``test_x if { ... }``), in source order."""
    rules: list[TestRule] = []
    offset = 0
    for number, line in enumerate(source.split("\n"), start=1):
        if line.startswith("test_"):
            name = line.split()[0].split("(")[0]
            body = _body_after(source, offset)
            if body is not None:
                rules.append(TestRule(name, number, body, tuple(split_expressions(body))))
        offset += len(line) + 1
    return rules


def _body_after(source: str, start: int) -> str | None:
    """The text inside the ``{ ... }`` that opens on the rule's header line."""
    opened = None
    for i, c, depth in _tokens(source[start:]):
        if opened is None and c == "\n":
            return None  # no body opened on the header line: not a rule we take apart
        if c == "{" and depth == 0 and opened is None:
            opened = i
        elif c == "}" and depth == 0 and opened is not None:
            return source[start + opened + 1:start + i]
    return None


def split_expressions(body: str) -> list[str]:
    """The body's expressions: separated by newlines or ``;`` at bracket depth 0; a line that
    starts with ``with`` or an infix operator, or follows a line ending in one, continues the
    expression before it."""
    lines = [_cut_comment(line) for line in body.split("\n")]
    text = "\n".join(lines)
    parts: list[str] = []
    current = ""
    cut = 0
    for i, c, depth in _tokens(text):
        if depth == 0 and c in "\n;":
            current += " " + text[cut:i].strip()
            cut = i + 1
            if c == ";" or not _continues(text[i + 1:], current):
                if current.strip():
                    parts.append(current.strip())
                current = ""
    current += " " + text[cut:].strip()
    if current.strip():
        parts.append(current.strip())
    return parts


def _continues(rest: str, so_far: str) -> bool:
    following = next((ln.strip() for ln in rest.split("\n") if ln.strip()), "")
    if following.startswith(("with ", "==", "!=", "|", "+", "*", "/", "&")):
        return True
    return so_far.rstrip().endswith(_CONTINUES)


def comparison(expression: str) -> Comparison | None:
    """``left == right`` (with its modifiers) when that is the expression's top-level shape."""
    chars = list(_tokens(expression))
    eq = [i for k, (i, c, depth) in enumerate(chars)
          if depth == 0 and c == "=" and k + 1 < len(chars) and chars[k + 1][1] == "=" and chars[k + 1][0] == i + 1
          and (k == 0 or chars[k - 1][1] not in "!=<>:")]
    if len(eq) != 1:
        return None
    at = eq[0]
    withs = [i for i, c, depth in chars
             if depth == 0 and expression.startswith("with ", i) and i > at and (i == 0 or expression[i - 1] in " \t")]
    end = withs[0] if withs else len(expression)
    left, right = expression[:at].strip(), expression[at + 2:end].strip()
    if not left or not right or left.startswith(("not ", "some ", "every ")):
        return None
    return Comparison(left, right, expression[end:].strip())


def modifiers_of(expression: str) -> tuple[str, str]:
    """(the expression without its ``with`` modifiers, the modifiers)."""
    withs = [i for i, c, depth in _tokens(expression)
             if depth == 0 and expression.startswith("with ", i) and i > 0 and expression[i - 1] in " \t"]
    if not withs:
        return expression, ""
    return expression[:withs[0]].strip(), expression[withs[0]:].strip()


def imports_of(source: str) -> list[str]:
    """The module's import lines (a probe module in the same package needs the same names)."""
    return [line.strip() for line in source.split("\n") if line.startswith("import ")]
