"""Credentials found by their slot (issue 26 item 4): a name and an assignment in structured
text, ``curl -u``, a Go MySQL DSN, and what in a slot holds no secret
(engram_core/secret_scan/slots.py, the slot rules of engram_core/secret_scan/rules.py).

Every form the second adversarial review got past the scanner is here by name; a slot that
holds a placeholder or (unquoted) code is not a finding, and one such slot does not hide a
real credential after it; past the slot budget the scanner reports a finding (fail closed).
"""

from __future__ import annotations

import random
import string

import numpy as np
import pytest

from engram_core.secret_scan.scan import MAX_COUNT, SLOT_BUDGET, scan
from engram_core.secret_scan.slots import (
    CODE_IDENTIFIERS,
    CODE_NAMES,
    CODE_NONE,
    CODE_PATHS,
    holds_no_secret,
    is_placeholder,
)

_rng = random.Random(26)
ALNUM = string.ascii_letters + string.digits


def _r(n: int, alphabet: str = ALNUM) -> str:
    return "".join(_rng.choice(alphabet) for _ in range(n))


def _password() -> str:
    return f"{_r(5)}!{_r(6)}{_r(2, string.digits)}"


def _kinds(text: str) -> set[str]:
    return {f["kind"] for f in scan([text])}


# name -> (text, the kind it must be reported as). Each was accepted before issue 26.
STRUCTURED = {
    "json password": (f'{{"database": {{"user": "app", "password": "{_password()}"}}}}', "password_assignment"),
    "json password without spaces": (f'{{"password":"{_password()}"}}', "password_assignment"),
    "json passphrase with spaces": ('{"passphrase": "correct horse battery staple"}', "password_assignment"),
    "json api_key": (f'{{"api_key": "{_r(32)}"}}', "generic_api_key"),
    "json apiKey": (f'{{"apiKey": "{_r(32)}"}}', "generic_api_key"),
    "json client_secret": (f'"client_secret": "{_r(37)}"', "generic_api_key"),
    "json access_token with dots": (f'"access_token": "{_r(10)}.{_r(20)}-{_r(6)}"', "generic_api_key"),
    "json refresh_token": (f'{{"refresh_token": "{_r(48)}"}}', "generic_api_key"),
    "json auth_token": (f'{{"auth_token": "{_r(24)}"}}', "generic_api_key"),
    "json private_key (not PEM)": (f'{{"private_key": "{_r(44, ALNUM + "+/")}"}}', "generic_api_key"),
    "json secret": (f'{{"secret": "{_r(20)}"}}', "generic_api_key"),
    "json token": (f'{{"token": "{_r(30)}"}}', "generic_api_key"),
    "yaml prefixed password": (f"database:\n  db_password: {_password()}\n", "password_assignment"),
    "yaml camelCase password": (f"mysqlRootPassword: {_password()}", "password_assignment"),
    "yaml quoted password": (f'password: "{_password()}"', "password_assignment"),
    "yaml client_secret": (f"oauth:\n  client_secret: {_r(37)}\n", "generic_api_key"),
    "yaml access_token": (f"access_token: '{_r(30)}'", "generic_api_key"),
    "toml password": (f'[database]\npassword = "{_password()}"', "password_assignment"),
    "toml password with spaces": ('password = "correct horse battery staple"', "password_assignment"),
    "toml api_key": (f'[service]\napi_key = "{_r(32)}"', "generic_api_key"),
    "python dict password": (f"{{'user': 'app', 'password': '{_password()}'}}", "password_assignment"),
    "python dict access_token": (f"{{'access_token': '{_r(30)}'}}", "generic_api_key"),
    "python subscript": (f"config['password'] = '{_password()}'", "password_assignment"),
    "ruby hash rocket": (f':password => "{_password()}"', "password_assignment"),
    "cli flag": (f"mysqldump --password={_password()} orders", "password_assignment"),
    "url query access_token": (f"GET /v1/me?access_token={_r(30)}&fields=id", "generic_api_key"),
    "cyrillic letters in the key": (f"\u0440\u0430ssword: {_password()}", "password_assignment"),
}


@pytest.mark.parametrize("name", sorted(STRUCTURED))
def test_a_credential_under_a_key_in_structured_text_is_found(name: str) -> None:
    text, kind = STRUCTURED[name]
    assert kind in _kinds(text), scan([text])


