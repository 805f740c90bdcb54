"""Tool names come from one place (engram_core/contract/tools.py), and that place says what SPEC §5 says.

The literal names below are the contract's: the tests that drive the MCP tools by name spell
them out on purpose (they are the public interface scripts outside the project call), and this
file ties those spellings to the constants. Product code names a tool only through the
constants: a string literal equal to a tool name anywhere else in ``engram_core`` or
``adapters`` fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from engram_core.contract import tools

ROOT = Path(__file__).resolve().parents[2]
CONTRACT_NAMES = ("engram_memory_search", "engram_memory_get", "engram_memory_capture",
                  "engram_memory_request_admission", "engram_memory_withdraw", "engram_memory_forget")
# Where a tool name may still be a literal, and why:
PROSE = "adapters/mcp/guidance.py"  # the agents' guide keys its prose by name; its keys are checked below
LEAD_OWNED = "engram_core/services/quotas.py"  # quota metric per tool: moves with issue 27's replica-safe quotas


def literal_tool_names(source: str) -> list[tuple[int, str]]:
    """(line, name) of every string constant in ``source`` that equals a tool name."""
    names = set(tools.TOOL_NAMES)
    return [(node.lineno, node.value) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names]


def test_the_constants_are_the_contracts_names_in_tools_list_order() -> None:
    assert tools.TOOL_NAMES == CONTRACT_NAMES
    assert (tools.SEARCH_TOOL, tools.GET_TOOL, tools.CAPTURE_TOOL, tools.ADMISSION_TOOL, tools.WITHDRAW_TOOL,
            tools.FORGET_TOOL) == CONTRACT_NAMES
    assert tools.GATED_TOOLS == {"engram_memory_withdraw", "engram_memory_forget"}
    assert tools.READ_TOOLS | tools.GATED_TOOLS | tools.CONFIRMED_ON_POLICY == set(CONTRACT_NAMES)
    assert set(tools.TARGET_FIELD) == set(CONTRACT_NAMES)


def test_the_checker_finds_a_spelled_out_name() -> None:
    source = 'X = "engram_memory_forget"\ndef f():\n    return {"engram_memory_get": 1}\nY = f"engram_memory_{1}"\n'
    assert literal_tool_names(source) == [(1, "engram_memory_forget"), (3, "engram_memory_get")]
    assert literal_tool_names('"""engram_memory_forget in prose"""\nfrom engram_core.contract.tools import FORGET_TOOL\n') == []


def _product_files() -> list[Path]:
    files = [p for base in ("engram_core", "adapters") for p in sorted((ROOT / base).rglob("*.py"))
             if "_gen" not in p.parts]
    return [p for p in files if p.relative_to(ROOT).as_posix() not in ("engram_core/contract/tools.py", PROSE, LEAD_OWNED)]


@pytest.mark.parametrize("path", _product_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_product_code_names_tools_through_the_constants(path: Path) -> None:
    assert literal_tool_names(path.read_text(encoding="utf-8")) == [], "import the name from engram_core.contract.tools"


def test_the_guide_and_the_quota_table_name_exactly_the_tools() -> None:
    from adapters.mcp.guidance import TOOL_DESCRIPTIONS, TOOL_TITLES
    from engram_core.services.quotas import TOOL_METRIC

    assert set(TOOL_DESCRIPTIONS) == set(TOOL_TITLES) == set(tools.TOOL_NAMES)
    assert set(TOOL_METRIC) <= set(tools.TOOL_NAMES)
