"""The scanner's byte-method locators and the numpy search for the AWS assignment rule find
exactly what the RE2 calls they replaced found (issue 57.8: those calls ran on RE2's NFA and
cost 55-400 ms per MiB). Each property compares the new path with the old algorithm, kept
here as the reference: ``slot.fullmatch`` with capturing groups, ``regex.finditer``."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engram_core.secret_scan import scan as secrets_scan
from engram_core.secret_scan import spans as secret_spans
from engram_core.secret_scan.scan import MAX_COUNT, SLOT_BUDGET, normalize, scan
from engram_core.secret_scan.slots import holds_no_secret

_BY_RULE = {c.rule.rule: c for c in secrets_scan._COMPILED}
_SLOT_RULES = [r for r, c in _BY_RULE.items() if c.slot is not None]
_AWS = _BY_RULE["aws-secret-access-key-assignment"]

# Pieces that the slot patterns and the AWS pattern are made of, and their near misses.
_PIECES = [
    "password", "PassWord", "passwd", "passphrase", "pass", "_pwd", "pwd", "api_key", "secret", "Secret_Key",
    "token", "_token", "access-token", "DB_PASSWORD", "MY_SECRET", "SECRETS_X", "export ", "TOKEN", "aws", "AWS",
    "key", "KEY", "sEcReT", "curl", "curl ", " -u ", " -su", "--user=", " --proxy-user ", "postgres://",
    "redis://", "://", "@tcp(", "@unix(", "@/", "@", "=", "==", "=>", ":=", ":", "::", "'", '"', "]", "[", " ",
    "  ", "\t", "\n", "\r", "\v", "\f", "(", ")", ";", ",", "#", ">", "/", ".", "-", "_", "+", "~", "$", "*",
    "x", "X", "a", "Q", "0", "7", "hunter2hunter2", "changeme", "${DB_PASSWORD}", "<redacted>", "settings.DB_PASSWORD",
    "Ed25519PrivateKey", "credential_ref", "abcdefghijklmnop", "AKIAABCDEFGHIJKLMNOP", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "A" * 40, "a1/+" * 10, "é", "\u0440", "\ufb01", "\uff50",
]
_texts = st.lists(st.sampled_from(_PIECES), min_size=1, max_size=60).map("".join)
_PROPERTY = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _reference_content(compiled: secrets_scan._Compiled, match: bytes) -> tuple[int, bytes] | None:
    """The old algorithm: the slot pattern with groups, fullmatched on the match."""
    assert compiled.slot is not None
    parts = compiled.slot.fullmatch(match)
    index = next((i for i in range(1, compiled.slot.groups + 1) if parts.span(i)[0] >= 0), 0) if parts else 0
    return (index, parts.group(index)) if index and parts else None


def _reference_count(compiled: secrets_scan._Compiled, data: bytes) -> int:
    """The old ``_count`` and ``_count_slots``: RE2's unanchored search, contents by fullmatch."""
    if compiled.slot is None:
        return sum(1 for _ in itertools.islice(compiled.regex.finditer(data), MAX_COUNT))
    assert compiled.rule.slot is not None
    found = 0
    for judged, match in enumerate(compiled.regex.finditer(data)):
        if judged == SLOT_BUDGET:
            return max(found, 1)
        content = _reference_content(compiled, match.group())
        if content is None or not holds_no_secret(content[1], bare=content[0] == compiled.rule.slot.bare_group,
                                                  code=compiled.rule.slot.code):
            found += 1
            if found == MAX_COUNT:
                break
    return found


def _reference_scan(texts: list[str]) -> list[dict[str, int | str]]:
    data = b"\n".join(normalize(t) for t in texts)
    if not data:
        return []
    present = secrets_scan._keywords_present(data.lower())
    counts: Counter[secrets_scan.Rule] = Counter()
    for compiled in secrets_scan._COMPILED:
        if compiled.keywords and present is not None and present.isdisjoint(compiled.keywords):
            continue
        n = _reference_count(compiled, data)
        if n:
            counts[compiled.rule] += n
    bare = secrets_scan._bare_aws_secret_keys(data)
    if bare:
        counts[secrets_scan._BARE_AWS] += bare
    return [{"kind": r.kind, "rule": r.rule, "count": counts[r]}
            for r in sorted(counts, key=lambda r: (r.kind, r.rule))]


def test_every_slot_rule_has_a_locator_derived_from_its_pattern() -> None:
    for rule in _SLOT_RULES:
        assert _BY_RULE[rule].locate is not None, rule
    assert _AWS.spans is not None and _BY_RULE["private-key"].spans is not None


def test_a_changed_pattern_gets_no_locator() -> None:
    """A locator is exact only for the pattern it was derived from: another falls back to RE2."""
    rule = _BY_RULE["password-assignment"].rule
    assert rule.slot is not None
    assert secret_spans.locator(rule.rule, rule.slot.pattern) is not None
    assert secret_spans.locator(rule.rule, rule.slot.pattern.replace("{6,}", "{5,}")) is None


@pytest.mark.parametrize("rule", _SLOT_RULES)
@_PROPERTY
@given(text=_texts)
def test_a_locator_finds_the_group_fullmatch_finds(rule: str, text: str) -> None:
    compiled = _BY_RULE[rule]
    assert compiled.locate is not None
    for match in compiled.regex.finditer(normalize(text)):
        assert compiled.locate(match.group()) == _reference_content(compiled, match.group()), match.group()


