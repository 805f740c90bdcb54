"""Envelope encryption: the KeyVault port (store KEK) and AES-256-GCM sealing."""
