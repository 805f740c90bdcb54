"""Secret scanning of memory text before anything is stored: the rule catalogue, the slot
grammar, span merging and Unicode look-alike folding (docs/security.md, "Secrets")."""
