"""Fixtures for the console's browser tests: one real core (DuckDB) and one `engram console` per
module, one headless Chromium per module (tests/console/console_support.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engram_core.app.composition import start_core
from tests.support.console_support import (
    OTHER,
    TENANT,
    WORKSPACE,
    CoreHand,
    World,
    chrome,
    policies_copy,
    start_console,
)


def _held_for_review(data: dict) -> None:
    # The deployment's own data: acme's asserted captures wait for a person (admission.rego).
    data["engram"]["config"]["tenants"][TENANT] = {"adjudication_trust_classes": ["asserted"]}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("console")
    running = start_core(root / "core", policies_dir=policies_copy(root / "core-policies", _held_for_review),
                         semantic=False)
    hand = CoreHand(running.address, running.host_key_path)
    console = None
    try:
        hand.activate(TENANT, WORKSPACE)
        hand.activate(OTHER, WORKSPACE)
        token_file = root / "host.token"
        token = "local-token-for-the-console-tests-0123456789"
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
        console = start_console(running.address, running.host_key_path, token_file, [f"{TENANT}/{WORKSPACE}"],
                                root / "console.log")
        yield World(running, hand, console, token, token_file, root)
    finally:
        if console is not None:
            console.stop()
        hand.close()
        running.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator:
    driver = chrome()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("screenshots")
    print(f"\nconsole screenshots: {path}")
    return path
