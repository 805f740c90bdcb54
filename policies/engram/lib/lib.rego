# Shared, data-driven lookups for every decision family (SPEC §9).
# Configuration lives in data.engram.config (policies/data.json); a tenant entry
# overrides the "*" default key by key.
package engram.lib

# METADATA
# title: Tenant setting
# description: >-
#   The value of setting `key` for `tenant`: the tenant's own entry in
#   data.engram.config.tenants when it has the key, else the "*" default.
tenant_setting(tenant, key) := data.engram.config.tenants[tenant][key]

tenant_setting(tenant, key) := data.engram.config.tenants["*"][key] if {
	not _has_own(tenant, key)
}

_has_own(tenant, key) if {
	_ = data.engram.config.tenants[tenant][key]
}

# METADATA
# title: Reason
# description: A reason object, the one shape every decision explains itself with.
reason(code, message) := {"code": code, "message": message}

# METADATA
# title: Context complete
# description: >-
#   True when the host-bound context names a tenant, a workspace and a principal
#   (SPEC §2: an empty one is refused before anything else happens).
context_complete(ctx) if {
	_non_empty_string(ctx.tenant)
	_non_empty_string(ctx.workspace)
	_non_empty_string(ctx.principal)
}

_non_empty_string(s) if {
	is_string(s)
	s != ""
}
