# Decision-log mask: what a decision-log event may keep (issue 30). OPA's system.log.mask,
# under the bundle's own root and written as a function of the event, so the core evaluates
# it inside each decision's own engine call instead of handing the input over a second time.
#
# The answer is a set of OPA mask operations: a JSON pointer string erases that field,
# {"op": "upsert", "path", "value"} sets it, and {"op": "pseudonymize", "path"} replaces
# every string at or under the path with a keyed pseudonym (the same string, the same
# pseudonym; the key stays with the operator). A "*" segment stands for every element or
# member; pointers that lead nowhere are ignored. Nothing in a decision input is memory text
# (SPEC §9), but names are: tenants, workspaces, principals, agents, sessions, purposes and
# the families agents name are pseudonymized, and reason messages (which may quote a family)
# are erased; codes, outcomes, states, trust classes, digests and record ids stay readable.
package engram.log

_cfg := data.engram.config.decision_log

# METADATA
# title: Decision-log mask
# description: >-
#   The mask operations for one event ({"path", "input", "result"}): for a decision path in
#   data.engram.config.decision_log.known_paths, pseudonymize each pointer of pseudonymize and
#   erase each of erase; for any other path (a family this mask does not know yet), every
#   string of the input and the result is pseudonymized.
mask(event) := _known if {
	event.path in _cfg.known_paths
} else := _unknown

_known := {{"op": "pseudonymize", "path": p} | some p in _cfg.pseudonymize} | {p | some p in _cfg.erase}

_unknown := {{"op": "pseudonymize", "path": "/input"}, {"op": "pseudonymize", "path": "/result"}}
