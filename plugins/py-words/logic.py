"""The `py_words` tool's logic, in plain Python: it imports nothing componentize-py generates,
so `python3 -m unittest` tests it natively. `app.py` connects it to keel's WIT.

Errors are exceptions of a kind (`InvalidInput`, `UnknownTool`); `app.py` turns each into the
matching case of the ABI's `tool-error`, which the model reads with its kind.
"""

import json

TOOL = "py_words"
DESCRIPTION = "Counts the words and characters of `text` (a Python plugin)."
SCHEMA = json.dumps({
    "type": "object",
    "properties": {
        "text": {"type": "string", "minLength": 1, "description": "The text to count."},
    },
    "required": ["text"],
})


class InvalidInput(Exception):
    """The input does not fit the tool's schema; the model should correct it."""


class UnknownTool(Exception):
    """The plugin has no tool of this name."""


class InvalidConfig(Exception):
    """The plugin's configuration is not a JSON object."""


def read_config(config: str) -> dict:
    """The configuration (a JSON object as text) as a dict."""
    try:
        value = json.loads(config)
    except ValueError as e:
        raise InvalidConfig(f"the configuration is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise InvalidConfig("the configuration must be a JSON object")
    return value


def count(text: str) -> dict:
    """Words and characters of `text`."""
    return {"chars": len(text), "words": len(text.split())}


def run(name: str, input: str) -> str:
    """Run the tool `name` with its JSON `input`; the result is JSON text for the model."""
    if name != TOOL:
        raise UnknownTool(f"no such tool: {name}")
    try:
        value = json.loads(input)
    except ValueError as e:
        raise InvalidInput(f"the input is not JSON: {e}") from None
    text = value.get("text") if isinstance(value, dict) else None
    if not isinstance(text, str):
        raise InvalidInput("the input needs a string field `text`")
    if not text:
        raise InvalidInput("`text` is empty; send the text to count")
    return json.dumps(count(text), sort_keys=True, separators=(",", ":"))
