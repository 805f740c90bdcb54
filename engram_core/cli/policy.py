"""``engram policy test|check|bundle|sign|replay`` — tooling for policy authors (SPEC §9, §14).

The work lives in ``engram_core/policy/`` (``testing.py``, ``signing.py``, ``replay.py``);
this module parses flags and prints."""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import engram_core
from engram_core.policy import default_bundle_dir
from engram_core.policy.bundle import SIGNATURES, Bundle, BundleError, build_engine, read_bundle
from engram_core.policy.port import DECISION_PATHS, LOG_MASK, LOG_PATH_MASK
from engram_core.policy.shapes import shape_error

DEFAULT_COVERAGE_FLOOR = 80.0


def fixtures_dir() -> Path | None:
    """Golden decision fixtures (``test`` runs them, ``check`` uses them as sample inputs);
    absent from a wheel install."""
    path = Path(engram_core.__file__).resolve().parent.parent / "tests" / "policy" / "fixtures"
    return path if path.is_dir() else None


def register(parser: argparse.ArgumentParser) -> None:
    """Add ``test``, ``check``, ``bundle``, ``sign`` and ``replay`` under the ``policy`` subcommand."""
    sub = parser.add_subparsers(dest="policy_command", required=True)

    t = sub.add_parser("test", help="run the Rego tests (*_test.rego) and golden fixtures, with coverage")
    t.add_argument("dir", nargs="?", type=Path, default=None, help="bundle directory (default: bundled policies/)")
    t.add_argument("--run", default=None, metavar="PATTERN",
                   help="only tests whose name (data.<pkg>.<rule>, golden:<family>/<file>) or file matches "
                        "this regular expression (RE2)")
    t.add_argument("--fixtures", type=Path, action="append", default=None, metavar="DIR",
                   help="golden fixtures ({path, input, expected} in DIR/<family>/*.json; repeatable; "
                        "default: the source tree's tests/policy/fixtures)")
    t.add_argument("--no-fixtures", action="store_true", help="run the Rego tests only")
    t.add_argument("--coverage-floor", type=float, default=DEFAULT_COVERAGE_FLOOR, metavar="PCT",
                   help=f"fail when line coverage of non-test modules is below PCT (default {DEFAULT_COVERAGE_FLOOR:g}; "
                        "not enforced with --run)")
    t.add_argument("-v", "--verbose", action="store_true", help="also list the tests that passed")
    t.add_argument("--json", action="store_true", help="print one JSON report instead of text")
    t.set_defaults(func=run_test)

    c = sub.add_parser("check", help="compile the bundle and check every decision's shape")
    c.add_argument("dir", nargs="?", type=Path, default=None, help="bundle directory or archive (default: bundled policies/)")
    c.add_argument("--fixtures", type=Path, default=None, help="golden fixtures directory for sample inputs")
    c.add_argument("--verification-key", type=Path, default=None, metavar="PEM_FILE",
                   help="also verify the bundle's .signatures.json with this public key")
    c.set_defaults(func=run_check)

    b = sub.add_parser("bundle", help="write an OPA bundle tarball (opa run --server --bundle FILE), optionally signed")
    b.add_argument("dir", nargs="?", type=Path, default=None, help="bundle directory (default: bundled policies/)")
    b.add_argument("--out", type=Path, required=True, help="output .tar.gz")
    b.add_argument("--include-tests", action="store_true", help="also pack *_test.rego")
    _signing_flags(b, "--sign")
    b.set_defaults(func=run_bundle)

    s = sub.add_parser("sign", help="write DIR/.signatures.json (OPA's bundle signature format)")
    s.add_argument("dir", nargs="?", type=Path, default=None, help="bundle directory (default: bundled policies/)")
    _signing_flags(s, "--signing-key", required=True)
    s.set_defaults(func=run_sign)

    r = sub.add_parser("replay", help="re-evaluate logged decisions under a candidate bundle and report what changes")
    r.add_argument("--bundle", type=Path, required=True, metavar="DIR", help="candidate bundle directory or archive")
    r.add_argument("--log", type=Path, action="append", required=True, metavar="FILE",
                   help="decision log (JSON lines or a JSON array, optionally gzipped; repeatable)")
    r.add_argument("--since", default=None, metavar="T",
                   help="only decisions at or after T: an instant (2026-12-01T00:00:00Z) or an age (24h, 90m, 7d)")
    r.add_argument("--until", default=None, metavar="T", help="only decisions before T (same forms)")
    r.add_argument("--path", action="append", default=None, metavar="PATH",
                   help="only this decision path (repeatable; default: every path in the log)")
    r.add_argument("--pseudonym-key", type=Path, action="append", default=[], metavar="FILE",
                   help="the decision-log key(s) the logs were masked with (DATA_DIR/decision-log.key): "
                        "pseudonymized names the candidate bundle mentions are restored before evaluation")
    r.add_argument("--names", type=Path, default=None, metavar="FILE",
                   help="names to restore besides those the bundle mentions (one a line: your tenants)")
    r.add_argument("--examples", type=int, default=3, metavar="N", help="examples per change (default: %(default)s)")
    r.add_argument("--json", action="store_true", help="print the report as JSON (for CI)")
    r.add_argument("--fail-on-change", action="store_true", help="exit 1 when any decision would change")
    r.set_defaults(func=run_replay)