def _anchored_starts(regex: secrets_scan.re2._Regexp, data: bytes) -> list[int]:
    return [i for i in range(len(data)) if regex._regexp.Match(secrets_scan.re2._Anchor.ANCHOR_START, data, i,
                                                                 len(data))[0][0] >= 0]


def _check_spans(compiled: secrets_scan._Compiled, starts: object, data: bytes) -> None:
    """The numpy starts are exactly where RE2 matches anchored; both ways to the spans (numpy
    starts, or every occurrence of the first word tried) give ``finditer``'s."""
    expected = [m.span() for m in compiled.regex.finditer(data)]
    assert compiled.spans is not None
    assert list(compiled.spans(compiled.regex, data, 10**9)) == expected
    numpy_starts = starts(data)  # type: ignore[operator]
    assert numpy_starts.tolist() == _anchored_starts(compiled.regex, data)
    assert list(secret_spans.anchored_spans(compiled.regex, data, numpy_starts, 10**9)) == expected


@_PROPERTY
@given(text=_texts)
def test_the_aws_assignment_spans_are_re2s(text: str) -> None:
    _check_spans(_AWS, secret_spans.aws_secret_starts, normalize(text))


_PEM = ["-----BEGIN", "-----BEGIN ", "-----", "----", "PRIVATE KEY", "PRIVATE KEY-----", " BLOCK-----", " BLOCK",
        "RSA ", "OPENSSH ", "ENCRYPTED ", "PRIVATE", " KEY", "A", "z", "0", "_", "-", " ", "\t", "\n", "x" * 90, "Y" * 101]


@_PROPERTY
@given(text=st.lists(st.sampled_from(_PEM), min_size=1, max_size=40).map("".join))
def test_the_private_key_spans_are_re2s(text: str) -> None:
    _check_spans(_BY_RULE["private-key"], secret_spans.private_key_starts, normalize(text))


@pytest.mark.parametrize(("rule", "unit"), [("aws-secret-access-key-assignment", "aws key:"),
                                            ("private-key", "-----BEGIN ")])
def test_past_the_candidate_limit_the_numpy_starts_give_re2s_spans(rule: str, unit: str) -> None:
    """More first words than ``_CANDIDATES_PER_BYTE`` allows: the numpy pass finds the starts."""
    compiled = _BY_RULE[rule]
    data = (unit * 3000 + "A" * 40 + " PRIVATE KEY-----" + unit * 100 + "B" * 40).encode()
    assert secret_spans._occurrences(data.lower(), unit.lower().split()[0].encode()) is None
    expected = [m.span() for m in compiled.regex.finditer(data)]
    assert expected and compiled.spans is not None
    assert list(compiled.spans(compiled.regex, data, 10**9)) == expected


@_PROPERTY
@given(texts=st.lists(_texts, min_size=1, max_size=3))
def test_scan_finds_what_the_old_algorithm_found(texts: list[str]) -> None:
    assert scan(texts) == _reference_scan(texts)


@pytest.mark.parametrize("value", ["a" * 5000, "*" * 5000, "${" + "A" * 5000 + "}", "x" * 70000 + ";",
                                   "settings." + "a" * 5000, "ab" * 3000 + ")"])
@pytest.mark.parametrize("shape", ['password: "{v}"', "password = {v}", "password=>{v}", "api_key := '{v}'",
                                   "DB_TOKEN = {v}", "export MY_SECRET='{v}'", "curl -u user:{v}",
                                   "postgres://user:{v}@db", "user:{v}@tcp(db:3306)/x"])
def test_long_values_past_re2s_bit_state_limit_are_located_as_fullmatch_does(shape: str, value: str) -> None:
    """Past a few KiB RE2 runs a fullmatch with groups on its NFA: the case the locators are for."""
    data = normalize(shape.format(v=value))
    for rule in _SLOT_RULES:
        compiled = _BY_RULE[rule]
        assert compiled.locate is not None
        for match in compiled.regex.finditer(data):
            assert compiled.locate(match.group()) == _reference_content(compiled, match.group()), (rule, shape)
    assert scan([shape.format(v=value)]) == _reference_scan([shape.format(v=value)])


@pytest.mark.parametrize("text", [
    "aws secret: " + "A" * 40, "AWS_SECRET_KEY = '" + "a1/+" * 10 + "'", "aws" + "x" * 20 + "key:" + "B" * 40,
    "aws" + "x" * 21 + "key:" + "B" * 40, "aws\nkey:" + "B" * 40, "aws key\n:" + "B" * 40, "aws key:\n" + "B" * 40,
    "aws key:" + " \t" * 5000 + '"' + "C" * 40, "aws key:" + "C" * 39, "awskey=" * 2000, "aws secret key" + ":=" * 3 + "D" * 45,
])
def test_aws_assignment_edges_are_re2s(text: str) -> None:
    _check_spans(_AWS, secret_spans.aws_secret_starts, normalize(text))


@pytest.mark.parametrize("gap", [0, 1, 89, 99, 100, 101, 150])
@pytest.mark.parametrize("end", ["PRIVATE KEY-----", "PRIVATE KEY BLOCK-----", "PRIVATE KEY----", "PRIVATE KEY BLOCK"])
def test_private_key_edges_are_re2s(gap: int, end: str) -> None:
    for filler in ("A", " ", "-", "a"):
        _check_spans(_BY_RULE["private-key"], secret_spans.private_key_starts,
                     normalize("-----BEGIN" + filler * gap + end + " -----BEGIN RSA " + end))