OTHER_SLOTS = {
    "go mysql dsn over tcp": (f"app:{_password()}@tcp(db.internal:3306)/orders?parseTime=true", "connection_string"),
    "go mysql dsn over a socket": (f"root:{_password()}@unix(/var/run/mysqld/mysqld.sock)/app", "connection_string"),
    "go mysql dsn without address": (f"app:{_password()}@/orders", "connection_string"),
    "curl -u": (f"curl -u deploy:{_password()} https://api.example.com", "basic_auth_credentials"),
    "curl --user=": (f"curl --user=deploy:{_password()} https://api.example.com", "basic_auth_credentials"),
    "curl flag cluster": (f"curl -sSfu deploy:{_password()} https://api.example.com", "basic_auth_credentials"),
    "curl -u empty user": (f"curl -u :{_r(24)} https://api.example.com", "basic_auth_credentials"),
    "curl --proxy-user": (f"curl --proxy-user ops:{_password()} https://x.example", "basic_auth_credentials"),
}


@pytest.mark.parametrize("name", sorted(OTHER_SLOTS))
def test_dsn_and_curl_credentials_are_found(name: str) -> None:
    text, kind = OTHER_SLOTS[name]
    assert kind in _kinds(text), scan([text])


# Slots that hold no secret: not a finding. Each is what configuration, docs and code say.
HOLDS_NO_SECRET = [
    '{"password": ""}', '{"password": "********"}', "password: xxxxxxxx", "password: <redacted>",
    'password: "[REDACTED]"', 'password: "${DB_PASSWORD}"', "password: $DB_PASSWORD",
    "password: '{{ .Values.db.password }}'", 'password = "%(db_password)s"', "password: !vault |",
    "password: changeme", '"password": "your_password_here"', "api_key: your-api-key-here",
    '"api_key": "<YOUR_API_KEY>"', 'token: "env:GITHUB_TOKEN"', 'secret: "vault:secret/data/db#password"',
    'client_secret: "op://Private/oauth/client-secret"', 'token_env = "ENGRAM_MCP_TOKENS"',
    'signing_key = "/etc/engram/host.key"', 'signing_key = "engram-data/host.key"',
    'private_key = "~/.ssh/id_ed25519"', "is_secret: false", "secret: true", "access_token: null",
    # code: attribute paths, names and types (unquoted)
    "password = settings.DB_PASSWORD", "password = getpass()", "token = issue_token(user)",
    "signing_key: Ed25519PrivateKey | None", "signing_key=signing_key,", "private_key=self.key,",
    "api_key=config.api_key", "access_token: AccessToken,", "credential_ref=ctx.credential_ref,",
    # not slots at all
    "password_policy: strict_mode_enabled", "max_tokens: 4096", '"nextPageToken": "CAUQAAabcdefgh"',
    "compass: northward1", "bypass: always-on", "secretName: db-credentials-v2",
    'TOKENIZER_NAME = "bert-wordpiece-uncased-30522"',
    "curl -u deploy https://x.example", "curl -u deploy: https://x.example",
    'curl -u "$USER:$PASS" https://x.example', "curl -u ci:$TOKEN https://x.example",
    "app:password@tcp(localhost:3306)/db", "app:${DB_PASS}@tcp(db:3306)/app",
    "postgres://user:password@localhost:5432/app", "redis://:${REDIS_PASSWORD}@cache:6379/0",
]


@pytest.mark.parametrize("text", HOLDS_NO_SECRET)
def test_a_slot_holding_a_placeholder_or_code_is_not_a_finding(text: str) -> None:
    assert scan([text]) == []


def test_a_placeholder_does_not_hide_a_credential_after_it() -> None:
    # Each placeholder match is judged and dropped; the next key's boundary is zero-width, so
    # the match that follows is still found (a consuming boundary class would have eaten it);
    # and a placeholder after a credential does not stretch a match over it (curl's lazy span).
    for text in (f"pass=changeme pass={_password()}", f'password: "********"\npassword: "{_password()}"',
                 f"API_TOKEN=${{X}} API_TOKEN={_r(20)}", f"curl -u a:$PASSWORD https://x; curl -u a:{_password()} https://y",
                 f"curl -u a:{_password()} https://x; curl -u a:$PASSWORD https://y"):
        assert scan([text]), text


def test_findings_are_counted_and_carry_no_text() -> None:
    secrets = [_password() for _ in range(3)]
    text = " ".join(f'{{"password": "{s}"}}' for s in secrets) + ' {"password": "changeme"}'
    found = scan([text])
    assert found == [{"kind": "password_assignment", "rule": "password-assignment", "count": 3}]
    assert not any(s in repr(found) for s in secrets)


