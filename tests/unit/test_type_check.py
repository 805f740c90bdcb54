"""The store and the services type-check against the ports (mypy, ``mypy.ini``): the kernel calls
nothing of an engine that ``store/engine.py`` does not declare, ``KernelTx`` is a ``Tx`` and the
kernel a ``Store``, and every engine passed as an ``Engine`` has its members (issue 62).

The second test proves the check can fail: the same run over a kernel that calls an engine member
the port does not declare (mypy's ``--shadow-file`` reads the altered copy in the kernel's place)
must report it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNEL = ROOT / "engram_core" / "store" / "kernel.py"


def mypy(cache: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "mypy.ini"),
                           "--cache-dir", str(cache), *extra], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mypy cache for both runs (the second reads the unchanged modules from it)."""
    return tmp_path_factory.mktemp("mypy-cache")


def test_the_store_and_services_type_check_against_the_ports(cache: Path) -> None:
    done = mypy(cache)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "# type: ignore" not in KERNEL.read_text()


def test_a_kernel_call_into_an_undeclared_engine_member_fails_the_check(cache: Path, tmp_path: Path) -> None:
    source = KERNEL.read_text()
    anchor = "    def host_keys_version(self) -> int | None:\n"
    assert anchor in source
    broken = tmp_path / "kernel.py"
    broken.write_text(source.replace(anchor, anchor + "        self.engine.put_page_pin('p', 't', 'w', b'', 0)\n", 1))
    done = mypy(cache, "--shadow-file", str(KERNEL), str(broken))
    assert done.returncode == 1, done.stdout[-4000:]
    assert '"Engine" has no attribute "put_page_pin"' in done.stdout, done.stdout[-4000:]
