"""Search and get (SPEC §5, §11, §12 redaction): eligibility, ranking, redaction, receipts, paging."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import logging
import math
from collections.abc import Callable, Sequence
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any

from engram_core.contract.canonical import (
    Canonical,
    canonical,
    canonical_json,
    digest,
    digest_bytes,
    with_receipt_digest,
)
from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.contract.tools import GET_TOOL, SEARCH_TOOL
from engram_core.contract.validation import validate_arguments
from engram_core.crypto.sealing import unseal
from engram_core.observability.tracing import traced
from engram_core.policy.port import REDACTION, Decision
from engram_core.services import lexical, thesaurus
from engram_core.services.core import CallRecord, Core, context_facts
from engram_core.services.lexical import TermHasher, query_words
from engram_core.services.paging import Binding, CursorCodec, Pin
from engram_core.services.ranking import (
    OFFLINE_LEXICAL_V4,
    OFFLINE_LEXICAL_V5,
    Expansion,
    Profile,
    semantic_v5,
    semantic_v6,
)
from engram_core.services.timeq import TimeWindow, parse_time, proximity
from engram_core.store.port import LexicalQuery, LexicalStats, RecordRow, ScopeRow, SharedPin, Tx
from engram_core.trust.hostctx import BoundContext

DEFAULT_LIMIT = 10
DEFAULT_PACKET = 65_536


def in_effect(valid_t: int, valid_t_end: int | None, expires_at_ms: int | None, now_ms: int) -> bool:
    """Within valid time and not expired (expiry counts from expires_at on): what eligibility asks
    of a record's times, whatever its state."""
    if valid_t > now_ms or (valid_t_end is not None and valid_t_end < now_ms):
        return False
    return expires_at_ms is None or expires_at_ms > now_ms


def eligible(rec: RecordRow, now_ms: int) -> bool:
    """SPEC §5: accepted_current, within valid time, not expired (expiry counts from expires_at on)."""
    return rec.state == "accepted_current" and in_effect(rec.valid_t, rec.valid_t_end, rec.expires_at_ms, now_ms)


def _pointer(key: str) -> str:
    return "/" + key.replace("~", "~0").replace("/", "~1")


# The fields of a record view (SPEC §5 ``record``), each with its JSON pointer: what the
# redaction decision's allow-list names.
VIEW_FIELDS = ("record_id", "record_digest", "candidate_id", "state", "trust_class", "payload_digest", "accepted_at",
               "cursor", "payload", "principal", "agent_id")
_POINTERS = {name: _pointer(name) for name in VIEW_FIELDS}


class Redaction:
    """What one read shows of each record, decided once per read: the kept fields, the omitted
    pointers, and the allow-list as its receipts name it (canonicalized once for every record)."""

    def __init__(self, allow: set[str], decision_receipt: str) -> None:
        self.fields = tuple(f for f in VIEW_FIELDS if _POINTERS[f] in allow)
        self.omitted = sorted(_POINTERS[f] for f in VIEW_FIELDS if _POINTERS[f] not in allow)
        self.omitted_c = canonical(self.omitted)  # every packet's redacted_fields, written once
        self.allow_fields = canonical(sorted(allow))
        self.decision_receipt = decision_receipt
        # The receipt's canonical text but its record id, written once (keys in RFC 8785 order:
        # allow_fields, kind, policy_receipt_digest, record_id, redacted_fields).
        self._head = (f'{{"allow_fields":{self.allow_fields.text},"kind":"redaction",'
                      f'"policy_receipt_digest":{encode_basestring(decision_receipt)},"record_id":')
        self._tail = f',"redacted_fields":{self.omitted_c.text}}}'

    def receipt(self, record_id: str) -> str:
        """The record's ``redaction_receipt_digest``: the digest of the receipt
        ``{"kind": "redaction", "record_id", "allow_fields", "redacted_fields",
        "policy_receipt_digest"}`` (``with_receipt_digest``), its text composed from the parts
        every record of the read shares (tests/unit/test_reading_receipts.py checks the two agree)."""
        return digest_bytes("receipt", (self._head + encode_basestring(record_id) + self._tail).encode("utf-8"))


