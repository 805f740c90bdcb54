"""``engram policy test``: run the bundle's Rego tests and its golden fixtures, and explain
every failure as the expected and the actual decision object, diffed.

Fast because it compiles once and evaluates many: every selected test in one engine call
(each as ``{v | v := data.<pkg>.<test>}``, empty when the test is undefined) with coverage
recorded once for the lot, every golden fixture in another. Asking OPA for coverage per
test was most of the old 20 s: each coverage report walks every module.

A failing Rego test is taken apart (``rego_source.py``): probe rules compiled into its
package find the first expression that does not hold and, for ``left == right`` (the way
these tests are written: ``actual == expected``), evaluate each side under the same
``with`` modifiers. A body too unusual to take apart is reported as failing without a diff.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import re2

from engram_core.policy.bundle import Bundle, BundleError, build_engine, package_of
from engram_core.policy.rego_source import TestRule, comparison, imports_of, modifiers_of, test_rules

UNDEFINED = "<undefined>"
_PROBE_FILE = "__engram_probes__/{}"


@dataclass
class Failure:
    """Why a test failed: the expression, and for a comparison both sides' values."""

    expression: str = ""
    index: int = 0  # 1-based, of ``count``
    count: int = 0
    expected: Any = UNDEFINED
    actual: Any = UNDEFINED
    compared: bool = False  # expected/actual are the two sides of a comparison (or a fixture)
    note: str = ""

    def diff(self) -> list[str]:
        if not self.compared:
            return []
        return list(difflib.unified_diff(_pretty(self.expected), _pretty(self.actual), "expected", "actual",
                                         lineterm="", n=3))

    def as_dict(self) -> dict[str, Any]:
        return {"expression": self.expression, "index": self.index, "count": self.count,
                "expected": self.expected, "actual": self.actual, "diff": self.diff(), "note": self.note}


@dataclass
class Result:
    name: str  # data.<package>.<rule>, or golden:<fixture path>
    file: str
    line: int
    kind: str  # rego | golden
    passed: bool = False
    error: str | None = None
    failure: Failure | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"test": self.name, "file": self.file, "line": self.line, "kind": self.kind,
                               "passed": self.passed, "error": self.error}
        if self.failure is not None:
            out["failure"] = self.failure.as_dict()
        return out


@dataclass
class _Case:
    result: Result
    package: str
    rule: TestRule | None
    source: str


@dataclass
class Report:
    results: list[Result] = field(default_factory=list)
    coverage: float = 100.0
    files: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def failed(self) -> int:
        return sum(not r.passed for r in self.results)

    def as_dict(self) -> dict[str, Any]:
        return {"results": [r.as_dict() for r in self.results], "coverage": self.coverage, "files": self.files,
                "passed": self.passed, "failed": self.failed}


def _pretty(value: Any) -> list[str]:
    if value == UNDEFINED:
        return [UNDEFINED]
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False).split("\n")


def select(pattern: str | None):
    """A predicate over test names and files (``--run``, an RE2 pattern like ``opa test --run``)."""
    if not pattern:
        return lambda *_: True
    try:
        compiled = re2.compile(pattern)
    except re2.error as exc:
        raise ValueError(f"--run: not a valid pattern: {exc}") from None
    return lambda *names: any(compiled.search(n) for n in names)


def run(bundle: Bundle, *, pattern: str | None = None, fixtures: Sequence[Path] = ()) -> Report:
    """Evaluate the selected ``test_*`` rules and golden fixtures of ``bundle``."""
    wanted = select(pattern)
    cases = _rego_cases(bundle, wanted)
    goldens = [(f, c) for f, c in _fixture_cases(fixtures) if wanted(_golden_name(f), _shown(f))]
    engine = build_engine(bundle, include_tests=True)
    report = Report()
    try:
        covered, not_covered = _run_rego(engine, cases)
        _run_golden(engine, goldens, report)
    finally:
        engine.close()
    failing = [c for c in cases if not c.result.passed and c.rule is not None]
    if failing:
        _explain(bundle, failing)
    report.results[:0] = [c.result for c in cases]
    _coverage(bundle, covered, not_covered, report)
    return report


