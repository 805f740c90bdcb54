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
	"trust_class": trust, "primary_kind": kind, "valid_time": {"t": t}, "eligible_now": true,
	"principal": "user:ana", "agent_id": "agent-7", "family_refs": ["family:adr"],
}

_member(id, trust, kind, t) := {
	"record_id": id, "record_digest": "sha256:3", "payload_digest": "sha256:4", "state": "accepted_current",
	"trust_class": trust, "primary_kind": kind, "valid_time": {"t": t}, "eligible_now": true, "principal": "user:bo",
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

# --- what is not in effect now does not compete (issue 26.5) ---

_ahead(t) := object.union(_rec("asserted", "decision", t), {"eligible_now": false})

_not_in_effect := _r("NOT_IN_EFFECT_NOW", "The newcomer is not in effect now (valid time ahead or ended, or expired): it supersedes no member.")

_beyond := _r("BEYOND_HORIZON", "The newcomer's valid time is beyond the tenant's horizon.")

# Mirrors tests/policy/fixtures/reconciliation/not_yet_valid_keeps_members.json: a decision dated
# a day ahead is admitted but replaces nothing; the current member stays current.
test_golden_not_yet_valid_keeps_members if {
	reconciliation.decision == {
		"admission": "proceed",
		"members": [{"record_id": "mem_old", "action": "keep"}],
		"reasons": [_not_in_effect],
	} with input as _in(_ahead(_now + 86400000), [_member("mem_old", "asserted", "decision", 10)])
}

# Mirrors tests/policy/fixtures/reconciliation/beyond_horizon_adjudication.json: 2^53-1.
test_golden_beyond_horizon_adjudication if {
	reconciliation.decision == {
		"admission": "adjudication_required",
		"members": [{"record_id": "mem_old", "action": "keep"}],
		"reasons": [_beyond],
	} with input as _in(_ahead(9007199254740991), [_member("mem_old", "asserted", "decision", 10)])
}

test_an_ended_or_expired_newcomer_supersedes_nothing if {
	ended := object.union(_rec("signed", "decision", 20), {"valid_time": {"t": 20, "t_end": 30}, "eligible_now": false})
	reconciliation.decision == {
		"admission": "proceed",
		"members": [{"record_id": "mem_old", "action": "keep"}],
		"reasons": [_not_in_effect],
	} with input as _in(ended, [_member("mem_old", "asserted", "decision", 10)])
	# An adjudicated one neither: the host's accept stands, the member stays.
	reconciliation.decision.members == [{"record_id": "mem_old", "action": "keep"}] with input as object.union(
		_in(ended, [_member("mem_old", "signed", "decision", 10)]), {"adjudicated": true})
}

test_a_newcomer_ahead_needs_no_adjudication_for_rank if {
	reconciliation.decision == {
		"admission": "proceed",
		"members": [{"record_id": "mem_old", "action": "keep"}],
		"reasons": [_not_in_effect],
	} with input as _in(_ahead(_now + 86400000), [_member("mem_old", "signed", "decision", 10)])
}

test_a_member_not_in_effect_is_kept_and_holds_nobody_back if {
	# The member dated far ahead (as admitted before this rule) does not make a current
	# restatement "older than a member": the restatement proceeds, the member is kept.
	ahead := object.union(_member("mem_ahead", "asserted", "decision", 9007199254740991), {"eligible_now": false})
	reconciliation.decision == {
		"admission": "proceed",
		"members": [{"record_id": "mem_ahead", "action": "keep"}, {"record_id": "mem_old", "action": "supersede"}],
		"reasons": [_supersedes],
	} with input as _in(_rec("asserted", "decision", 20), [ahead, _member("mem_old", "asserted", "decision", 10)])
}

test_the_horizon_is_the_tenants if {
	reconciliation.decision.admission == "proceed" with input as _in(_ahead(_now + 86400000 * 400), [])
		with data.engram.config.tenants.acme.valid_time_window as {"floor_ms": 0, "horizon_ms": 86400000 * 500}
	reconciliation.decision.reasons == [_beyond] with input as _in(_ahead(_now + 86400000 * 400), [])
}

test_missing_eligibility_goes_to_adjudication if {
	reconciliation.decision.reasons == [_r("INVALID_INPUT", "The policy input lacks the record or its members.")] with input as _in(object.remove(_rec("asserted", "decision", 20), ["eligible_now"]), [])
}
