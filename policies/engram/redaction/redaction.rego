# Redaction: the record fields a read may return and the packet cap, per purpose
# (SPEC §5 search/get, §9). /record_id is always returned (contract).
package engram.redaction

import data.engram.lib

_config := data.engram.config.redaction

_read_operations := {"engram_memory_get", "engram_memory_search"}

default _purpose := {}

_purpose := _config.purposes[input.purpose_ref]

# METADATA
# title: Redaction decision
# description: >-
#   The JSON pointers of record fields a read may return (sorted; always
#   /record_id) and the packet cap. Defaults come from
#   data.engram.config.redaction; a purpose entry in its `purposes` overrides
#   allow_fields and/or max_packet_bytes. An invalid request gets /record_id only.
decision := {
	"allow_fields": sort([f | some f in _allow_fields]),
	"max_packet_bytes": object.get(_purpose, "max_packet_bytes", _config.default_max_packet_bytes),
	"reasons": sort([r | some r in deny]),
}

_allow_fields contains "/record_id"

_allow_fields contains f if {
	count(deny) == 0
	some f in object.get(_purpose, "allow_fields", _config.default_allow_fields)
	f in _config.record_fields
}

# METADATA
# title: Deny reasons
# description: Why nothing but /record_id may be returned; empty for a valid read.
deny contains lib.reason("UNKNOWN_OPERATION", "Redaction applies to search and get only.") if {
	not _read_operation
}

deny contains lib.reason("INVALID_INPUT", "The policy input lacks a purpose_ref.") if {
	not _purpose_named
}

# Negations go through helper rules: OPA lifts a call's arguments out of `not`,
# so `not f(input.missing)` would be undefined instead of true (fail open).
_read_operation if input.operation in _read_operations

_purpose_named if is_string(input.purpose_ref)
