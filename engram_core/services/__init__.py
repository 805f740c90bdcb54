"""Core services: the six agent operations, host services and maintenance."""
