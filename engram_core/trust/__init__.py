"""What a core trusts about a caller: signed host contexts, host keys and their rotation,
context nonces spent once, and the secrets several cores share."""
