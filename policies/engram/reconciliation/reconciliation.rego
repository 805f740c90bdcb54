# Reconciliation families (SPEC §9): when an admitted record names families,
# what happens to the family's current members. The core asks at admission,
# after the admission decision said accept, and applies the answer in the
# admission's transaction (one journal event per member that changes).
#
# Input: the newcomer (`record`) and the members current in the scope that share
# at least one family with it (`members`): ids, digests, trust class, primary
# kind, valid time, whether each is in effect now (`eligible_now`: within its
# valid time and not expired, as search decides it), who captured them — never
# text. `adjudicated` is true when a host adjudication accepted the newcomer.
package engram.reconciliation

import data.engram.lib

_config := data.engram.config.reconciliation

_record := input.record

# METADATA
# title: Reconciliation decision
# description: >-
#   admission "proceed" with one action per member (keep | supersede | dispute),
#   or "adjudication_required" (the newcomer waits for a host, no member
#   changes). Default rule: a newer record of a superseding kind (decision)
#   supersedes an older member of the same kind from the same or a lower trust
#   class; a member of a higher trust class, or a member newer than the
#   newcomer, sends the newcomer to adjudication. A host-adjudicated newcomer
#   supersedes the older members of its kind whatever their trust class. Only
#   what is in effect now competes: a newcomer dated ahead, ended or expired
#   supersedes nothing (and one dated beyond the tenant's horizon waits for a
#   host), and a member that is not in effect is kept and holds nobody back.
decision := {
	"admission": _admission,
	"members": [{"record_id": m.record_id, "action": _action(m)} | some m in _members],
	"reasons": sort([r | some r in (adjudicate | _notes)]),
}

_members := input.members if is_array(input.members)

_members := [] if not is_array(input.members)

default _admission := "proceed"

_admission := "adjudication_required" if count(adjudicate) > 0

# METADATA
# title: Adjudication reasons
# description: Every reason the newcomer must wait for a host; any one holds it back.
adjudicate contains lib.reason("INVALID_INPUT", "The policy input lacks the record or its members.") if {
	not _input_valid
}

adjudicate contains lib.reason("LOWER_TRUST_THAN_MEMBER", sprintf("A current member of trust class %q outranks the newcomer.", [m.trust_class])) if {
	not _adjudicated
	_record_in_effect
	some m in _members
	_competes(m)
	_newer_than(m)
	not _outranks_or_equals(m)
}

adjudicate contains lib.reason("OLDER_THAN_MEMBER", "A current member of the same kind is newer than the newcomer.") if {
	not _adjudicated
	some m in _members
	_competes(m)
	not _newer_than(m)
}

# Issue 26.5: a record dated far ahead is invisible until then; a host looks at it first.
adjudicate contains lib.reason("BEYOND_HORIZON", "The newcomer's valid time is beyond the tenant's horizon.") if {
	_record.valid_time.t > input.now_ms + lib.tenant_setting(input.context.tenant, "valid_time_window").horizon_ms
}

_notes contains lib.reason("SUPERSEDES_MEMBER", "The newcomer supersedes an older member of its family.") if {
	_admission == "proceed"
	some m in _members
	_action(m) == "supersede"
}

_notes contains lib.reason("NOT_IN_EFFECT_NOW", "The newcomer is not in effect now (valid time ahead or ended, or expired): it supersedes no member.") if {
	_admission == "proceed"
	not _record_in_effect
	some m in _members
	_competes(m)
}

# The action for one member. Only a proceeding admission changes members.
_action(m) := "supersede" if _supersedes(m)

_action(m) := "keep" if not _supersedes(m)

_supersedes(m) if {
	_admission == "proceed"
	_record_in_effect
	_competes(m)
	_newer_than(m)
}

# Same superseding kind on both sides (by default: both are decisions), and the member in
# effect now: one dated ahead, ended or expired hides nothing and is kept.
_competes(m) if {
	_record.primary_kind in _config.superseding_kinds
	m.primary_kind == _record.primary_kind
	m.eligible_now == true
}

# A newcomer that would not be served now must not replace what is (issue 26.5): superseding
# a current member with it would hide the member and show nothing in its place.
_record_in_effect if _record.eligible_now == true

# Newer: the newcomer's valid time starts at or after the member's.
_newer_than(m) if _record.valid_time.t >= m.valid_time.t

_outranks_or_equals(m) if _rank(_record.trust_class) >= _rank(m.trust_class)

# An unknown trust class ranks below every known one.
_rank(class) := object.get(_config.trust_rank, class, -1)

_adjudicated if input.adjudicated == true

# Negations go through helper rules: OPA lifts a call's arguments out of `not`,
# so `not f(input.missing)` would be undefined instead of true (fail open).
_input_valid if {
	is_object(_record)
	is_string(_record.record_id)
	is_number(_record.valid_time.t)
	is_boolean(_record.eligible_now)
	is_number(input.now_ms)
	is_array(input.members)
}
