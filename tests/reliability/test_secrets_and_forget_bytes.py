"""Nothing secret is ever stored, and forget is real, checked on the bytes (issue 7
items 8 and 9, issue 13 finding 6, SPEC §5, §10, §13).

Secrets: a corpus of realistic credentials is put into every free-text and ref
field of a capture (and the search query); each capture is refused with
UNAUTHORIZED, and the secret's bytes are in no file of the data directory —
neither the DuckDB file after a CHECKPOINT nor the WAL before it. A negative
corpus of ordinary engineering prose is not flagged.

Forget: a record's words are in no file before (sealed, hashed postings) or
after forget, nor in a backup taken afterwards; a backup taken before holds the
sealed body, which no key can open once the record's data key is destroyed.
"""

from __future__ import annotations

import base64
import json
import random
import string
from pathlib import Path

import pytest

from engram_core.api import admin_pb2
from engram_core.contract.errors import Code
from engram_core.contract.scope import Scope
from engram_core.crypto.sealing import unseal
from engram_core.secret_scan.scan import scan
from tests.support.core_engines import EngineStores
from tests.support.core_support import Client, capture_args, now_ms
from tests.support.reliability_crash import HostAdmin, activate_scope, domain_state

_rng = random.Random(7)


def _r(n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    return "".join(_rng.choice(alphabet) for _ in range(n))


UP = string.ascii_uppercase + string.digits
B64 = string.ascii_letters + string.digits + "+/"
SECRETS: dict[str, str] = {
    "aws_access_key_id": f"AKIA{_r(16, UP)}",
    "aws_secret_env": f"aws_secret_access_key = {_r(40, B64)}",
    "github_pat": f"ghp_{_r(36)}",
    "github_fine_grained": f"github_pat_{_r(22)}_{_r(59)}",
    "gitlab_pat": f"glpat-{_r(20)}",
    "slack_bot": f"xoxb-{_r(12, string.digits)}-{_r(12, string.digits)}-{_r(24)}",
    "stripe_live": f"sk_live_{_r(24)}",
    "google_api_key": f"AIza{_r(35)}",
    "openai_project": f"sk-proj-{_r(48)}",
    "anthropic": f"sk-ant-api03-{_r(40)}",
    "npm_token": f"npm_{_r(36)}",
    "huggingface": f"hf_{_r(34)}",
    "sendgrid": f"SG.{_r(22)}.{_r(43)}",
    "jwt": "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiI" + _r(20) + "IsImlhdCI6MTUxNjIzOTAyMn0." + _r(43),
    "rsa_private_key": f"-----BEGIN RSA PRIVATE KEY-----\nMIIEow{_r(60, B64)}\n-----END RSA PRIVATE KEY-----",
    "openssh_private_key": f"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEA{_r(50, B64)}",
    "gcp_service_account": '{"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----\\nMIIEv' + _r(40, B64),
    "postgres_url": f"postgres://app_user:{_r(14)}@db.internal.example:5432/prod",
    "mongodb_srv": f"mongodb+srv://admin:{_r(12)}@cluster0.ab1cd.mongodb.net/test",
    "redis_url": f"redis://:{_r(16)}@cache.example.com:6379/0",
    "azure_storage": f"DefaultEndpointsProtocol=https;AccountName=prodlogs;AccountKey={_r(86, B64)}==;EndpointSuffix=core.windows.net",
    "azure_sas": f"Endpoint=sb://bus.servicebus.windows.net/;SharedAccessKeyName=root;SharedAccessKey={_r(43, B64)}=",
    "dotenv_password": f"DATABASE_PASSWORD={_r(16)}",
    "dotenv_db_pass": f"DB_PASS={_r(14)}",
    "dotenv_export_secret": f"export STRIPE_SECRET_KEY='{_r(30)}'",
    "dotenv_token": f"SLACK_TOKEN={_r(24)}",
    "session_cookie": f"Cookie: sessionid={_r(32)}; csrftoken={_r(32)}",
    "set_cookie": f"Set-Cookie: connect.sid=s%3A{_r(32)}.{_r(20)}; Path=/; HttpOnly",
    "bearer": f"Authorization: Bearer {_r(40)}",
    "basic_auth": "Authorization: Basic " + base64.b64encode(f"deploy:{_r(12)}".encode()).decode(),
    "password_assignment": f"password: {_r(14)}",
    "api_key_assignment": f"api_key={_r(32)}",
    # Issue 13 finding 6: shapes the scanner missed.
    "pgp_private_key_block": f"-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBF{_r(60, B64)}",
    "slack_webhook": f"https://hooks.slack.com/services/T0{_r(8, UP)}/B0{_r(8, UP)}/{_r(24)}",
    "discord_bot_token": f"MT{_r(24)}.G{_r(5)}.{_r(38)}",
    "google_oauth_client_secret": f"GOCSPX-{_r(28)}",
    "twilio_api_key": f"SK{_r(32, '0123456789abcdef')}",
    "aws_secret_bare": base64.b64encode(_rng.randbytes(27)).decode() + "Q1x/",
    "token_glued_to_word": f"mytokenghp_{_r(36)}",
    "token_split_by_zero_width_space": f"gh\u200bp_{_r(36)}",
}

PROSE = [
    "We rotate the API key every 90 days and store it in the vault, never in the repository.",
    "The password reset flow sends a single-use link by email; tokens expire after an hour.",
    "Connect to postgres://localhost:5432/app for local development; production uses IAM auth.",
    "Bearer tokens are validated by the gateway before the request reaches the service.",
    "A JWT has three base64url parts separated by dots: header, claims and signature.",
    "Run export PATH=$PATH:/usr/local/bin before the build script.",
    "The cookie banner appears once; session cookies are HttpOnly and Secure.",
    "SG.1 and SG.2 are the security groups of the web tier.",
    "The npm_modules cache and hf_hub downloads are pruned nightly.",
    "We chose DuckDB because it is embedded; the secret sauce is the WAL.",
    "Use sha256:" + "ab" * 32 + " as the content digest of the ADR.",
    "The sk-learn pipeline and the AKIA prefix rule are documented in docs/security.md.",
    "Passwords must be at least 12 characters; see the password policy.",
    "SORT_KEY=created_at is the default ordering of the list endpoint.",
]


def test_scanner_flags_the_whole_corpus_and_no_prose() -> None:
    missed = [name for name, s in SECRETS.items() if not scan([f"Note for the team: {s} (do not share)."])]
    assert not missed, missed
    flagged = [(p, scan([p])) for p in PROSE if scan([p])]
    assert not flagged, flagged


@pytest.fixture(scope="module")
def core(module_stores: EngineStores, tmp_path_factory):
    running = module_stores.start_core(tmp_path_factory.mktemp("bytes") / "data", semantic=False)
    activate_scope(running)
    yield running
    running.stop()


JOINED_WAL = "pg_wal (records joined across pages)"


def _store_files(stores: EngineStores, data_dir: Path) -> dict[str, bytes]:
    """``stores.blobs(data_dir)`` as searched here. On PostgreSQL it holds each WAL segment twice:
    as the file, and in the stream of every segment's pages with the page headers cut out
    (``pg_cluster.wal_stream``). Every run of a segment's bytes that holds no header byte is in
    that stream, so a run found in a segment file and not in the stream would be part header:
    none of the needles here. The segment files are left out: each search reads their size less."""
    blobs = stores.blobs(data_dir)
    if JOINED_WAL not in blobs:
        return blobs
    return {name: blob for name, blob in blobs.items() if Path(name).parent.name != "pg_wal"}


def _files_contain(blobs: dict[str, bytes], needle: bytes) -> list[str]:
    """Which of the store's files (``EngineStores.blobs``: the data directory's and, on PostgreSQL,
    the database's heap files and WAL) hold ``needle``."""
    return [name for name, blob in blobs.items() if needle in blob]


def _needles(secret: str) -> list[bytes]:
    """The last 16 bytes of the secret's longest random-looking run: what a partial copy would
    still hold, and what a whole copy holds too (the run is part of the secret), so the secret
    itself needs no search of its own: each search reads every file (on PostgreSQL tens of MB of
    WAL)."""
    import re

    run = max(re.findall(r"[A-Za-z0-9+/]{12,}", secret), key=len)
    assert run[-16:].encode() in secret.encode()
    return [run[-16:].encode()]


FIELDS = ["text", "source_ref", "locator_value", "type_ref", "evidence_ref", "attestation", "component_id"]


def _with_secret(field: str, secret: str) -> dict:
    args = capture_args("An ordinary decision about caching.", key=f"secret-{field}-{_r(12)}")
    p, ev = args["payload"], args["evidence"]
    ref_secret = secret[:512]
    if field == "text":
        p["components"][0]["text"] = f"Deploy notes: {secret}"
    elif field == "source_ref":
        p["citations"][0]["source_ref"] = ref_secret
    elif field == "locator_value":
        p["citations"][0]["locator"]["value"] = ref_secret
    elif field == "type_ref":
        p["primary_event"]["type_ref"] = ref_secret
    elif field == "evidence_ref":
        ev["evidence_ref"] = ref_secret
    elif field == "attestation":
        ev["attestation"] = ref_secret
    elif field == "component_id":
        p["components"][0]["component_id"] = ref_secret
        p["primary_component_id"] = ref_secret
    return args


def test_secrets_in_every_field_are_refused_and_stored_nowhere(core, module_stores: EngineStores) -> None:
    c = Client(core)
    before = domain_state(core)
    data_dir = core.core.data_dir
    for i, (name, secret) in enumerate(SECRETS.items()):
        field = FIELDS[i % len(FIELDS)] if "\n" not in secret else "text"
        for f in {field, "text"}:
            assert c.fails("capture", _with_secret(f, secret)) == Code.UNAUTHORIZED, (name, f)
        c.search(secret[:8000])  # a query is not stored either
    assert domain_state(core) == before
    blobs = _store_files(module_stores, data_dir)
    for name, secret in SECRETS.items():  # WAL and file before the checkpoint
        for needle in _needles(secret):
            assert not _files_contain(blobs, needle), (name, "before checkpoint")
    if module_stores.is_postgresql:
        # The store's checkpoint is a no-op there, and blobs() has read the files after the
        # server's CHECKPOINT, with the WAL: the pass after would read what the pass before read.
        return
    core.core.store.checkpoint()
    blobs = _store_files(module_stores, data_dir)
    for name, secret in SECRETS.items():
        for needle in _needles(secret):
            assert not _files_contain(blobs, needle), (name, "after checkpoint")


def _backup(host: HostAdmin) -> bytes:
    return b"".join(ch.data for ch in host.stub.Backup(admin_pb2.ScopeRequest(), metadata=host.md(), timeout=60))


def test_forgotten_text_is_nowhere_and_an_earlier_backup_cannot_open_it(core, module_stores: EngineStores) -> None:
    c = Client(core)
    host = HostAdmin(core)
    data_dir = core.core.data_dir
    word = "zq" + _r(20, string.ascii_lowercase)
    text = f"The incident bridge code word is {word} for the quarterly drill."
    rid = c.remember(text)
    assert [r["record"]["record_id"] for r in c.search(word)["records"]] == [rid]
    core.core.store.checkpoint()
    assert not _files_contain(_store_files(module_stores, data_dir), word.encode()), \
        "plaintext at rest before forget"
    backup_before = _backup(host)
    assert word.encode() not in backup_before
    item = next(json.loads(line) for line in backup_before.splitlines()
                if b'"kind":"record"' in line and rid.encode() in line)
    sealed = base64.b64decode(item["sealed_body"])
    owner, slot = item["key_ref"]["owner"], item["key_ref"]["ref"]
    key = core.core.vault.data_key(slot, owner)
    assert word.encode() in unseal(key, sealed, kind="record", owner=rid)  # the backup copy opens… for now

    out = c.call("forget", {"record_id": rid, "idempotency_key": f"forget-bytes-{_r(10)}", "reason_ref": "r:drill"},
                 grant=True)
    assert out["projection_invalidation"] == "complete"
    assert c.search(word)["records"] == []
    assert not _files_contain(_store_files(module_stores, data_dir), word.encode()), \
        "forgotten text in the store's files"
    # The old ciphertext may survive in freed DuckDB blocks (DuckDB does not zero them; measured and
    # documented in docs/reliability.md). What makes every copy unreadable is the destroyed key:
    assert core.core.vault.data_key(slot, owner) is None  # the slot is zeroed: no copy can be opened
    if not module_stores.is_postgresql:  # the file vault's slot (PostgreSQL's wrapped keys: tests/store)
        assert b"\0" * 64 == (data_dir / "datakeys.bin").read_bytes()[slot * 64:(slot + 1) * 64]
    backup_after = _backup(host)
    assert word.encode() not in backup_after and base64.b64encode(sealed[:48]) not in backup_after
    host.close()


def test_forget_leaves_no_term_hash_and_no_embedding_run_in_any_file(stores: EngineStores, tmp_path: Path) -> None:
    """The attack of issue 14: with DIR/index.key in hand, hash the words one suspects a forgotten
    record held and grep every file of the data directory for those hashes, and for any 16-byte
    run of the record's embedding. Postings and vectors are sealed under the record's key
    (store/projection.py), so after the forget (and closing the store) there is nothing to find;
    before the change 7 of 7 hashes and 95 of 95 runs were found."""
    data_dir = tmp_path / "data"
    running = stores.start_core(data_dir, semantic=True)
    try:
        activate_scope(running)
        c = Client(running)
        words = ["zq" + _r(12, string.ascii_lowercase) for _ in range(7)]
        text = "Bridge drill notes: " + " ".join(words) + "."
        rid = c.remember(text)
        assert [r["record"]["record_id"] for r in c.search(words[0])["records"]] == [rid]
        with running.core.store.read() as tx:
            held = tx.projection(rid)  # what the index holds for the record: the attacker's targets
        assert held is not None and held.vector is not None
        terms = sorted({int(t) for codes in held.fields.values() for t in codes[0]})
        assert len(terms) >= len(words)
        vector = held.vector
        running.core.store.checkpoint()
        c.call("forget", {"record_id": rid, "idempotency_key": f"forget-residue-{_r(10)}", "reason_ref": "r:drill"},
               grant=True)
        c.channel.close()
    finally:
        running.stop()

    blobs = _store_files(stores, data_dir)
    forms = [t.to_bytes(8, order, signed=True) for t in terms for order in ("little", "big")]
    found = sum(any(form in blob for blob in blobs.values()) for form in forms)
    assert found == 0, f"{found} keyed term hashes of {len(terms)} still in the files"
    raw = vector.tobytes()
    runs = [raw[i:i + 16] for i in range(0, len(raw) - 15, 16)]
    left = sum(any(run in blob for blob in blobs.values()) for run in runs)
    assert left == 0, f"{left} of {len(runs)} embedding runs still in the files"


def test_nothing_content_derived_outlives_a_candidate_in_its_facts(stores: EngineStores, tmp_path: Path) -> None:
    """Issue 26.7: after a forget, `candidates.facts` still held the record's family refs, text
    and payload sizes in plain text. A candidate's facts are now sealed in its envelope (and the
    plain column, which older candidates filled, is emptied by forget, withdraw and rejection in
    their own transaction): once its key is destroyed nothing of them can be read, and the family
    refs of a withdrawn candidate are in no file of the data directory."""
    from tests.support.governance_support import Host, consent, start_with_bundle

    gone, withdrawn, kept = (f"family:zq{_r(16, string.ascii_lowercase)}" for _ in range(3))
    running = start_with_bundle(tmp_path, stores, edit=consent(gone, withdrawn, kept))
    data_dir = running.core.data_dir
    try:
        c = Client(running)
        t = now_ms() - 60_000
        forgotten = c.call("capture", capture_args("A decision we will forget.", t=t,
                                                   reconciliation={"family_refs": [gone]}))
        rid = c.admit(forgotten["candidate_id"])["outcome"]["record_id"]
        pending = c.call("capture", capture_args("A candidate we withdraw.", t=t,
                                                 reconciliation={"family_refs": [withdrawn]}))["candidate_id"]
        current = capture_args("A decision that stays current.", t=t, reconciliation={"family_refs": [kept]})
        assert c.admit(c.call("capture", current)["candidate_id"])["outcome"]["status"] == "accepted"
        current["idempotency_key"] = f"cap-duplicate-{_r(12)}"
        duplicate = c.call("capture", current)["candidate_id"]
        assert c.admit(duplicate)["outcome"]["status"] == "duplicate_exact"
        with running.core.store.read() as tx:
            assert tx.candidate(Scope("acme", "alpha"), pending).facts == {}  # never in plain
        host = Host(running)
        inspect = admin_pb2.InspectRequest(tenant="acme", workspace="alpha", candidate_id=pending)
        view = host.call("InspectCandidate", inspect)  # a host still sees them while it is pending
        assert view["family_refs"] == [withdrawn] and view["sizes"]["payload_bytes"] > 0
        running.core.store.checkpoint()
        c.call("forget", {"record_id": rid, "idempotency_key": f"forget-facts-{_r(10)}", "reason_ref": "r:drill"},
               grant=True)
        c.call("withdraw", {"candidate_id": pending, "idempotency_key": f"withdraw-facts-{_r(10)}",
                            "reason_ref": "r:drill"}, grant=True)
        with running.core.store.read() as tx:
            for cid in (forgotten["candidate_id"], pending, duplicate):
                assert tx.candidate(Scope("acme", "alpha"), cid).facts == {}, cid
        for cid in (forgotten["candidate_id"], pending, duplicate):
            view = host.call("InspectCandidate", admin_pb2.InspectRequest(tenant="acme", workspace="alpha",
                                                                          candidate_id=cid))
            assert (view["family_refs"], view["sizes"], view["findings"], view["retention"]) == ([], {}, {}, {}), cid
        c.channel.close()
        host.channel.close()
    finally:
        running.stop()
    blobs = _store_files(stores, data_dir)
    # The withdrawn candidate's family was only ever in its facts. (A forgotten record's families
    # were also in its record links, whose deleted rows DuckDB may leave in freed blocks: the limit
    # docs/security.md names; the live record's are still there, as they should be.)
    assert not [name for name, blob in blobs.items() if withdrawn.encode() in blob]
    assert any(kept.encode() in blob for blob in blobs.values())


@pytest.mark.duckdb_only(reason="rewrites the DuckDB file's candidates.facts as a store written before facts "
                                "were sealed; no PostgreSQL store was ever written that way")
def test_plain_facts_an_older_store_wrote_are_emptied_by_forget_withdraw_and_reject(stores: EngineStores, tmp_path: Path) -> None:
    """Issue 26.7 on a store written before facts were sealed: its candidates hold family refs and
    sizes in the plain `candidates.facts` column. Forget, withdraw and rejection empty it in their
    own transaction (the engine's `scrub_candidate_facts`), so none of it outlives the content."""
    import duckdb

    from tests.support.governance_support import Host, consent, start_with_bundle

    families = [f"family:zq{_r(16, string.ascii_lowercase)}" for _ in range(3)]
    running = start_with_bundle(tmp_path, stores, edit=consent(*families))
    c = Client(running)
    t = now_ms() - 60_000
    captured = [c.call("capture", capture_args(f"A decision on topic {i} of the drill.", t=t,
                                               reconciliation={"family_refs": [family]}))["candidate_id"]
                for i, family in enumerate(families)]
    forgotten, withdrawn, rejected = captured
    rid = c.admit(forgotten)["outcome"]["record_id"]
    c.channel.close()
    running.stop()
    con = duckdb.connect(str(tmp_path / "data" / "engram.duckdb"))  # as the column was before the fix
    try:
        for cid, family in zip(captured, families, strict=True):
            con.execute("UPDATE candidates SET facts = ? WHERE candidate_id = ?",
                        [json.dumps({"family_refs": [family], "payload_bytes": 321, "text_bytes": 42}), cid])
    finally:
        con.close()
    running = stores.start_core(tmp_path / "data", policies_dir=tmp_path / "policies", semantic=False)
    try:
        c, host = Client(running), Host(running)
        with running.core.store.read() as tx:
            assert all(tx.candidate(Scope("acme", "alpha"), cid).facts for cid in captured)
        c.call("forget", {"record_id": rid, "idempotency_key": f"forget-old-{_r(10)}", "reason_ref": "r:drill"},
               grant=True)
        c.call("withdraw", {"candidate_id": withdrawn, "idempotency_key": f"withdraw-old-{_r(10)}",
                            "reason_ref": "r:drill"}, grant=True)
        host.call("Transition", admin_pb2.TransitionRequest(tenant="acme", workspace="alpha", operation="reject",
                                                            target=rejected, event_id=f"evt_reject_old_{_r(12)}",
                                                            reason_ref="r:drill"))
        with running.core.store.read() as tx:
            for cid in captured:
                assert tx.candidate(Scope("acme", "alpha"), cid).facts == {}, cid
        c.channel.close()
        host.channel.close()
    finally:
        running.stop()
