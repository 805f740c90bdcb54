"""``engram policy test|check|bundle`` — tooling for policy authors (SPEC §9, §14)."""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
import tarfile
from pathlib import Path
from typing import Any

import engram_core
from engram_core.policy import default_bundle_dir
from engram_core.policy.bundle import Bundle, BundleError, build_engine, package_of, read_bundle
from engram_core.policy.port import DECISION_PATHS
from engram_core.policy.shapes import shape_error

DEFAULT_COVERAGE_FLOOR = 80.0
_TEST_RULE = re.compile(r"^(test_\w+)\b", re.MULTILINE)


def fixtures_dir() -> Path | None:
    """Golden decision fixtures (used by ``check`` as sample inputs); absent from a wheel install."""
    path = Path(engram_core.__file__).resolve().parent.parent / "tests" / "policy" / "fixtures"
    return path if path.is_dir() else None


def register(parser: argparse.ArgumentParser) -> None:
    """Add ``test``, ``check`` and ``bundle`` under the ``policy`` subcommand."""
    sub = parser.add_subparsers(dest="policy_command", required=True)

    t = sub.add_parser("test", help="run the Rego tests (*_test.rego) with coverage")
    t.add_argument("dir", nargs="?", type=Path, default=None, help="bundle directory (default: bundled policies/)")
    t.add_argument("--coverage-floor", type=float, default=DEFAULT_COVERAGE_FLOOR, metavar="PCT",
                   help=f"fail when line coverage of non-test modules is below PCT (default {DEFAULT_COVERAGE_FLOOR:g})")
    t.add_argument("--json", action="store_true", help="print one JSON report instead of text")
    t.set_defaults(func=run_test)

    c = sub.add_parser("check", help="compile the bundle and check every decision's shape")
    c.add_argument("dir", nargs="?", type=Path, default=None, help="bundle directory (default: bundled policies/)")
    c.add_argument("--fixtures", type=Path, default=None, help="golden fixtures directory for sample inputs")
    c.set_defaults(func=run_check)

    b = sub.add_parser("bundle", help="write an OPA bundle tarball (opa run --server --bundle FILE)")
    b.add_argument("dir", nargs="?", type=Path, default=None, help="bundle directory (default: bundled policies/)")
    b.add_argument("--out", type=Path, required=True, help="output .tar.gz")
    b.add_argument("--include-tests", action="store_true", help="also pack *_test.rego")
    b.set_defaults(func=run_bundle)


# --- test ---


def run_tests(bundle: Bundle) -> dict[str, Any]:
    from opa_bindings.engine import OpaError

    """Evaluate every ``test_*`` rule; return results and aggregated coverage."""
    engine = build_engine(bundle, include_tests=True)
    results: list[dict[str, Any]] = []
    covered: dict[str, set[int]] = {}
    not_covered: dict[str, set[int]] = {}
    try:
        for relpath, source in sorted(bundle.test_modules().items()):
            package = package_of(source)
            for rule in dict.fromkeys(_TEST_RULE.findall(source)):
                name = f"data.{package}.{rule}"
                try:
                    value = engine.eval_document(f"{package}.{rule}", coverage=True)
                    passed, error = value is True, None if value is True else f"evaluated to {value!r}"
                except OpaError as exc:
                    passed, error = False, str(exc)
                _merge_coverage(engine.last_coverage, covered, not_covered)
                results.append({"file": relpath, "test": name, "passed": passed, "error": error})
    finally:
        engine.close()
    policy_files = set(bundle.policy_modules())
    per_file = {}
    total_covered = total_lines = 0
    for relpath in sorted(policy_files):
        hit = covered.get(relpath, set())
        lines = hit | not_covered.get(relpath, set())
        total_covered += len(hit)
        total_lines += len(lines)
        per_file[relpath] = round(100.0 * len(hit) / len(lines), 1) if lines else 100.0
    coverage = 100.0 * total_covered / total_lines if total_lines else 100.0
    return {"results": results, "coverage": round(coverage, 1), "files": per_file,
            "passed": sum(r["passed"] for r in results), "failed": sum(not r["passed"] for r in results)}


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


