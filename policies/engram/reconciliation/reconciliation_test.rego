package engram.reconciliation_test

import data.engram.reconciliation

_ctx := {
	"tenant": "acme", "workspace": "main", "principal": "user:ana", "agent_id": "agent-7",
	"session": "s-1", "purpose_ref": "purpose:notes", "host_key_id": "hk-1",
	"memory_enabled": true, "host_principal": false, "maintenance_scopes": [],
	"authorization_epoch": 0,
}

_now := 1700000000000

_rec(trust, kind, t) := {
	"record_id": "mem_new", "record_digest": "sha256:1", "payload_digest": "sha256:2",
	"trust_class": trust, "primary_kind": kind, "valid_time": {"t": t},
	"principal": "user:ana", "agent_id": "agent-7", "family_refs": ["family:adr"],
}

_member(id, trust, kind, t) := {
	"record_id": id, "record_digest": "sha256:3", "payload_digest": "sha256:4", "state": "accepted_current",
	"trust_class": trust, "primary_kind": kind, "valid_time": {"t": t}, "principal": "user:bo",
	"agent_id": "agent-2", "family_refs": ["family:adr"], "accepted_at_ms": 1,
}

_in(record, members) := {"context": _ctx, "now_ms": _now, "adjudicated": false, "record": record, "members": members}

_r(code, message) := {"code": code, "message": message}

_supersedes := _r("SUPERSEDES_MEMBER", "The newcomer supersedes an older member of its family.")

_lower := _r("LOWER_TRUST_THAN_MEMBER", "A current member of trust class \"signed\" outranks the newcomer.")

_older := _r("OLDER_THAN_MEMBER", "A current member of the same kind is newer than the newcomer.")

# --- golden cases (mirrored by tests/policy/fixtures/reconciliation/*.json) ---

test_golden_newer_decision_supersedes if {
	reconciliation.decision == {
		"admission": "proceed",
		"members": [{"record_id": "mem_old", "action": "supersede"}],
		"reasons": [_supersedes],
	} with input as _in(_rec("asserted", "decision", 20), [_member("mem_old", "asserted", "decision", 10)])
}

test_golden_lower_trust_adjudication if {
	reconciliation.decision == {
		"admission": "adjudication_required",
		"members": [{"record_id": "mem_old", "action": "keep"}],
		"reasons": [_lower],
	} with input as _in(_rec("asserted", "decision", 20), [_member("mem_old", "signed", "decision", 10)])
}

test_golden_no_members_proceeds if {
	reconciliation.decision == {"admission": "proceed", "members": [], "reasons": []} with input as _in(_rec("asserted", "decision", 20), [])
}

# --- further behaviour ---

test_higher_trust_newcomer_supersedes_lower_member if {
	reconciliation.decision == {
		"admission": "proceed",
		"members": [{"record_id": "mem_old", "action": "supersede"}],
		"reasons": [_supersedes],
	} with input as _in(_rec("signed", "decision", 20), [_member("mem_old", "earned", "decision", 10)])
}

test_same_valid_time_counts_as_newer if {
	reconciliation.decision.members == [{"record_id": "mem_old", "action": "supersede"}] with input as _in(_rec("earned", "decision", 10), [_member("mem_old", "earned", "decision", 10)])
}

test_older_newcomer_goes_to_adjudication if {
	reconciliation.decision == {
		"admission": "adjudication_required",
		"members": [{"record_id": "mem_old", "action": "keep"}],
		"reasons": [_older],
	} with input as _in(_rec("signed", "decision", 5), [_member("mem_old", "asserted", "decision", 10)])
}

test_other_kinds_are_kept if {
	reconciliation.decision == {
		"admission": "proceed",
		"members": [{"record_id": "mem_ctx", "action": "keep"}, {"record_id": "mem_ev", "action": "keep"}],
		"reasons": [],
	} with input as _in(_rec("asserted", "decision", 20), [
		_member("mem_ctx", "signed", "context", 10),
		_member("mem_ev", "asserted", "evidence", 30),
	])
}

test_non_decision_newcomer_keeps_everything if {
	reconciliation.decision == {
		"admission": "proceed",
		"members": [{"record_id": "mem_old", "action": "keep"}],
		"reasons": [],
	} with input as _in(_rec("asserted", "context", 20), [_member("mem_old", "asserted", "context", 10)])
}

test_one_blocking_member_holds_back_every_change if {
	reconciliation.decision == {
		"admission": "adjudication_required",
		"members": [{"record_id": "mem_a", "action": "keep"}, {"record_id": "mem_b", "action": "keep"}],
		"reasons": [_lower],
	} with input as _in(_rec("asserted", "decision", 20), [
		_member("mem_a", "asserted", "decision", 10),
		_member("mem_b", "signed", "decision", 10),
	])
}

test_adjudicated_newcomer_supersedes_whatever_the_trust if {
	reconciliation.decision == {
		"admission": "proceed",
		"members": [{"record_id": "mem_a", "action": "supersede"}, {"record_id": "mem_b", "action": "keep"}],
		"reasons": [_supersedes],
	} with input as object.union(_in(_rec("asserted", "decision", 20), [
		_member("mem_a", "signed", "decision", 10),
		_member("mem_b", "signed", "decision", 30),
	]), {"adjudicated": true})
}

test_unknown_trust_class_ranks_lowest if {
	reconciliation.decision.admission == "adjudication_required" with input as _in(_rec("forged", "decision", 20), [_member("mem_old", "asserted", "decision", 10)])
	reconciliation.decision.members == [{"record_id": "mem_old", "action": "supersede"}] with input as _in(_rec("asserted", "decision", 20), [_member("mem_old", "forged", "decision", 10)])
}

test_superseding_kinds_come_from_data if {
	reconciliation.decision.members == [{"record_id": "mem_old", "action": "supersede"}] with input as _in(_rec("asserted", "context", 20), [_member("mem_old", "asserted", "context", 10)])
		with data.engram.config.reconciliation.superseding_kinds as ["context"]
}

test_invalid_input_goes_to_adjudication if {
	reconciliation.decision == {
		"admission": "adjudication_required",
		"members": [],
		"reasons": [_r("INVALID_INPUT", "The policy input lacks the record or its members.")],
	} with input as {}
}
