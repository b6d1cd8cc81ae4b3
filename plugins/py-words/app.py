"""keel plugin `py-words`: the `py_words` tool, written in Python.

`keel plugin build` makes it a component with componentize-py against keel's WIT (the world
`tool-plugin`); keel runs it like any other plugin, in its sandbox, behind the same gates.
`keel plugin test` calls its tool from keel-test.toml.
"""

import json

from wit_world import exports
from wit_world.imports import tools, types
from componentize_py_types import Err

TOOL = "py_words"
SCHEMA = json.dumps({
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
})


def count(text: str) -> dict:
    """The tool's logic: words and characters of `text`."""
    return {"chars": len(text), "words": len(text.split())}


class Plugin(exports.Plugin):
    def activate(self, config: str) -> None:
        tools.register(types.ToolSpec(
            name=TOOL,
            description="Counts the words and characters of `text` (a Python plugin).",
            input_schema=SCHEMA,
            capabilities=types.ToolCapabilities(0),
            parallel_safe=True,
        ))

    def deactivate(self) -> None:
        pass

    def handle_call(self, service: str, method: str, payload: str) -> str:
        raise Err(f"no such service: {service}")

    def invoke_tool(self, name: str, input: str) -> str:
        if name != TOOL:
            raise Err(f"no such tool: {name}")
        try:
            text = json.loads(input)["text"]
        except (ValueError, KeyError, TypeError) as e:
            raise Err(f"input needs a string field `text`: {e}")
        return json.dumps(count(text), sort_keys=True, separators=(",", ":"))

    def on_event(self, event: types.Event) -> None:
        pass

    def check_tool_call(self, guard: str, tool: str, input: str) -> types.GuardVerdict:
        return types.GuardVerdict(decision=types.GuardDecision.FORBID, reason="not a guard")