def _payload_shown(plaintext: bytes, tenant: str, workspace: str) -> Canonical:
    """A record's payload as a read shows it (its ``scope_ref`` dropped), with its canonical text.

    The body was sealed as the canonical JSON of the effective payload (admission; a restore
    re-seals such a body, verified), so the shown payload's canonical text is the body's with the
    ``scope_ref`` member cut out: keys are in order and never first ("citations" and
    "components" come before it), and outside strings every quote is structural, so the member
    is found exactly. A body that does not hold it so is canonicalized afresh."""
    text = plaintext.decode("utf-8")
    payload = json.loads(text)
    scope = payload.pop("scope_ref", None)
    if scope == {"tenant": tenant, "workspace": workspace}:
        member = _scope_member(tenant, workspace)
        if text.count(member) == 1:
            return Canonical(payload, text.replace(member, "", 1))
    return canonical(payload)


@functools.lru_cache(maxsize=1024)
def _scope_member(tenant: str, workspace: str) -> str:
    """The canonical text of a body's ``scope_ref`` member, with its leading comma."""
    return "," + encode_basestring("scope_ref") + ":" + canonical({"tenant": tenant, "workspace": workspace}).text


logger = logging.getLogger(__name__)


def _thesaurus_installed(expansion: Expansion) -> bool:
    try:
        thesaurus.load(expansion.senses, expansion.relations)
    except (thesaurus.ThesaurusUnavailable, OSError) as exc:
        logger.warning("query expansion unavailable (%s): searching with offline_lexical_v4 / semantic_v5", exc)
        return False
    return True