def run_test(args: argparse.Namespace) -> int:
    bundle_dir = args.dir or default_bundle_dir()
    try:
        report = run_tests(read_bundle(bundle_dir))
    except BundleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report["coverage_floor"] = args.coverage_floor
    below = report["coverage"] < args.coverage_floor
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        for r in report["results"]:
            status = "PASS" if r["passed"] else "FAIL"
            print(f"{status} {r['test']}" + (f" ({r['error']})" if r["error"] else ""))
        for relpath, pct in report["files"].items():
            print(f"coverage {relpath}: {pct:.1f}%")
        print(f"{report['passed']} passed, {report['failed']} failed")
        print(f"coverage: {report['coverage']:.1f}% (floor {args.coverage_floor:g}%)")
    return 1 if report["failed"] or below or not report["results"] else 0


# --- check ---


def check_bundle(bundle: Bundle, fixtures: Path | None) -> list[str]:
    from opa_bindings.engine import OpaError

    """Problems found compiling the bundle and evaluating each decision path."""
    problems: list[str] = []
    if "engram" not in bundle.roots:
        problems.append(".manifest roots do not include 'engram'")
    try:
        engine = build_engine(bundle, include_tests=True)  # tests must compile too
        engine.close()
        engine = build_engine(bundle)
    except BundleError as exc:
        return problems + [f"compile: {exc}"]
    samples: dict[str, list[tuple[str, Any]]] = {path: [] for path in DECISION_PATHS}
    for fixture in sorted(fixtures.glob("*/*.json")) if fixtures and fixtures.is_dir() else []:
        case = json.loads(fixture.read_text(encoding="utf-8"))
        samples.setdefault(case["path"], []).append((fixture.name, case["input"]))
    try:
        for path, cases in samples.items():
            # An empty input must still produce a well-formed (denying) answer.
            for label, sample in [("empty input", {}), *cases]:
                try:
                    result = engine.eval_document(path.replace("/", "."), sample)
                except OpaError as exc:
                    problems.append(f"{path} ({label}): {exc}")
                    continue
                problem = shape_error(path, result)
                if problem:
                    problems.append(f"{path} ({label}): {problem}")
    finally:
        engine.close()
    return problems


def run_check(args: argparse.Namespace) -> int:
    bundle_dir = args.dir or default_bundle_dir()
    try:
        bundle = read_bundle(bundle_dir)
    except BundleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    problems = check_bundle(bundle, args.fixtures or fixtures_dir())
    for problem in problems:
        print(f"problem: {problem}")
    print(f"revision {bundle.revision}: {len(problems)} problem(s)")
    return 1 if problems else 0


# --- bundle ---


def write_tarball(bundle: Bundle, out: Path, *, include_tests: bool = False) -> list[str]:
    """Write an OPA bundle tarball; returns the member names."""
    manifest = {"revision": bundle.revision, "roots": list(bundle.roots)}
    members: dict[str, bytes] = {".manifest": json.dumps(manifest, sort_keys=True).encode()}
    modules = bundle.modules if include_tests else bundle.policy_modules()
    for relpath, source in sorted(modules.items()):
        members[relpath] = source.encode("utf-8")
    for data_path in sorted(bundle.root.rglob("data.json")):
        rel = data_path.relative_to(bundle.root)
        if not any(part.startswith(".") for part in rel.parts):
            members[rel.as_posix()] = data_path.read_bytes()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:gz") as tar:
        for name, blob in members.items():
            info = tarfile.TarInfo("/" + name)  # OPA bundle paths are rooted
            info.size = len(blob)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(blob))
    return list(members)


def run_bundle(args: argparse.Namespace) -> int:
    bundle_dir = args.dir or default_bundle_dir()
    try:
        bundle = read_bundle(bundle_dir)
        build_engine(bundle, include_tests=args.include_tests).close()
    except BundleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    members = write_tarball(bundle, args.out, include_tests=args.include_tests)
    print(f"wrote {args.out} (revision {bundle.revision}, {len(members)} files)")
    return 0
