package engram.lib_test

import data.engram.lib

_config := {"tenants": {
	"*": {"retain_allowed": false, "expiry_cap_ms": 10},
	"acme": {"retain_allowed": true},
}}

test_tenant_setting_uses_own_value if {
	lib.tenant_setting("acme", "retain_allowed") with data.engram.config as _config
}

test_tenant_setting_falls_back_to_default_key_by_key if {
	lib.tenant_setting("acme", "expiry_cap_ms") == 10 with data.engram.config as _config
	lib.tenant_setting("other", "retain_allowed") == false with data.engram.config as _config
}

test_context_complete_requires_tenant_workspace_principal if {
	lib.context_complete({"tenant": "t", "workspace": "w", "principal": "p"})
	not lib.context_complete({"tenant": "t", "workspace": "", "principal": "p"})
	not lib.context_complete({"tenant": "t", "principal": "p"})
	not lib.context_complete({"tenant": 1, "workspace": "w", "principal": "p"})
}

test_reason_shape if {
	lib.reason("X", "y") == {"code": "X", "message": "y"}
}
