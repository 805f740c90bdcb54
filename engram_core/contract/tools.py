"""The six agent tools' names (SPEC §5), and what is fixed per tool: the argument naming its
target and whether a human always confirms it.

Every module that names a tool imports it from here: the core's services and servicers, the
schemas and their examples, the MCP adapter, the benchmarks and the test helpers.
``tests/unit/test_tool_names.py`` pins the names to the contract and fails on a tool name
spelled anywhere else in ``engram_core`` or ``adapters``. The names are a public interface:
renaming one is a contract change, not a refactor.
"""

from __future__ import annotations

SEARCH_TOOL = "engram_memory_search"
GET_TOOL = "engram_memory_get"
CAPTURE_TOOL = "engram_memory_capture"
ADMISSION_TOOL = "engram_memory_request_admission"
WITHDRAW_TOOL = "engram_memory_withdraw"
FORGET_TOOL = "engram_memory_forget"

# In the order tools/list presents them.
TOOL_NAMES: tuple[str, ...] = (SEARCH_TOOL, GET_TOOL, CAPTURE_TOOL, ADMISSION_TOOL, WITHDRAW_TOOL, FORGET_TOOL)

READ_TOOLS = frozenset({SEARCH_TOOL, GET_TOOL})
# SPEC §8: withdraw and forget always need a human confirmation; capture and admission when the
# policy says so for the host and tenant.
GATED_TOOLS = frozenset({WITHDRAW_TOOL, FORGET_TOOL})
CONFIRMED_ON_POLICY = frozenset({CAPTURE_TOOL, ADMISSION_TOOL})

# Which argument names the target of each tool (None: no target; capture has none yet).
TARGET_FIELD: dict[str, str | None] = {
    SEARCH_TOOL: None,
    GET_TOOL: "record_id",
    CAPTURE_TOOL: None,
    ADMISSION_TOOL: "candidate_id",
    WITHDRAW_TOOL: "candidate_id",
    FORGET_TOOL: "record_id",
}