def _signing_flags(p: argparse.ArgumentParser, flag: str, *, required: bool = False) -> None:
    p.add_argument(flag, dest="signing_key", type=Path, required=required, default=None, metavar="KEY",
                   help="sign with this PEM private key (RSA: RS256, ECDSA P-256: ES256, ...; Ed25519: EdDSA)")
    p.add_argument("--signing-alg", default=None, help="JWS algorithm (default: the key's first: RS256, ES256, EdDSA)")
    p.add_argument("--key-id", default="default", help="the JWT's kid (default: %(default)s, as OPA)")


def _read(dir_: Path | None) -> Bundle:
    return read_bundle(dir_ or default_bundle_dir())


# --- test ---


def run_test(args: argparse.Namespace) -> int:
    from engram_core.policy import testing

    started = time.monotonic()
    fixtures = [] if args.no_fixtures else (args.fixtures or ([fixtures_dir()] if fixtures_dir() else []))
    try:
        report = testing.run(_read(args.dir), pattern=args.run, fixtures=[f for f in fixtures if f])
    except (BundleError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    enforced = not args.run
    below = enforced and report.coverage < args.coverage_floor
    seconds = time.monotonic() - started
    if args.json:
        doc = report.as_dict()
        doc.update(coverage_floor=args.coverage_floor, coverage_enforced=enforced, seconds=round(seconds, 2))
        print(json.dumps(doc, indent=2, sort_keys=True, default=str))
    else:
        for r in report.results:
            if r.passed and args.verbose:
                print(f"PASS {r.name}")
            elif not r.passed:
                _print_failure(r)
        if not args.run:
            for relpath, pct in report.files.items():
                print(f"coverage {relpath}: {pct:.1f}%")
        print(f"{report.passed} passed, {report.failed} failed")
        floor = f"floor {args.coverage_floor:g}%" if enforced else "floor not enforced with --run"
        print(f"coverage: {report.coverage:.1f}% ({floor})")
        print(f"ran {len(report.results)} tests in {seconds:.1f}s")
    return 1 if report.failed or below or not report.results else 0


def _print_failure(r: Any) -> None:
    where = f" ({r.file}:{r.line})" if r.line else f" ({r.file})"
    print(f"FAIL {r.name}{where}")
    f = r.failure
    if f is None:
        print(f"    {r.error}")
        return
    if f.expression:
        print(f"    expression {f.index} of {f.count}: {_short(f.expression)}")
    if f.note:
        print(f"    {f.note}")
    diff = f.diff()
    if diff:
        for line in diff:
            print(f"    {line}")
    elif not f.compared and f.actual != "<undefined>" and f.expression:
        print(f"    value: {json.dumps(f.actual, sort_keys=True, default=str)[:400]}")
    elif r.error and r.error not in ("undefined", "decision differs"):
        print(f"    {r.error}")


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


# --- check ---


def check_bundle(bundle: Bundle, fixtures: Path | None) -> list[str]:
    """Problems found compiling the bundle and evaluating each decision path, and the
    decision-log masks (path_mask for every path, mask on every sample) when it has them."""
    from opa_bindings.engine import OpaError

    from engram_core.policy.decisionlog.mask import MaskError, parse_operations

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
    masks = {name: "data." + ref.replace("/", ".") for name, ref in (("path", LOG_PATH_MASK), ("event", LOG_MASK))}

    def ask(name: str, argument: str, input: Any) -> Any:
        rows = engine.eval_query(f"m := [x | x := {masks[name]}({argument})]", input)
        return rows[0]["m"][0] if rows and rows[0]["m"] else None

    def defined(name: str) -> bool:
        try:
            ask(name, "{}" if name == "event" else '""', None)
        except OpaError as exc:
            return "undefined function" not in exc.message
        return True

    try:
        has = {name: defined(name) for name in masks}
        for path, cases in samples.items():
            if has["path"]:
                try:
                    parse_operations(ask("path", "input.path", {"path": path}) or [])
                except (OpaError, MaskError) as exc:
                    problems.append(f"{LOG_PATH_MASK} ({path}): {exc}")
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
                elif has["event"]:
                    try:
                        parse_operations(ask("event", "input", {"path": path, "input": sample, "result": result}) or [])
                    except (OpaError, MaskError) as exc:
                        problems.append(f"{LOG_MASK} ({path}, {label}): {exc}")
        if not (has["path"] or has["event"]):
            problems.append(f"no decision-log mask ({LOG_PATH_MASK} or {LOG_MASK}): with --decision-log every "
                            "event would be dropped")
    finally:
        engine.close()
    return problems


def run_check(args: argparse.Namespace) -> int:
    try:
        bundle = _read(args.dir)
        if args.verification_key is not None:
            from engram_core.policy.signing import BundleVerifier

            BundleVerifier.from_pem_file(str(args.verification_key)).verify(bundle.files, bundle.signatures)
            print(f"signature: verified with {args.verification_key} ({len(bundle.files)} files)")
    except (BundleError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    problems = check_bundle(bundle, args.fixtures or fixtures_dir())
    for problem in problems:
        print(f"problem: {problem}")
    print(f"revision {bundle.revision}: {len(problems)} problem(s)")
    return 1 if problems else 0


# --- bundle and sign ---


def tarball_members(bundle: Bundle, *, include_tests: bool = False) -> dict[str, bytes]:
    """What an archive of ``bundle`` holds: ``.manifest``, the modules (tests only if asked)
    and every ``data.json``, as the files are on disk."""
    return {rel: blob for rel, blob in sorted(bundle.files.items())
            if include_tests or not rel.endswith("_test.rego")}


def write_tarball(bundle: Bundle, out: Path, *, include_tests: bool = False,
                  signatures: bytes | None = None) -> list[str]:
    """Write an OPA bundle tarball (with ``.signatures.json`` when given); returns the member names."""
    members = tarball_members(bundle, include_tests=include_tests)
    if signatures is not None:
        members[SIGNATURES] = signatures
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:gz") as tar:
        for name, blob in members.items():
            info = tarfile.TarInfo("/" + name)  # OPA bundle paths are rooted
            info.size = len(blob)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(blob))
    return list(members)


def _signatures(args: argparse.Namespace, files: dict[str, bytes]) -> bytes:
    from engram_core.policy.signing import load_signing_key, sign_files

    try:
        key = load_signing_key(args.signing_key.read_bytes())
    except OSError as exc:
        raise ValueError(f"cannot read the signing key {args.signing_key} ({exc.strerror})") from None
    return sign_files(files, key, key_id=args.key_id, algorithm=args.signing_alg)


def run_bundle(args: argparse.Namespace) -> int:
    try:
        bundle = _read(args.dir)
        build_engine(bundle, include_tests=args.include_tests).close()
        signatures = None
        if args.signing_key is not None:
            signatures = _signatures(args, tarball_members(bundle, include_tests=args.include_tests))
    except (BundleError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    members = write_tarball(bundle, args.out, include_tests=args.include_tests, signatures=signatures)
    # Counted as `check` and `sign` count: the bundle's own files, not .signatures.json beside them.
    files = len(members) - (1 if signatures else 0)
    tests = "tests included" if args.include_tests else "tests left out"
    signed = (f"; {files} files signed with {args.signing_key.name} (kid {args.key_id}) in .signatures.json"
              if signatures else "")
    print(f"wrote {args.out} (revision {bundle.revision}, {files} files, {tests}{signed})")
    return 0


def run_sign(args: argparse.Namespace) -> int:
    bundle_dir = args.dir or default_bundle_dir()
    try:
        bundle = read_bundle(bundle_dir)
        if not Path(bundle_dir).is_dir():
            raise ValueError("sign writes DIR/.signatures.json: give a bundle directory (for an archive, use "
                             "engram policy bundle --sign)")
        build_engine(bundle, include_tests=True).close()
        signatures = _signatures(args, dict(bundle.files))
    except (BundleError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    (Path(bundle_dir) / SIGNATURES).write_bytes(signatures)
    print(f"wrote {Path(bundle_dir) / SIGNATURES} (revision {bundle.revision}, {len(bundle.files)} files signed, "
          f"tests included: a directory bundle is signed as it is on disk; kid {args.key_id})")
    return 0


# --- replay ---


def run_replay(args: argparse.Namespace) -> int:
    from engram_core.policy import replay

    try:
        report = replay.replay(args.bundle, args.log, since=args.since, until=args.until, paths=args.path,
                               keys=args.pseudonym_key, names_file=args.names, examples=args.examples)
    except (BundleError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False))
    else:
        print(replay.render(report))
    return 1 if args.fail_on_change and report["totals"]["changed"] else 0
