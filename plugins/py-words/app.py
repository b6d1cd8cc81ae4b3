"""keel plugin `py-words`: the `py_words` tool, written in Python.

`keel plugin build` makes it a component with componentize-py against keel's WIT (the world
`tool-plugin` of ABI 0.4.0, whose errors say their kind); keel runs it like any other plugin,
in its sandbox, behind the same gates. `keel plugin test` calls its tool from keel-test.toml.

The tool's logic is in `logic.py`, which imports nothing generated, so `python3 -m unittest`
tests it natively; this file only connects it to the WIT bindings, which exist at build time.
"""

import logic
from componentize_py_types import Err
from wit_world import exports
from wit_world.exports import plugin as abi
from wit_world.imports import tools, types


class Plugin(exports.Plugin):
    def activate(self, config: str) -> None:
        try:
            logic.read_config(config)
        except logic.InvalidConfig as e:
            raise Err(abi.ActivateError_InvalidConfig(str(e)))
        try:
            tools.register(types.ToolSpec(
                name=logic.TOOL,
                description=logic.DESCRIPTION,
                input_schema=logic.SCHEMA,
                capabilities=types.ToolCapabilities(0),
                parallel_safe=True,
            ))
        except Err as e:
            raise Err(abi.ActivateError_Failed(f"cannot register `{logic.TOOL}`: {e.value}"))

    def deactivate(self) -> None:
        pass

    def handle_call(self, service: str, method: str, payload: str) -> str:
        raise Err(abi.CallError_UnknownMethod(f"no such service: {service}"))

    def invoke_tool(self, name: str, input: str) -> str:
        try:
            return logic.run(name, input)
        except logic.UnknownTool as e:
            raise Err(abi.ToolError_UnknownTool(str(e)))
        except logic.InvalidInput as e:
            raise Err(abi.ToolError_InvalidInput(str(e)))

    def on_event(self, event: types.Event) -> None:
        pass

    def check_tool_call(self, guard: str, tool: str, input: str) -> types.GuardVerdict:
        return types.GuardVerdict(decision=types.GuardDecision.FORBID, reason="not a guard")