class ReadService:
    def __init__(self, core: Core) -> None:
        self.core = core
        # The thesaurus's data is a dependency (pyproject); without it the versions before it serve,
        # under their own config digests, so receipts say which ranked.
        expanded = _thesaurus_installed(OFFLINE_LEXICAL_V5.expansion)  # type: ignore[arg-type]
        self.profiles: dict[str, Profile] = {"lexical": OFFLINE_LEXICAL_V5 if expanded else OFFLINE_LEXICAL_V4}
        embedder = getattr(core, "embedder", None)
        if embedder is not None:
            # SPEC §11: the model id is pinned in the profile config digest.
            # semantic_v4 and v5 stay selectable (ranking.semantic_v4, v5) with their own digests.
            semantic = semantic_v6 if expanded else semantic_v5
            self.profiles["semantic"] = semantic(embedder.model_id,
                                                 needs_network=getattr(embedder, "needs_network", True))
        self.pins = core.store.page_pins(core.now_ms, capacity=core.page_pin_capacity)
        # A word's related terms, hashed with this core's key (``expanded_terms``).
        self._hashed_relatives = functools.lru_cache(maxsize=65_536)(self._relatives_of)
        self._term = functools.lru_cache(maxsize=65_536)(core.hasher.term)  # a query term's hash
        self._related_others = functools.lru_cache(maxsize=65_536)(
            lambda expansion, word, term: related_others(self._hashed_relatives, expansion, word, term))
        self.cursors = CursorCodec(core.page_key)

    def bind_purpose(self, ctx: BoundContext, purpose_ref: str) -> None:
        if purpose_ref != ctx.purpose_ref:
            # SPEC §2: a purpose mismatch is the same protocol refusal as a bad context.
            raise EngramError(Code.TRUSTED_CONTEXT_UNAVAILABLE, "purpose mismatch")

    # -- record views -----------------------------------------------------------------
    def _record_view(self, tx: Tx, rec: RecordRow, redaction: Redaction,
                     key: tuple[int, bytes] | None = None) -> tuple[dict[str, Any], Canonical | None]:
        """The record as ``redaction`` shows it, and its payload's canonical form when shown. The
        body is unsealed and parsed only when the payload is shown; its key is looked up either
        way (a key destroyed by a forget is how a record forgotten meanwhile is recognized).
        ``key``: the key as ``Core.data_keys`` just found it (None: looked up here)."""
        found = key if key is not None else self.core.data_key(tx, f"record:{rec.record_id}", rec.key_slot)
        if found is None or rec.sealed_body is None:
            raise EngramError(Code.BLOB_MISSING, "record body unreadable")
        payload = None
        view: dict[str, Any] = {}
        for name in redaction.fields:
            if name == "payload":
                payload = _payload_shown(unseal(found[1], rec.sealed_body, kind="record", owner=rec.record_id),
                                         rec.tenant, rec.workspace)
                view["payload"] = payload.value
            elif name == "accepted_at":
                view[name] = self.core.instant(rec.accepted_at_ms)
            elif name == "cursor":
                view[name] = str(rec.accepted_cursor)
            else:
                view[name] = getattr(rec, name)
        return view, payload

    def _view_unless_forgotten(self, tx: Tx, rec: RecordRow, now: int, redaction: Redaction,
                               key: tuple[int, bytes] | None = None) -> tuple[dict[str, Any], Canonical | None] | None:
        """The record's view, or None if it was forgotten after it was read: its data key is
        destroyed by the forget's commit, which can land between two of search's statements.
        A key missing from a record that is still eligible is a real BLOB_MISSING."""
        try:
            return self._record_view(tx, rec, redaction, key)
        except EngramError as exc:
            if exc.code is not Code.BLOB_MISSING:
                raise
            again = tx.record(Scope(rec.tenant, rec.workspace), rec.record_id)
            if again is not None and eligible(again, now):
                raise
            return None

    def _redaction_input(self, ctx: BoundContext, operation: str) -> dict[str, Any]:
        return {"context": context_facts(ctx), "operation": operation, "purpose_ref": ctx.purpose_ref,
                "now_ms": self.core.now_ms()}

    def _authorize_and_redaction(self, ctx: BoundContext, operation: str, call: CallRecord,
                                 scope: ScopeRow | None) -> tuple[Decision, Decision]:
        """The authorization and redaction decisions of a read, asked together; the redaction
        decision is recorded on ``call`` by ``_redaction`` once the read uses it."""
        return self.core.authorize_with(ctx, operation, call, scope, REDACTION, self._redaction_input(ctx, operation))

    def _redaction(self, d: Decision, call: CallRecord) -> tuple[Redaction, int]:
        call.add(d)
        allow = set(d.result["allow_fields"]) | {"/record_id"}  # record_id always present (SPEC §5)
        return Redaction(allow, self.core.decision_receipt(d)["receipt_digest"]), int(d.result["max_packet_bytes"])

    # -- get -----------------------------------------------------------------------------
    def get(self, ctx: BoundContext, args: dict[str, Any]) -> dict[str, Any]:
        call = CallRecord()
        validate_arguments(GET_TOOL, args)
        self.bind_purpose(ctx, args["purpose_ref"])
        # A get reads the record's row and body, not the search index: the row alone serves.
        scope = self.core.store.latest_scope(ctx.scope)
        authz, redaction = self._authorize_and_redaction(ctx, GET_TOOL, call, scope)
        now = self.core.now_ms()
        with self.core.store.read(snapshot=False) as tx:  # one statement: no snapshot to hold
            rec = tx.record(ctx.scope, args["record_id"])
        if rec is None or not eligible(rec, now):
            self._audit_read(ctx, GET_TOOL, "NOT_FOUND", args["record_id"], call)
            raise EngramError(Code.NOT_FOUND, "record", audited=True)
        shown, cap = self._redaction(redaction, call)
        with self.core.store.read(snapshot=False) as tx:
            viewed = self._view_unless_forgotten(tx, rec, now, shown)
        if viewed is None:  # forgotten since it was read
            self._audit_read(ctx, GET_TOOL, "NOT_FOUND", args["record_id"], call)
            raise EngramError(Code.NOT_FOUND, "record", audited=True)
        record, payload = viewed
        max_bytes = min(args.get("max_packet_bytes", DEFAULT_PACKET), cap)
        instant = self.core.instant(now)
        # The record was read after the scope row, not in a snapshot with it: the cursor the
        # receipt names covers at least what the record row shows.
        as_of = max(scope.last_cursor if scope else 0, rec.accepted_cursor, rec.state_cursor)
        revalidation = with_receipt_digest({"kind": "revalidation", "record_ids": [rec.record_id], "checked_at": instant,
                                            "eligible": True})["receipt_digest"]
        read_receipt = with_receipt_digest({
            "record_id": rec.record_id, "record_digest": rec.record_digest, "valid_as_of": instant,
            "system_as_of": str(as_of), "validated_through_cursor": str(as_of),
            "authorization_receipt_digest": self.core.decision_receipt(authz)["receipt_digest"],
            "revalidation_receipt_digest": revalidation, "checked_at": instant,
        })
        packet = {"record": record, "redacted_fields": shown.omitted,
                  "redaction_receipt_digest": shown.receipt(rec.record_id), "read_receipt": read_receipt}
        # Canonicalized once, the payload spliced: the digest, and the size (JCS puts the digest first).
        raw = canonical_json(_spliced(packet, payload, shown))
        packet["packet_digest"] = digest_bytes("packet", raw)
        if len(raw) + len(b'"packet_digest":"",') + len(packet["packet_digest"]) > max_bytes:
            self._audit_read(ctx, GET_TOOL, "PROJECTION_OVERSIZED", rec.record_id, call)
            raise EngramError(Code.PROJECTION_OVERSIZED, "record exceeds packet", audited=True)
        self._audit_read(ctx, GET_TOOL, "ok", rec.record_id, call)
        return packet

    def _audit_read(self, ctx: BoundContext, op: str, outcome: str, target: str, call: CallRecord,
                    page_pins: Sequence[SharedPin] = ()) -> None:
        self.core.audit_standalone(ctx, op, outcome, target, call, page_pins=page_pins)

    # -- search ---------------------------------------------------------------------------
    def _profile_for(self, args: dict[str, Any]) -> Profile:
        """SPEC §5 channel selection: lexical_and_semantic needs a semantic channel usable under
        the network policy; otherwise RANKING_UNAVAILABLE, never a silent lexical fallback."""
        policy = args.get("capability_policy", {})
        if policy.get("minimum_channels", "lexical") == "lexical_and_semantic":
            profile = self.profiles.get("semantic")
            if profile is None or (policy.get("network", "forbid") == "forbid" and profile.needs_network):
                raise EngramError(Code.RANKING_UNAVAILABLE, "semantic channel unavailable")
            return profile
        return self.profiles["lexical"]

    def search(self, ctx: BoundContext, args: dict[str, Any]) -> dict[str, Any]:
        call = CallRecord()
        validate_arguments(SEARCH_TOOL, args)
        self.bind_purpose(ctx, args["purpose_ref"])
        # No snapshot transaction: every statement reads the latest committed state. The scope
        # row pins the search (system_as_of), ranking only admits records accepted and unchanged
        # as of the pin, and the final revalidation re-checks every returned record, so a
        # transaction would only add statements (SPEC §11: revalidate after ranking).
        shared_pins: list[SharedPin] = []
        with self.core.store.read(snapshot=False) as tx:
            scope = self.core.store.committed_scope(ctx.scope)  # pins the search
            authz, redaction = self._authorize_and_redaction(ctx, SEARCH_TOOL, call, scope)
            self.core.projections.check(ctx.scope)  # never an empty page for dropped ones
            profile = self._profile_for(args)
            limit = args.get("limit", DEFAULT_LIMIT)
            params = {k: args[k] for k in ("limit", "max_packet_bytes", "capability_policy") if k in args}
            request_digest = digest("query", {"query": args["query"], "params": params})
            binding = Binding(ctx.principal, ctx.tenant, ctx.workspace, request_digest, profile.config_digest())
            if "page_cursor" in args:
                pin, pin_id, offset, after = self._resume(args["page_cursor"], binding)
                rows = self._next_rows(tx, ctx, profile, pin, after=after, offset=offset, limit=limit + 1)
            else:
                offset, pin_id = 0, ""
                valid_as_of = self.core.now_ms()
                # A time the query names becomes a valid-time window; its words are not evidence.
                text, window = parse_time(args["query"], valid_as_of)
                text = text or args["query"]
                pin = Pin(binding=binding, system_as_of=scope.last_cursor if scope else 0,
                          valid_as_of=valid_as_of, candidate_count=0, created_ms=self.core.now_ms(),
                          window=(window.start_ms, window.end_ms) if window else None)
                rows = self._first_rows(tx, ctx, profile, pin, text, limit=limit + 1)
            recs = tx.records(ctx.scope, [r[0] for r in rows[:limit]])
            more = len(rows) > limit
            if more and not pin_id:
                # Only searches with a next page keep a pin; a shared one is written with the
                # audit row below, which the answer waits for anyway, sealed under a key only the
                # cursor carries (pin_id is the pin's reference: its id and that key).
                pin_id = self.pins.put(pin, hold=shared_pins)
            rows = rows[:limit]
            # Final revalidation at read time (SPEC §11): anything no longer eligible is dropped,
            # and its slot is never refilled from an unvalidated list.
            now = self.core.now_ms()
            kept = [(i, r) for i, r in enumerate(rows) if r[0] in recs and eligible(recs[r[0]], now)]
            shown, cap = self._redaction(redaction, call)
            max_bytes = min(args.get("max_packet_bytes", DEFAULT_PACKET), cap)
            packets: list[dict[str, Any]] = []
            payloads: list[Canonical | None] = []
            # Every hit's key at once: one read of a vault in the database instead of one per hit.
            keys = self.core.data_keys([recs[rid] for _, (rid, _s, _v) in kept])
            for i, (rid, score, _vt) in kept:
                viewed = self._view_unless_forgotten(tx, recs[rid], now, shown, keys.get(rid))
                if viewed is not None:
                    record, payload = viewed
                    packets.append({"record": record, "redacted_fields": shown.omitted,
                                    "redaction_receipt_digest": shown.receipt(rid),
                                    "score": round(score * pin.relevance, 9),
                                    "rank": offset + i + 1})
                    payloads.append(payload)
        issued = self.core.instant(now)
        ordered = [p["record"]["record_id"] for p in packets]
        rank_receipt = with_receipt_digest({
            "request_digest": request_digest,
            "authorization_receipt_digest": self.core.decision_receipt(authz)["receipt_digest"],
            "profile": profile.name, "profile_version": profile.version, "profile_config_digest": profile.config_digest(),
            "valid_as_of": self.core.instant(pin.valid_as_of), "system_as_of": str(pin.system_as_of),
            "candidate_count": pin.candidate_count, "ordered_ids_digest": digest("ordered-ids", ordered),
            "revalidation_receipt_digest": with_receipt_digest({
                "kind": "revalidation", "checked_at": issued, "kept": ordered,
                "dropped": len(rows) - len(packets)})["receipt_digest"],
            "issued_at": issued,
        })
        response: dict[str, Any] = {"records": packets, "rank_receipt": rank_receipt}
        if more:
            last = rows[-1]
            response["next_page_cursor"] = self.cursors.seal({
                "v": 1, "pin": pin_id, "offset": offset + len(rows),
                "after": [repr(last[1]), last[2], last[0]],
            })
        # Canonicalized once, each payload's text spliced from its body: the digest and the packet
        # size (JCS puts the digest last).
        spliced = {**response, "records": [_spliced(p, c, shown) for p, c in zip(packets, payloads, strict=True)]}
        raw = canonical_json(spliced)
        response["response_digest"] = digest_bytes("response", raw)
        size = len(raw) + len(b',"response_digest":""') + len(response["response_digest"])
        if size > max_bytes:
            self._refuse_packet(ctx, call, spliced, max_bytes)
        self._audit_read(ctx, SEARCH_TOOL, "ok", "", call, shared_pins)
        return response

    def _refuse_packet(self, ctx: BoundContext, call: CallRecord, response: dict[str, Any], max_bytes: int) -> None:
        """SPEC §5: PROJECTION_OVERSIZED if one record alone cannot fit, else RESULT_TOO_LARGE; never drop.
        ``response``: its packets' payloads spliced (``_spliced``)."""
        frame = len(canonical_json({**response, "records": []}))
        if any(frame + len(canonical_json(p)) > max_bytes for p in response["records"]):
            self._audit_read(ctx, SEARCH_TOOL, "PROJECTION_OVERSIZED", "", call)
            raise EngramError(Code.PROJECTION_OVERSIZED, "one record exceeds packet", audited=True)
        self._audit_read(ctx, SEARCH_TOOL, "RESULT_TOO_LARGE", "", call)
        raise EngramError(Code.RESULT_TOO_LARGE, "page exceeds packet", audited=True)

    def _resume(self, token: str, binding: Binding) -> tuple[Pin, str, int, tuple[float, int, str]]:
        body = self.cursors.open(token)
        try:
            pin_id, offset = str(body["pin"]), int(body["offset"])
            after = (float(body["after"][0]), int(body["after"][1]), str(body["after"][2]))
        except (KeyError, TypeError, ValueError, IndexError):
            raise EngramError(Code.STALE_PAGE, "cursor shape") from None
        pin = self.pins.get(pin_id)
        if pin is None or pin.binding != binding:
            raise EngramError(Code.STALE_PAGE, "pin expired or bound to another search")
        return pin, pin_id, offset, after

    @traced("engram.search.rank")
    def _first_rows(self, tx: Tx, ctx: BoundContext, profile: Profile, pin: Pin, query: str,
                    *, limit: int) -> list[tuple[str, float, int]]:
        """Rank the snapshot and fill ``pin`` with what later pages need to continue it exactly."""
        # The query tokenized and stemmed once: its terms (``TermHasher.query_terms``: the words
        # that have a term, in order) and the words the expansion reads.
        words = query_words(query)
        terms = [self._term(term) for _word, term in words if term is not None]
        pin.lexical_stats = self._lexical_stats(tx, ctx, profile, words, terms)
        if not profile.semantic:
            page = self._lexical(tx, ctx, profile, pin, best_bm25=None, after=None, limit=limit)
            pin.best_bm25, pin.candidate_count = page.best_bm25, page.total
            pin.relevance = query_relevance(profile, pin.lexical_stats, terms, page.own_best_bm25 if page.rows else 0.0)
            return page.rows
        # A semantic profile is installed only with an embedder (``ReadService.__init__``).
        assert profile.fusion is not None and profile.model_id is not None and self.core.embedder is not None
        query_vector = self.core.embedder.embed(embedding_text(profile, self.core.hasher, query, pin.lexical_stats))
        lexical = self._lexical(tx, ctx, profile, pin, best_bm25=None, after=None, limit=profile.fusion.depth,
                                lexical_weight=1.0)
        vector = tx.rank_vectors(ctx.scope, profile.model_id, query_vector, now_ms=pin.valid_as_of,
                                 max_accepted_cursor=pin.system_as_of,
                                 min_similarity=profile.fusion.min_similarity, limit=profile.fusion.depth,
                                 neighbours=profile.neighbours.args() if profile.neighbours else None)
        pin.ordered = fuse(profile, [(r[0], r[2]) for r in lexical.rows], [(r[0], r[2]) for r in vector],
                           now_ms=pin.valid_as_of, window=pin.window)
        # The stronger evidence of the two lists: the lexical relevance of its best hit, or the
        # best cosine similarity (both 0..1, both absolute).
        best_cosine = min(max(max(r[1] for r in vector), 0.0), 1.0) if vector else 0.0
        pin.relevance = max(query_relevance(profile, pin.lexical_stats, terms,
                                            lexical.own_best_bm25 if lexical.rows else 0.0), best_cosine)
        pin.candidate_count = len(pin.ordered)
        return pin.ordered[:limit]

    def _relatives_of(self, expansion: Expansion, word: str) -> tuple[tuple[str, int], ...]:
        return tuple((term, self.core.hasher.term(term)) for term in _related_terms(expansion, word))

    def _lexical_stats(self, tx: Tx, ctx: BoundContext, profile: Profile, words: list[tuple[str, str | None]],
                       terms: list[int]) -> LexicalStats:
        """The scope's statistics of the query's terms and, with an ``Expansion``, of its words'
        (``lexical.query_words``) related terms (``expanded_terms``) the scope has, with their weights."""
        if profile.expansion is None:
            return tx.lexical_stats(ctx.scope, terms)
        expansion = profile.expansion
        related = expanded_terms(expansion, self._hashed_relatives, words, terms, others=self._related_others)
        stats = tx.lexical_stats(ctx.scope, [*terms, *related])
        common = expansion.max_share * stats.docs
        weights = {t: w for t, w in related.items() if 0 < stats.df.get(t, 0) <= common}
        if len(weights) == len(related.keys() & stats.df.keys()):
            return dataclasses.replace(stats, weights=weights) if weights else stats
        # The related terms too common to weigh leave the statistics (the rest kept in order).
        df = dict(stats.df)
        for t in related.keys() - weights.keys():
            df.pop(t, None)
        return dataclasses.replace(stats, df=df, weights=weights)

    @traced("engram.search.rank")
    def _next_rows(self, tx: Tx, ctx: BoundContext, profile: Profile, pin: Pin, *, after: tuple[float, int, str],
                   offset: int, limit: int) -> list[tuple[str, float, int]]:
        if profile.semantic:
            return pin.ordered[offset: offset + limit]
        return self._lexical(tx, ctx, profile, pin, best_bm25=pin.best_bm25, after=after, limit=limit).rows

    def _lexical(self, tx: Tx, ctx: BoundContext, profile: Profile, pin: Pin, *, best_bm25: float | None,
                 after: tuple[float, int, str] | None, limit: int, lexical_weight: float | None = None):
        assert pin.lexical_stats is not None
        if lexical_weight is None:
            lexical_weight = profile.lexical_weight if pin.window is None else 1 - profile.time_weight
        return tx.rank_lexical(ctx.scope, LexicalQuery(
            pin.lexical_stats, profile.weights, k1=profile.k1, b=profile.b,
            now_ms=pin.valid_as_of, half_life_ms=profile.half_life_ms, lexical_weight=lexical_weight,
            max_accepted_cursor=pin.system_as_of, best_bm25=best_bm25, after=after, limit=limit, window=pin.window,
            neighbours=profile.neighbours.args() if profile.neighbours else None,
        ))


