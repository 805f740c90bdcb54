"""Build hook for non-editable installs (`pip install .`, wheels): the generated protobuf
stubs and the bundled policy directory go into the package, since a wheel carries neither
proto/ nor policies/. Editable installs (tools/setup) keep using the source tree."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithStubsAndPolicies(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        package = Path(self.build_lib) / "engram_core"
        spec = importlib.util.spec_from_file_location("_engram_protogen", ROOT / "engram_core" / "protogen.py")
        assert spec is not None and spec.loader is not None
        protogen = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(protogen)
        protogen.generate(ROOT / "proto", package / "_gen")
        shutil.copytree(ROOT / "policies", package / "bundled_policies", dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildPyWithStubsAndPolicies})
