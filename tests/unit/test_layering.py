"""The dependency rule of docs/architecture.md ("Layers"), enforced with ``ast`` over every module
of ``engram_core`` and ``adapters`` (imports at any depth, function-level ones included).

1. **Direction.** Each package has a layer; an import goes to a lower layer or stays in its own:
   the CLI (0), the composition root ``engram_core.app`` (1), ``adapters`` (2), ``engram_core.rpc``
   (3), ``engram_core.services`` (4), and the ports with their implementations and the shared
   modules (5: ``engram_core.store``, ``.policy``, ``.crypto``, ``.embedding``, and the modules
   outside these packages: errors, canonical JSON, contexts, schemas, tools, observability, ...).
2. **No cycles**: none among those packages, none between any two modules.
3. **Services import ports, never an implementation**: no storage engine, no in-memory index,
   no ``FileKeyVault``, no embedded or REST policy engine, no ONNX embedder. Only the
   composition root's engine registry names the storage engine.
4. **No private cross-module access**: a ``_name`` defined in one module is not imported or
   reached (``obj._name``) from another.

Each checker is a function of source text or of a module graph, tested below on small sources
that break the rule; the known exceptions are listed with who removes them, and the test fails
when one of them no longer occurs (so the list only shrinks).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("engram_core", "adapters")

LAYERS: dict[str, int] = {
    "engram_core.cli": 0,
    "engram_core.app": 1,
    "adapters": 2,
    "engram_core.console": 2,  # `engram console`: a host service beside the adapter (docs/console.md)
    "engram_core.rpc": 3,
    "engram_core.services": 4,
    "engram_core.store": 5,
    "engram_core.policy": 5,
    "engram_core.crypto": 5,
    "engram_core.embedding": 5,
    # The contract (tool catalogue, schemas, errors, canonical JSON), what a core trusts of a
    # caller (host contexts and keys) and the secret scanner: shared by every layer above.
    "engram_core.contract": 5,
    "engram_core.trust": 5,
    "engram_core.secret_scan": 5,
    # Logs, metrics and spans: below everything that logs (the ports' observers, which wrap the
    # ports, are the composition root's: engram_core/app/observed_ports.py).
    "engram_core.observability": 6,
}
SHARED_LAYER = 5  # modules outside the packages above
SERVICES = "engram_core.services"
# What a service must not import: modules (and everything under them), and names in a module.
IMPLEMENTATION_MODULES = ("duckdb", "engram_core.store.duckdb", "psycopg", "psycopg_pool",
                          "engram_core.store.postgres", "engram_core.store.memory", "engram_core.store.search_index",
                          "engram_core.policy.embedded", "engram_core.policy.opa_rest", "opa_bindings",
                          "opa_client", "engram_core.embedding.onnx_minilm", "engram_core.embedding.model",
                          "onnxruntime")
IMPLEMENTATION_NAMES = {"engram_core.crypto.keyvault": frozenset({"FileKeyVault"})}
ENGINE_MODULES = ("duckdb", "engram_core.store.duckdb", "psycopg", "psycopg_pool", "engram_core.store.postgres",
                  "engram_core.store.memory")
ENGINE_REGISTRY = "engram_core.app.engines"

# Known exceptions: (module, what), each listed with the work that removes it (none open: backup
# and restore reach another key directory through ``Core.open_key_dir`` and the KeyVault port).
KNOWN_IMPLEMENTATION_IMPORTS: set[tuple[str, str]] = set()
KNOWN_PRIVATE_ACCESS: set[tuple[str, str]] = set()
# Not ours, only a namesake: opa-python-client's HTTP session, fitted with a no-delay adapter
# (the checker knows names, not types: ``_session`` is also an attribute of the ONNX embedder).
THIRD_PARTY_PRIVATE = {("engram_core.policy.opa_rest", "._session")}


# ---- reading one module ---------------------------------------------------------------------


@dataclass
class Module:
    name: str
    is_package: bool
    imports: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)  # (module, names imported from it)
    defined: set[str] = field(default_factory=set)  # private names this module defines
    private_imports: list[str] = field(default_factory=list)  # "module._name" imported by name
    private_attributes: set[str] = field(default_factory=set)  # `_name` reached on something not self/cls


def read_module(name: str, source: str, *, is_package: bool = False) -> Module:
    mod = Module(name, is_package)
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            mod.imports += [(alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            names = tuple(alias.name for alias in node.names)
            mod.imports.append((base, names))
            mod.private_imports += [f"{base}.{n}" for n in names if _private(n)]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            mod.defined.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            mod.defined.add(node.id)
        elif isinstance(node, ast.Attribute):
            if isinstance(node.ctx, ast.Store):
                mod.defined.add(node.attr)
            elif _private(node.attr) and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                mod.private_attributes.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _private(node.value):
            mod.defined.add(node.value)  # __slots__ entries, getattr(self, "_x")
    mod.defined = {n for n in mod.defined if _private(n)}
    return mod


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


# ---- the graph of every module --------------------------------------------------------------


def module_name(path: Path, root: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def read_tree(root: Path, packages: Iterable[str] = SCANNED) -> dict[str, Module]:
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "_gen" in path.parts:
                continue
            name, is_package = module_name(path, root)
            modules[name] = read_module(name, path.read_text(encoding="utf-8"), is_package=is_package)
    return modules


def resolve(modules: Mapping[str, Module], name: str) -> str | None:
    """The module of ours ``name`` is, or is in (``pkg.mod.Class`` -> ``pkg.mod``); None: not ours."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def edges(modules: Mapping[str, Module]) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (``from pkg import mod`` names ``pkg.mod``)."""
    out: dict[str, set[str]] = {}
    for name, mod in modules.items():
        targets = set()
        for base, names in mod.imports:
            for target in ([f"{base}.{n}" for n in names] if names else [base]):
                found = resolve(modules, target)
                if found is not None and found != name:
                    targets.add(found)
        out[name] = targets
    return out