def _spliced(packet: dict[str, Any], payload: Canonical | None, redaction: Redaction) -> dict[str, Any]:
    """``packet`` with its record's payload and its redacted fields as Canonicals, for
    ``canonical_json`` to splice."""
    if payload is None:
        return {**packet, "redacted_fields": redaction.omitted_c}
    return {**packet, "record": {**packet["record"], "payload": payload}, "redacted_fields": redaction.omitted_c}


def query_relevance(profile: Profile, stats: LexicalStats, terms: list[int], best_bm25: float) -> float:
    """How well the best hit matches the query, absolutely: its BM25 over the BM25 that a primary
    text of average length containing every query term once would get, at most 1. The BM25 of its
    own terms: what neighbours lend (``ranking.Neighbours``) orders records, it is not a match.

    Reported scores are multiplied by it (one factor per search, so order and paging are
    unchanged): a top score near 1 means some record holds the whole query; a top score of 0.3
    means the best record holds only a small, common part of it. A query term found in no record
    counts with the IDF of a term in none, so "kubernetes pipeline" against records about a
    pipeline only is a weak match, not a perfect one."""
    unique = set(terms)
    if not unique or best_bm25 <= 0:
        return 0.0
    n = stats.docs
    idf = sum(math.log(1 + (n - d + 0.5) / (d + 0.5)) for d in (stats.df.get(t, 0) for t in unique))
    ideal = profile.weights.get("primary", 1.0) * idf  # tf 1 at average length: (k1+1)·1/(1+k1) = 1
    return min(1.0, best_bm25 / ideal) if ideal > 0 else 0.0


