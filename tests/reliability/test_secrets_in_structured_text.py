"""Credentials in structured text and in disguise are refused at capture (issue 26 item 4,
SPEC §13), through the real gRPC surface of a real core.

The second adversarial review captured a JSON config holding a password; it was admitted and
``get`` returned it. The same held for ``api_key``, ``client_secret`` and ``access_token`` keys
and for YAML, TOML and Python-dict forms, for look-alike letters in known prefixes (Cyrillic
``р`` in ``ghр_``, Cyrillic ``А`` in ``АKIA``, Greek ``ο`` in ``xοxb-``), Go MySQL DSNs,
``curl -u user:pass``, SSH2 private key armour, and tokens split by U+2028/U+2029. Each is
now refused as a credential (UNAUTHORIZED, class ``credential``), changes nothing, and its
random part is in no file of the data directory after a CHECKPOINT.

The control is the same JSON config with its password replaced by a reference
(``${DB_PASSWORD}``): it is captured, admitted and returned by ``get`` — a placeholder holds
no secret, and the refusal above is not a refusal of JSON.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

import pytest

from engram_core.contract.errors import Code
from engram_core.rpc.status import error_from_rpc_error
from tests.support.core_engines import EngineStores
from tests.support.core_support import Client, Failed, capture_args
from tests.support.reliability_crash import activate_scope, domain_state

_rng = random.Random()
ALNUM = string.ascii_letters + string.digits


def _r(n: int, alphabet: str = ALNUM) -> str:
    return "".join(_rng.choice(alphabet) for _ in range(n))


def _password() -> str:
    return f"{_r(6)}!{_r(7)}#{_r(3, string.digits)}"


# name -> (the text captured, its random part that must be on no disk).
def _forms() -> dict[str, tuple[str, str]]:
    forms: dict[str, tuple[str, str]] = {}

    def add(name: str, secret: str, template: str) -> None:
        forms[name] = (template.format(secret=secret), secret)

    add("json_password", _password(),
        '{{"database": {{"host": "db.internal", "user": "app", "password": "{secret}"}}}}')
    add("json_api_key", _r(32), '{{"service": "billing", "api_key": "{secret}"}}')
    add("json_client_secret", _r(37), '"client_id": "web-app",\n"client_secret": "{secret}"')
    add("json_access_token", f"{_r(12)}.{_r(24)}-{_r(8)}", '{{"token_type": "bearer", "access_token": "{secret}"}}')
    add("yaml_password", _password(), "database:\n  user: app\n  db_password: {secret}\n")
    add("toml_password", f"{_r(5)} {_r(6)} {_r(5)}", '[database]\nuser = "app"\npassword = "{secret}"\n')
    add("python_dict_password", _password(), "DATABASES = {{'default': {{'USER': 'app', 'password': '{secret}'}}}}")
    add("yaml_refresh_token", _r(48), "oauth:\n  refresh_token: {secret}\n")
    add("cyrillic_er_in_ghp", _r(36), "the token is gh\u0440_{secret} for CI")
    add("cyrillic_a_in_akia", _r(16, string.ascii_uppercase + "234567"), "key id \u0410KIA{secret} in us-east-1")
    add("greek_omicron_in_xoxb", f"{_r(12, string.digits)}-{_r(12, string.digits)}-{_r(24)}",
        "bot token x\u03bfxb-{secret}")
    add("go_mysql_dsn", _password(), 'dsn := "app:{secret}@tcp(db.internal:3306)/orders?parseTime=true"')
    add("curl_user_password", _password(), "curl -sS -u deploy:{secret} https://api.example.com/v1/items")
    add("ssh2_private_key", _r(60, ALNUM + "+/"),
        '---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----\nComment: "rsa-key-2024"\nP2/56wAAA{secret}\n'
        "---- END SSH2 ENCRYPTED PRIVATE KEY ----")
    token = _r(36)
    forms["github_token_split_by_u2028"] = (f"token: ghp_{token[:10]}\u2028{token[10:]}", token[10:])
    key = _r(16, string.ascii_uppercase + "234567")
    forms["aws_key_id_split_by_u2029"] = (f"AKIA\u2029{key} was rotated", key)
    return forms


FORMS = _forms()


@pytest.fixture(scope="module")
def core(module_stores: EngineStores, tmp_path_factory):
    running = module_stores.start_core(tmp_path_factory.mktemp("structured") / "data", semantic=False)
    activate_scope(running)
    yield running
    running.stop()


def _files_containing(stores: EngineStores, data_dir: Path, needle: bytes) -> list[str]:
    """Files of the store holding ``needle``: the data directory's and, on PostgreSQL, the
    database's heap files and WAL (core_engines.EngineStores.blobs)."""
    return [name for name, blob in stores.blobs(data_dir).items() if needle in blob]


@pytest.mark.parametrize("name", sorted(FORMS))
def test_a_credential_in_structured_text_or_disguise_is_refused_and_stored_nowhere(core, module_stores: EngineStores, name: str) -> None:
    c = Client(core)
    text, secret = FORMS[name]
    before = domain_state(core)
    with pytest.raises(Failed) as refused:
        c.call("capture", capture_args(f"Deploy notes: {text}", key=f"structured-{name}-{_r(8)}"))
    assert refused.value.code == Code.UNAUTHORIZED
    assert error_from_rpc_error(refused.value.err).reason_class == "credential"
    assert domain_state(core) == before  # nothing captured, nothing journalled
    core.core.store.checkpoint()
    assert _files_containing(module_stores, core.core.data_dir, secret.encode()) == []


def test_a_config_whose_password_is_a_reference_is_remembered(core) -> None:
    """The issue's JSON config, with a reference where the password was: nothing secret, so it
    is captured, admitted and returned by get, text intact."""
    c = Client(core)
    config = json.dumps({"database": {"host": "db.internal", "user": "app", "password": "${DB_PASSWORD}"},
                         "api_key": "<redacted>", "client_secret": "********", "signing_key": "engram-data/host.key"})
    text = f"The billing service reads its database settings from this config: {config}"
    record_id = c.remember(text)
    got = c.get(record_id)["record"]
    assert got["record_id"] == record_id
    assert got["payload"]["components"][0]["text"] == text
