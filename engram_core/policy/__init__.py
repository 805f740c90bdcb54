"""Policy decisions: the PolicyEngine port and its backends (embedded OPA, OPA REST)."""