@functools.lru_cache(maxsize=65_536)
def _related_terms(expansion: Expansion, word: str) -> tuple[str, ...]:
    """The terms of ``word``'s related words (stems, without stop and question words)."""
    related = thesaurus.load(expansion.senses, expansion.relations).related(word)
    return tuple(sorted(set(lexical.query_terms(" ".join(sorted(related))))))


def expanded_terms(expansion: Expansion, relatives: Callable[[Expansion, str], tuple[tuple[str, int], ...]],
                   text: str | list[tuple[str, str | None]], terms: list[int], *,
                   others: Callable[[Expansion, str, str], tuple[int, ...]] | None = None) -> dict[int, float]:
    """The hashed terms of the query words' related words (``ranking.Expansion``) that are not
    terms of the query itself, each with the expansion's weight; ``relatives`` gives a word's
    related (term, hashed term) pairs. Only alphabetic words that are query terms are expanded
    (not stop or question words, not numbers or identifiers). Keys in first-found order (words
    in query order, each word's related terms in order). ``text``: the query, or its
    ``lexical.query_words`` when the caller has them.

    ``others``: a word's hashed related terms other than the word's own term (``related_others``
    over ``relatives``), which a caller may cache: a long query's ~50 words bring thousands of
    related terms, gathered here in C (``dict.fromkeys``) instead of one Python step each."""
    pick = others or (lambda e, word, term: related_others(relatives, e, word, term))
    out = dict.fromkeys(itertools.chain.from_iterable(
        pick(expansion, word, term) for word, term in (lexical.query_words(text) if isinstance(text, str) else text)
        if term is not None and word.isalpha()), expansion.weight)
    for hashed in out.keys() & set(terms):  # the query's own terms are not expansions
        del out[hashed]
    return out


