"""The contract every surface shares: the tool catalogue and its schemas, the error codes,
canonical JSON, request validation and the operation digest a confirmation binds."""