def cycles(graph: Mapping[str, Iterable[str]]) -> list[set[str]]:
    """The strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[set[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph.get(start, ())))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, ()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def package_of(module: str) -> str | None:
    best = None
    for package in LAYERS:
        if (module == package or module.startswith(package + ".")) and (best is None or len(package) > len(best)):
            best = package
    return best


def layer_of(module: str) -> int:
    package = package_of(module)
    return LAYERS[package] if package is not None else SHARED_LAYER


def upward_imports(graph: Mapping[str, Iterable[str]]) -> list[tuple[str, str]]:
    """(importer, imported) where the imported module sits in a higher layer than the importer."""
    return sorted((a, b) for a, targets in graph.items() for b in targets
                  if package_of(a) != package_of(b) and layer_of(b) < layer_of(a))


def package_graph(graph: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {p: set() for p in LAYERS}
    for a, targets in graph.items():
        pa = package_of(a)
        for b in targets:
            pb = package_of(b)
            if pa is not None and pb is not None and pa != pb:
                out[pa].add(pb)
    return out


def implementation_imports(modules: Mapping[str, Module]) -> set[tuple[str, str]]:
    """(service module, the implementation it imports)."""
    found = set()
    for name, mod in modules.items():
        if not (name == SERVICES or name.startswith(SERVICES + ".")):
            continue
        for base, names in mod.imports:
            for target in ([f"{base}.{n}" for n in names] if names else [base]):
                if any(target == m or target.startswith(m + ".") for m in IMPLEMENTATION_MODULES):
                    found.add((name, target))
            for n in names:
                if n in IMPLEMENTATION_NAMES.get(base, ()):
                    found.add((name, f"{base}.{n}"))
    return found


def engine_importers(modules: Mapping[str, Module]) -> set[str]:
    """Modules outside the engines themselves that import a storage engine."""
    return {name for name, mod in modules.items()
            if not any(name == e or name.startswith(e + ".") for e in ENGINE_MODULES)
            and any(any(t == e or t.startswith(e + ".") for e in ENGINE_MODULES)
                    for base, names in mod.imports for t in ([f"{base}.{n}" for n in names] if names else [base]))}


def private_access(modules: Mapping[str, Module]) -> set[tuple[str, str]]:
    """(module, what): a private name of another module of ours imported by name, or a private
    attribute this module does not define that another module of ours does."""
    defined_by: dict[str, set[str]] = {}
    for name, mod in modules.items():
        for n in mod.defined:
            defined_by.setdefault(n, set()).add(name)
    found = set()
    for name, mod in modules.items():
        for target in mod.private_imports:
            owner = resolve(modules, target.rpartition(".")[0])
            if owner is not None and owner != name:
                found.add((name, target))
        for attr in mod.private_attributes:
            if attr not in mod.defined and defined_by.get(attr, set()) - {name}:
                found.add((name, f".{attr}"))
    return found


# ---- the checkers can fail ------------------------------------------------------------------


def _tree(sources: dict[str, str]) -> dict[str, Module]:
    return {name: read_module(name, src) for name, src in sources.items()}


def test_the_reader_sees_every_form_of_import() -> None:
    mod = read_module("engram_core.services.memory", (
        "import duckdb\n"
        "from engram_core.store.duckdb.store import DuckDBStore\n"
        "from engram_core.store import duckdb as engine\n"
        "from . import lifecycle\n"
        "from ..crypto.keyvault import FileKeyVault, _SLOT\n"
        "def late():\n    from engram_core.policy.embedded import EmbeddedPolicyEngine\n"
    ))
    assert mod.imports == [
        ("duckdb", ()), ("engram_core.store.duckdb.store", ("DuckDBStore",)), ("engram_core.store", ("duckdb",)),
        ("engram_core.services", ("lifecycle",)), ("engram_core.crypto.keyvault", ("FileKeyVault", "_SLOT")),
        ("engram_core.policy.embedded", ("EmbeddedPolicyEngine",)),
    ]
    assert mod.private_imports == ["engram_core.crypto.keyvault._SLOT"]


def test_a_service_importing_an_implementation_is_seen() -> None:
    modules = _tree({
        "engram_core.services.a": "from engram_core.store.duckdb.store import DuckDBStore\nimport duckdb\n",
        "engram_core.services.b": "from engram_core.crypto.keyvault import FileKeyVault, KeyVault\n",
        "engram_core.services.c": "def f():\n    from engram_core.policy.opa_rest import OpaRestPolicyEngine\n",
        "engram_core.services.d": "from engram_core.embedding.onnx_minilm import OnnxMiniLMEmbedder\n"
                                  "from engram_core.store.search_index import FIELD_CODE\n",
        "engram_core.services.ok": "from engram_core.store.port import Tx\nfrom engram_core.embedding.port import Embedder\n"
                                   "from engram_core.crypto.keyvault import KeyVault\n",
        "engram_core.rpc.x": "from engram_core.store.duckdb.store import DuckDBStore\n",  # not a service
    })
    assert implementation_imports(modules) == {
        ("engram_core.services.a", "engram_core.store.duckdb.store.DuckDBStore"), ("engram_core.services.a", "duckdb"),
        ("engram_core.services.b", "engram_core.crypto.keyvault.FileKeyVault"),
        ("engram_core.services.c", "engram_core.policy.opa_rest.OpaRestPolicyEngine"),
        ("engram_core.services.d", "engram_core.embedding.onnx_minilm.OnnxMiniLMEmbedder"),
        ("engram_core.services.d", "engram_core.store.search_index.FIELD_CODE"),
    }
    assert engine_importers(modules) == {"engram_core.services.a", "engram_core.rpc.x"}


def test_module_and_package_cycles_and_upward_imports_are_seen() -> None:
    modules = _tree({
        "engram_core.rpc.server": "from engram_core.rpc.maintenance import M\nfrom engram_core.services.core import Core\n",
        "engram_core.rpc.maintenance": "def f():\n    from engram_core.rpc.server import S\n",
        "engram_core.services.core": "from engram_core.store.port import Tx\n",
        "engram_core.store.port": "",
        "engram_core.cli.init": "",
        "engram_core.cli.mcp": "from adapters.mcp.main import main\n",
        "adapters.mcp.main": "from engram_core.rpc import server\nfrom engram_core.app.composition import start_core\n",
        "engram_core.rpc.first_serve": "from engram_core.cli.init import read\n",
        "engram_core.app.composition": "from engram_core.rpc.server import serve\n",
        "engram_core.contract.errors": "from engram_core.services.core import Core\n",  # a shared module reaching up
    })
    graph = edges(modules)
    assert {frozenset(c) for c in cycles(graph)} == {
        frozenset({"engram_core.rpc.server", "engram_core.rpc.maintenance"})}
    assert upward_imports(graph) == [
        ("adapters.mcp.main", "engram_core.app.composition"),
        ("engram_core.contract.errors", "engram_core.services.core"),
        ("engram_core.rpc.first_serve", "engram_core.cli.init"),
    ]
    assert {frozenset(c) for c in cycles(package_graph(graph))} == {
        frozenset({"engram_core.cli", "adapters", "engram_core.rpc", "engram_core.app"})}


def test_private_access_across_modules_is_seen() -> None:
    modules = _tree({
        "engram_core.crypto.keyvault": "_SLOT = 64\nclass V:\n    def __init__(self):\n        self._path = 1\n",
        "engram_core.services.memory": "class M:\n    def _request_digest(self):\n        return self._own\n"
                                       "    def g(self, other):\n        return other._request_digest()\n",
        "engram_core.services.maintenance": "from engram_core.crypto.keyvault import _SLOT\n"
                                            "def f(memory, handler):\n"
                                            "    handler._replace(x=1)\n"  # not ours: a namedtuple's
                                            "    return memory._request_digest(), memory.vault._path\n",
    })
    assert private_access(modules) == {
        ("engram_core.services.maintenance", "engram_core.crypto.keyvault._SLOT"),
        ("engram_core.services.maintenance", "._request_digest"),
        ("engram_core.services.maintenance", "._path"),
    }


def test_the_graph_covers_the_code() -> None:
    modules = read_tree(ROOT)
    assert {"engram_core.services.memory", "engram_core.services.backup", "engram_core.app.composition",
            "engram_core.app.engines", "engram_core.rpc.server", "adapters.mcp.main", "engram_core.cli.mcp"} <= set(modules)
    graph = edges(modules)
    assert "engram_core.rpc.server" in graph["engram_core.app.composition"]
    assert "engram_core.store.port" in graph["engram_core.services.core"]


# ---- the rules hold on the code -------------------------------------------------------------


@pytest.fixture(scope="module")
def modules() -> dict[str, Module]:
    return read_tree(ROOT)


def test_imports_go_down_the_layers(modules: dict[str, Module]) -> None:
    assert upward_imports(edges(modules)) == []


def test_no_module_cycle(modules: dict[str, Module]) -> None:
    assert cycles(edges(modules)) == []


def test_no_package_cycle(modules: dict[str, Module]) -> None:
    assert cycles(package_graph(edges(modules))) == []


def test_services_import_ports_not_implementations(modules: dict[str, Module]) -> None:
    assert implementation_imports(modules) == KNOWN_IMPLEMENTATION_IMPORTS


# The conformance suite's worked example of a target (docs/engines.md) opens the in-memory engine
# by name, as an engine outside this repository would open its own.
CONFORMANCE_EXAMPLE = "engram_core.store.conformance.memory_target"


def test_only_the_engine_registry_names_the_storage_engine(modules: dict[str, Module]) -> None:
    assert engine_importers(modules) == {ENGINE_REGISTRY, CONFORMANCE_EXAMPLE}


def test_no_private_access_across_modules(modules: dict[str, Module]) -> None:
    assert private_access(modules) - THIRD_PARTY_PRIVATE == KNOWN_PRIVATE_ACCESS