def related_others(relatives: Callable[[Expansion, str], tuple[tuple[str, int], ...]], expansion: Expansion,
                   word: str, term: str) -> tuple[int, ...]:
    """``word``'s hashed related terms but its own ``term`` (``expanded_terms``'s ``others``)."""
    return tuple(hashed for related, hashed in relatives(expansion, word) if related != term)


def hashed_relatives(hasher: TermHasher) -> Callable[[Expansion, str], tuple[tuple[str, int], ...]]:
    """``expanded_terms``'s ``relatives`` for ``hasher``, uncached (tools and tests)."""
    return lambda expansion, word: tuple((t, hasher.term(t)) for t in _related_terms(expansion, word))


def embedding_text(profile: Profile, hasher: TermHasher, text: str, stats: LexicalStats) -> str:
    """The text the query embedding is computed from (``ranking.semantic_v5``): the query without
    the words whose term is in more than ``embed_common_share`` of the scope's indexed records (a
    speaker's name in a conversation, a project's in its workspace), or the whole query if
    nothing is left out or nothing would remain. The share is of ``stats``, the document
    frequencies the lexical list uses: the scope's own projections, nothing of another scope."""
    share = profile.embed_common_share
    if share <= 0 or stats.docs == 0:
        return text
    words = lexical.query_words(text)
    kept = [w for w, term in words if term is None or stats.df.get(hasher.term(term), 0) <= share * stats.docs]
    if not kept or len(kept) == len(words):
        return text
    return " ".join(kept)


