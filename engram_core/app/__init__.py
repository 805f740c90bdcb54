"""The composition root: the one place that chooses implementations and wires them together.

``engines`` says which storage engine keeps a store (``StoreConfig``, the engine registry);
``composition`` opens a core from configuration (key vault, store, policy engine, embedder,
trusted keys) and serves it (the services, then the gRPC server of ``engram_core.rpc``).
Nothing below it imports it: the CLI, tests, tools and benchmarks do
(tests/unit/test_layering.py, docs/architecture.md).
"""
