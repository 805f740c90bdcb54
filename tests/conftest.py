"""Session-wide test fixtures: the PostgreSQL cluster the PostgreSQL tests run on (``pg_cluster.py``),
and the engine legs of the core-level suites (``core_engines.py``).

The cluster starts on first use only, so a run that needs no PostgreSQL starts none; a test
that needs it and finds PostgreSQL 15 missing fails (never skips), saying to run tools/setup.

A test that starts a core through ``stores`` (per test) or ``module_stores`` (per module), or
through a fixture that does (``core``, ``fresh_core``, ...), runs once per engine, its id naming
the engine (``test_x[duckdb]``, ``test_x[postgresql]``). A test about DuckDB itself (its file,
its lock, its group commit, its migrations) is marked ``@pytest.mark.duckdb_only(reason=...)``:
it then runs on DuckDB only, and its reason is shown in the collection report.

Hypothesis (property tests) runs under the ``engram`` profile: no example database (a failure
must be reproducible from the CI log alone, not from a ``.hypothesis`` directory left on one
machine) and the failing example's blob printed. Every run has one seed, given with
``--hypothesis-seed=N`` or else drawn at start, printed in the report's header (and again after
a failure): rerunning with that option generates the same examples.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import hypothesis
import hypothesis.core
import pytest

import engram_core.policy.compiled as policy_compiled
from tests.support import file_costs
from tests.support.core_engines import DUCKDB, ENGINES, EngineStores
from tests.support.pg_cluster import Database, PgCluster, PostgresMissing, start_cluster

hypothesis.settings.register_profile("engram", database=None, print_blob=True)
hypothesis.settings.load_profile("engram")

# A test process opens hundreds of cores over a few bundles in turn (the bundled one, and
# per-test variants of it, each on both engines): keep a few contents' compiled engines
# beyond the last one, instead of compiling each again when a test comes back to it.
policy_compiled.REGISTRY.keep_unheld = 4


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "duckdb_only(reason): a test about the DuckDB engine itself: no PostgreSQL leg (say why)")
    _hypothesis_seed(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The most expensive files first (``tests/support/file_costs.py``): under ``--dist loadfile``
    xdist hands files out in this order, and a long file started last would hold the run's end."""
    items[:] = file_costs.order(items, file_costs.load())


_recorder: file_costs.Recorder | None = None


def pytest_sessionstart(session: pytest.Session) -> None:
    # ENGRAM_TEST_COSTS=PATH records this run's cost per file (the order above comes from such a
    # record). Under xdist the controller records: every worker's reports arrive there.
    global _recorder
    path = os.environ.get("ENGRAM_TEST_COSTS")
    if path and not hasattr(session.config, "workerinput"):
        _recorder = file_costs.Recorder(Path(path))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _recorder is not None:
        _recorder.add(report.nodeid, report.duration)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _recorder is not None:
        _recorder.write()


def _hypothesis_seed(config: pytest.Config) -> int | str:
    """The run's Hypothesis seed: ``--hypothesis-seed`` if given, else one drawn now and set as
    Hypothesis's pytest plugin sets the option's (``hypothesis.core.global_force_seed``, which
    every ``@given`` test then draws from), so that the printed seed reproduces the run."""
    given = config.getoption("hypothesis_seed", None)
    worker_input = getattr(config, "workerinput", None)  # an xdist worker: the controller's seed
    if worker_input is not None and worker_input.get("engram_hypothesis_seed") is not None:
        given = worker_input["engram_hypothesis_seed"]
        config.option.hypothesis_seed = given
    if given is None:
        given = str(secrets.randbelow(2**32))
        config.option.hypothesis_seed = given  # as if given: the plugin, configured before or after, agrees
    seed: int | str = given
    try:
        seed = int(given)
    except ValueError:
        pass  # as the plugin: any string seeds too
    hypothesis.core.global_force_seed = seed
    return seed


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: object) -> None:
    """xdist (``tools/test`` runs the suite on worker processes): every worker draws from the
    controller's seed, so the one seed printed reproduces the whole run."""
    node.workerinput["engram_hypothesis_seed"] = node.config.getoption("hypothesis_seed")  # type: ignore[attr-defined]


def _seed_line(config: pytest.Config) -> str:
    seed = config.getoption("hypothesis_seed")
    return f"hypothesis seed: {seed} (rerun with --hypothesis-seed={seed})"


def pytest_report_header(config: pytest.Config) -> str:
    return _seed_line(config)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    # The header is thousands of lines above the failures in a whole-suite log.
    if terminalreporter.stats.get("failed") or terminalreporter.stats.get("error"):
        terminalreporter.write_line(_seed_line(config))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The engine legs: every test whose cores come from ``stores``/``module_stores`` runs on each
    engine, unless it is marked ``duckdb_only`` with its reason."""
    if "store_engine" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("duckdb_only")
    engines: tuple[str, ...] = ENGINES
    if marker is not None:
        if not (marker.kwargs.get("reason") or marker.args):
            raise pytest.UsageError(f"{metafunc.definition.nodeid}: duckdb_only needs a reason")
        engines = (DUCKDB,)
    metafunc.parametrize("store_engine", engines, indirect=True, scope="module")


@pytest.fixture(scope="module")
def store_engine(request: pytest.FixtureRequest) -> str:
    """The store engine of this leg (``duckdb`` or ``postgresql``): parametrized by
    pytest_generate_tests. (Not ``engine``: tests/policy names its policy engine so.)"""
    return str(request.param)


def _engine_stores(engine: str, request: pytest.FixtureRequest) -> Iterator[EngineStores]:
    # The cluster is asked for on the PostgreSQL leg only: a DuckDB run starts none.
    cluster = request.getfixturevalue("pg_cluster") if engine != DUCKDB else None
    made = EngineStores(engine, cluster)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def stores(store_engine: str, request: pytest.FixtureRequest) -> Iterator[EngineStores]:
    """The stores of this test's cores on the leg's engine (a database per data directory, dropped after)."""
    yield from _engine_stores(store_engine, request)


@pytest.fixture(scope="module")
def module_stores(store_engine: str, request: pytest.FixtureRequest) -> Iterator[EngineStores]:
    """As ``stores``, for a module-scoped core (its database lives as long as the module)."""
    yield from _engine_stores(store_engine, request)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    try:
        cluster = start_cluster()
    except PostgresMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    # Clients in this process find the password where libpq looks for it; processes the tests
    # start are given the same environment (Database.env).
    previous = os.environ.get("PGPASSFILE")
    os.environ["PGPASSFILE"] = str(cluster.passfile)
    try:
        yield cluster
    finally:
        if previous is None:
            os.environ.pop("PGPASSFILE", None)
        else:
            os.environ["PGPASSFILE"] = previous
        cluster.destroy()


@pytest.fixture
def pg_database(pg_cluster: PgCluster) -> Iterator[Database]:
    """A fresh, empty database of the session's cluster, dropped after the test."""
    db = pg_cluster.create_database()
    try:
        yield db
    finally:
        pg_cluster.drop_database(db)
