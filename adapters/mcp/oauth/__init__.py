"""The HTTP adapter as an OAuth 2.1 resource server (issue 29; docs/mcp-clients.md, docs/security.md).

settings.py (``[http.oauth]``) -> fetch.py (issuer metadata) -> jwks.py (keys) and introspection.py
-> verifier.py (the SDK's TokenVerifier) -> caller_binding.py (the binding policy's answer) ->
resource_server.py (the assembly); the HTTP application itself is ``adapters/mcp/http_app.py``.
"""