# --- Rego tests ---


def _rego_cases(bundle: Bundle, wanted) -> list[_Case]:
    cases: list[_Case] = []
    for relpath, source in sorted(bundle.test_modules().items()):
        package = package_of(source) or ""
        seen: set[str] = set()
        for rule in test_rules(source):
            if rule.name in seen:  # a test defined twice is one rule; the first definition explains it
                continue
            seen.add(rule.name)
            name = f"data.{package}.{rule.name}"
            if wanted(name, relpath):
                cases.append(_Case(Result(name, relpath, rule.line, "rego"), package, rule, source))
        for rule_name in _bodiless_tests(source, seen):
            name = f"data.{package}.{rule_name}"
            if wanted(name, relpath):
                cases.append(_Case(Result(name, relpath, 0, "rego"), package, None, source))
    return cases


def _bodiless_tests(source: str, seen: set[str]) -> list[str]:
    """Tests defined without a body on their header line (``test_x := true``)."""
    names = []
    for line in source.split("\n"):
        if line.startswith("test_"):
            name = line.split()[0].split("(")[0]
            if name not in seen and name not in names:
                names.append(name)
    return names


def _run_rego(engine: Any, cases: list[_Case]) -> tuple[dict[str, set[int]], dict[str, set[int]]]:
    """All tests in one evaluation with coverage; a test that errors is found by asking each alone."""
    from opa_bindings.engine import OpaError

    covered: dict[str, set[int]] = {}
    not_covered: dict[str, set[int]] = {}
    pending = list(cases)
    for _ in range(2):  # the second pass runs without the tests that raised errors
        if not pending:
            break
        try:
            bindings = engine.eval_query(_suite_query(pending), coverage=True)
        except OpaError:
            _find_errors(engine, pending)
            pending = [c for c in pending if c.result.error is None]
            continue
        _merge_coverage(engine.last_coverage, covered, not_covered)
        values = bindings[0] if bindings else {}
        for i, c in enumerate(pending):
            got = values.get(f"t{i}") or []
            c.result.passed = got == [True]
            if not c.result.passed:
                c.result.error = "undefined" if not got else f"evaluated to {got[0]!r}"
        break
    return covered, not_covered


def _suite_query(cases: list[_Case]) -> str:
    return "; ".join(f"t{i} := {{v | v := data.{c.package}.{c.result.name.rsplit('.', 1)[1]}}}"
                     for i, c in enumerate(cases))


def _find_errors(engine: Any, cases: list[_Case]) -> None:
    """Set the error of each test whose evaluation raises. By halves: a half that evaluates
    holds none, so one bad test among n costs about 2·log2(n) evaluations instead of n (each new
    query is a compile); a test alone is evaluated as its own document, as before."""
    from opa_bindings.engine import OpaError

    if len(cases) == 1:
        c = cases[0]
        try:
            engine.eval_document(f"{c.package}.{c.result.name.rsplit('.', 1)[1]}")
        except OpaError as exc:
            if exc.code != "undefined":
                c.result.error = str(exc)
        return
    try:
        engine.eval_query(_suite_query(cases))
        return
    except OpaError:
        pass
    half = len(cases) // 2
    _find_errors(engine, cases[:half])
    _find_errors(engine, cases[half:])


