# Decision-log masks: what a decision-log event may keep (issue 30). OPA's system.log.mask,
# under the bundle's own root, in two parts: path_mask(path), asked once per decision path and
# bundle revision (so masking costs a decision nothing), and mask(event), which a bundle may
# add for masks that depend on the event's content (asked with every decision, in the same
# engine call). Their operations are applied together.
#
# An answer is a set of OPA mask operations: a JSON pointer string erases that field,
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
# title: Decision-log mask of a decision path
# description: >-
#   For a path in data.engram.config.decision_log.known_paths: pseudonymize each pointer of
#   pseudonymize and erase each of erase. For any other path (a family this mask does not
#   know yet), every string of the input and the result is pseudonymized.
path_mask(path) := _known if {
	path in _cfg.known_paths
} else := _unknown

_known := {{"op": "pseudonymize", "path": p} | some p in _cfg.pseudonymize} | {p | some p in _cfg.erase}

_unknown := {{"op": "pseudonymize", "path": "/input"}, {"op": "pseudonymize", "path": "/result"}}