def test_past_the_slot_budget_a_finding_is_reported() -> None:
    """Judging slots one by one is the scanner's one per-match Python step; it stops at
    SLOT_BUDGET candidates per rule and then reports (fail closed), so a text of placeholders
    cannot make a scan loop per match, nor hide a real credential behind them."""
    stand_ins = ['"password": "changeme"'] * SLOT_BUDGET
    assert scan([", ".join(stand_ins)]) == []
    hidden = ", ".join([*stand_ins, f'"password": "{_password()}"'])
    assert scan([hidden]) == [{"kind": "password_assignment", "rule": "password-assignment", "count": 1}]
    many = ", ".join(f'"password": "{_password()}"' for _ in range(MAX_COUNT + 5))
    assert scan([many])[0]["count"] == MAX_COUNT


@pytest.mark.parametrize(("value", "expected"), [
    (b"********", True), (b"", True), (b"  ", True), (b"${X}", True), (b"<redacted>", True),
    (b"CHANGEME", True), (b"Your-Token-Here", True), (b"enter_password", True), (b"DB_PASSWORD", True),
    (b"certs/client.pem", True), (b"!vault", True), (b"arn:aws:secretsmanager:eu-west-1:1:secret:x", True),
    (b"hunter22", False), (b"postgres", False), (b"yourname2024", False), (b"Summer2024", False),
    (b"p@ss w0rd", False), (b"a8f5f167f44f4964e6c998dee827110c", False), (b"ab/cd+ef==", False),
    (b"\x80\x80\x80\x80\x80\x80", False),  # a password of non-ASCII letters is a password
])
def test_placeholders(value: bytes, expected: bool) -> None:
    assert is_placeholder(value) is expected


@pytest.mark.parametrize(("value", "code", "expected"), [
    (b"settings.DB_PASSWORD", CODE_PATHS, True), (b"Summer2024", CODE_PATHS, False),
    (b"signing_key", CODE_PATHS, False), (b"signing_key", CODE_NAMES, True), (b"signingKey", CODE_NAMES, False),
    (b"Ed25519PrivateKey", CODE_NAMES, False), (b"signing_key", CODE_IDENTIFIERS, True),
    (b"Ed25519PrivateKey,", CODE_IDENTIFIERS, True), (b"signingKey", CODE_IDENTIFIERS, True),
    (b"Zx81kPq0LmN3vB7cT2wE", CODE_IDENTIFIERS, False), (b"a8f5f167f44f4964e6c998dee827110c", CODE_IDENTIFIERS, False),
    (b"settings.DB_PASSWORD", CODE_NONE, False),
])
def test_code_in_an_unquoted_slot(value: bytes, code: str, expected: bool) -> None:
    assert holds_no_secret(value, bare=True, code=code) is expected
    if expected:
        assert not holds_no_secret(value, bare=False, code=code)  # quoted: a literal, judged as a value


@pytest.mark.parametrize(("length", "allowed"), [(16, 10), (24, 2), (32, 0)])
def test_random_tokens_are_seldom_taken_for_code(length: int, allowed: int) -> None:
    """The code shapes must not swallow random credentials. Of 20,000 random tokens of
    letters and digits, at most ``allowed`` read as code (measured over 100,000: 17 at 16
    characters, the least a bare API key or token slot counts; 0-2 at 20 and 24; none at 32
    or 40). An UpperCamel parse needs every capital followed by lower case, a vowel in each
    word and no lower case straight after a digit; without the vowel rule 139 did at 16."""
    alphabet = np.frombuffer(ALNUM.encode(), np.uint8)
    rows = alphabet[np.random.default_rng(length).integers(0, len(alphabet), (20_000, length))]
    taken = [t for t in map(bytes, rows) if holds_no_secret(t, bare=True, code=CODE_IDENTIFIERS)]
    assert len(taken) <= allowed, taken[:5]


def test_the_slot_pattern_matches_what_the_counted_pattern_matched() -> None:
    """The judged groups come from the counted pattern with groups added: on every match of
    every slot rule, over the forms above, the slot pattern matches the same bytes and exactly
    one group holds the content (otherwise the match would count unjudged)."""
    from engram_core.secret_scan import scan as secrets_scan

    texts = [t for t, _ in (*STRUCTURED.values(), *OTHER_SLOTS.values())] + HOLDS_NO_SECRET
    data = b"\n".join(secrets_scan.normalize(t) for t in texts)
    judged = 0
    for compiled in secrets_scan._COMPILED:
        if compiled.slot is None:
            continue
        for match in compiled.regex.finditer(data):
            parts = compiled.slot.fullmatch(match.group())
            assert parts is not None, (compiled.rule.rule, match.group())
            assert sum(g is not None for g in parts.groups()) == 1, (compiled.rule.rule, match.group())
            judged += 1
    assert judged > len(STRUCTURED)