def _explain(bundle: Bundle, failing: list[_Case]) -> None:
    """Compile probes beside the failing tests and read which expression failed and why: one
    compile and one evaluation for all of them (each new query costs the engine a compile)."""
    probes: dict[str, list[str]] = {}
    plans: dict[int, list[tuple[int, str, str]]] = {}  # case -> [(expression index, kind, rule)]
    for n, case in enumerate(failing):
        assert case.rule is not None
        rules, plan = _probe_rules(n, case.rule)
        plans[n] = plan
        probes.setdefault(case.result.file, [f"package {case.package}", *imports_of(case.source), ""]).extend(rules)
    modules = {_PROBE_FILE.format(f): "\n".join(lines) + "\n" for f, lines in probes.items()}
    try:
        engine = build_engine(bundle, include_tests=True, extra_modules=modules)
    except BundleError:
        # Some body could not be taken apart: explain each test with probes of its own.
        for n, case in enumerate(failing):
            rules, _ = _probe_rules(n, case.rule)  # type: ignore[arg-type]
            module = "\n".join([f"package {case.package}", *imports_of(case.source), "", *rules]) + "\n"
            try:
                own = build_engine(bundle, include_tests=True, extra_modules={_PROBE_FILE.format("one"): module})
            except BundleError:
                case.result.failure = Failure(note="the test body could not be taken apart; run it with opa test -v")
                continue
            try:
                case.result.failure = _read_probes(_probe_values(own, [(case, plans[n])]), case, plans[n])
            finally:
                own.close()
        return
    try:
        values = _probe_values(engine, [(case, plans[n]) for n, case in enumerate(failing)])
        for n, case in enumerate(failing):
            case.result.failure = _read_probes(values, case, plans[n])
    finally:
        engine.close()


def _probe_values(engine: Any, work: list[tuple[_Case, list[tuple[int, str, str]]]]) -> dict[str, Any]:
    """Every probe's value (UNDEFINED, or an error text) by rule name, in one evaluation when
    none raises, else one by one."""
    from opa_bindings.engine import OpaError

    refs = [(rule, f"data.{case.package}.{rule}") for case, plan in work for _, _, rule in plan]
    query = "; ".join(f"v{i} := {{x | x := {ref}}}" for i, (_, ref) in enumerate(refs))
    try:
        row = (engine.eval_query(query) or [{}])[0]
        return {rule: (row.get(f"v{i}") or [UNDEFINED])[0] for i, (rule, _) in enumerate(refs)}
    except OpaError:
        values = {}
        for rule, ref in refs:
            try:
                values[rule] = engine.eval_document(ref.removeprefix("data."))
            except OpaError as exc:
                values[rule] = UNDEFINED if exc.code == "undefined" else f"<error: {exc.message}>"
        return values


def _probe_rules(n: int, rule: TestRule) -> tuple[list[str], list[tuple[int, str, str]]]:
    """Rules ``p<n>_ok_<k>`` (the first k expressions hold), and for each comparison
    ``p<n>_left_<k>``/``p<n>_right_<k>`` (each side's value after the k-1 before it)."""
    rules: list[str] = []
    plan: list[tuple[int, str, str]] = []
    exprs = rule.expressions
    for k, expression in enumerate(exprs, start=1):
        prefix = "\n\t".join(exprs[:k - 1])
        ok = f"engram_probe_{n}_ok_{k}"
        rules.append(f"{ok} if {{\n\t{chr(10).join(exprs[:k])}\n}}")
        plan.append((k, "ok", ok))
        cmp = comparison(expression)
        if cmp is not None:
            for side, term in (("left", cmp.left), ("right", cmp.right)):
                name = f"engram_probe_{n}_{side}_{k}"
                rules.append(f"{name} := engram_probe_value if {{\n\t{prefix}\n\tengram_probe_value := ({term}) "
                             f"{cmp.modifiers}\n}}")
                plan.append((k, side, name))
        else:
            core, mods = modifiers_of(expression)
            if not core.startswith(("not ", "some ", "every ")) and ":=" not in core and " = " not in core:
                name = f"engram_probe_{n}_value_{k}"
                rules.append(f"{name} := engram_probe_value if {{\n\t{prefix}\n\tengram_probe_value := ({core}) {mods}\n}}")
                plan.append((k, "value", name))
    return rules, plan


def _read_probes(values: dict[str, Any], case: _Case, plan: list[tuple[int, str, str]]) -> Failure:
    exprs = case.rule.expressions if case.rule else ()
    failed_at = next((k for k, kind, rule in plan if kind == "ok" and values.get(rule) is not True), 0)
    if not failed_at:
        return Failure(count=len(exprs), note="every expression holds on its own; the test is undefined as a "
                                               "whole (a conflict, or a rule defined twice)")
    failure = Failure(expression=" ".join(exprs[failed_at - 1].split()), index=failed_at, count=len(exprs))
    sides = {kind: rule for k, kind, rule in plan if k == failed_at and kind != "ok"}
    if "left" in sides:
        failure.actual, failure.expected, failure.compared = values[sides["left"]], values[sides["right"]], True
    elif "value" in sides:
        failure.actual = values[sides["value"]]
        failure.note = "the expression is false or undefined"
    return failure