def fuse(profile: Profile, lexical: list[tuple[str, int]], vector: list[tuple[str, int]], *,
         now_ms: int, window: tuple[int, int] | None = None) -> list[tuple[str, float, int]]:
    """semantic_v2/v3: reciprocal-rank fusion (``profile.fusion``) of the two ranked lists, normalized
    to the best fused hit, then 0.85 fused + 0.15 recency; ties by valid_t desc, record_id asc."""
    fusion = profile.fusion
    assert fusion is not None
    fused: dict[str, float] = {}
    valid_t: dict[str, int] = {}
    for weight, ranked in ((fusion.lexical_weight, lexical), (fusion.vector_weight, vector)):
        for rank, (rid, vt) in enumerate(ranked, start=1):
            fused[rid] = fused.get(rid, 0.0) + weight / (fusion.k + rank)
            valid_t[rid] = vt
    if not fused:
        return []
    best = max(fused.values())
    if window is None:
        weight = profile.lexical_weight
        when = {rid: recency(now_ms, vt, profile.half_life_ms) for rid, vt in valid_t.items()}
    else:  # the query named a time: closeness to its window instead of recency (timeq.py)
        weight = 1 - profile.time_weight
        span = TimeWindow(*window)
        when = {rid: proximity(vt, span) for rid, vt in valid_t.items()}
    scored = [(rid, round(weight * f / best + (1 - weight) * when[rid], 9), valid_t[rid]) for rid, f in fused.items()]
    scored.sort(key=lambda r: (-r[1], -r[2], r[0]))
    return scored


def recency(now_ms: int, valid_t: int, half_life_ms: int) -> float:
    """SPEC §11: 0.5 ** (age / half-life) over valid time; future anchors count as age 0."""
    return 0.5 ** (max(now_ms - valid_t, 0) / half_life_ms)