# --- golden fixtures ---


def _fixture_cases(fixtures: Sequence[Path]) -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for root in fixtures:
        files = [root] if root.is_file() else sorted(root.glob("*/*.json")) if root.is_dir() else []
        for path in files:
            try:
                case = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise BundleError(f"golden fixture unreadable: {exc}", file=str(path)) from exc
            if not isinstance(case, dict) or not {"path", "input", "expected"} <= set(case):
                raise BundleError("golden fixture needs path, input and expected", file=str(path))
            out.append((path, case))
    return out


def _run_golden(engine: Any, goldens: list[tuple[Path, dict[str, Any]]], report: Report) -> None:
    from opa_bindings.engine import OpaError

    if not goldens:
        return
    # Each input is bound outside its comprehension: inside it, ``with input as input[i]``
    # would read ``input`` after the replacement.
    query = "; ".join(f"in{i} := input[{i}]; g{i} := {{v | v := data.{c['path'].strip('/').replace('/', '.')} "
                      f"with input as in{i}}}" for i, (_, c) in enumerate(goldens))
    try:
        values = (engine.eval_query(query, [c["input"] for _, c in goldens]) or [{}])[0]
    except OpaError:
        values = {}
        for i, (_, c) in enumerate(goldens):
            try:
                values[f"g{i}"] = [engine.eval_document(c["path"].strip("/").replace("/", "."), c["input"])]
            except OpaError as exc:
                values[f"g{i}"] = [] if exc.code == "undefined" else [f"<error: {exc.message}>"]
    for i, (path, c) in enumerate(goldens):
        got = values.get(f"g{i}") or []
        actual = got[0] if got else UNDEFINED
        result = Result(_golden_name(path), _shown(path), 0, "golden", passed=actual == c["expected"])
        if not result.passed:
            result.error = "undefined" if actual == UNDEFINED else "decision differs"
            result.failure = Failure(expression=f"data.{c['path'].strip('/').replace('/', '.')} with input as <fixture>",
                                     index=1, count=1, expected=c["expected"], actual=actual, compared=True)
        report.results.append(result)


def _golden_name(path: Path) -> str:
    return f"golden:{path.parent.name}/{path.name}"


def _shown(path: Path) -> str:
    """A fixture's path as the author typed it: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


# --- coverage ---


def _lines(ranges: list[dict[str, Any]] | None) -> set[int]:
    out: set[int] = set()
    for r in ranges or []:
        out.update(range(r["start"]["row"], r["end"]["row"] + 1))
    return out


def _merge_coverage(report: dict[str, Any] | None, covered: dict[str, set[int]],
                    not_covered: dict[str, set[int]]) -> None:
    for relpath, entry in ((report or {}).get("files") or {}).items():
        covered.setdefault(relpath, set()).update(_lines(entry.get("covered")))
        not_covered.setdefault(relpath, set()).update(_lines(entry.get("not_covered")))
    for relpath, hit in covered.items():
        not_covered.get(relpath, set()).difference_update(hit)


def _coverage(bundle: Bundle, covered: dict[str, set[int]], not_covered: dict[str, set[int]],
              report: Report) -> None:
    """Line coverage of the non-test modules, as the union over all test evaluations."""
    total_covered = total_lines = 0
    for relpath in sorted(bundle.policy_modules()):
        hit = covered.get(relpath, set())
        lines = hit | not_covered.get(relpath, set())
        total_covered += len(hit)
        total_lines += len(lines)
        report.files[relpath] = round(100.0 * len(hit) / len(lines), 1) if lines else 100.0
    report.coverage = round(100.0 * total_covered / total_lines, 1) if total_lines else 100.0
