"""Unit tests of the tool's logic, natively: `python3 -m unittest` in this directory."""

import json
import unittest

import logic


class ToolTest(unittest.TestCase):
    def test_counts_words_and_characters(self):
        out = logic.run(logic.TOOL, json.dumps({"text": "hello keel world"}))
        self.assertEqual(json.loads(out), {"chars": 16, "words": 3})

    def test_a_text_that_is_not_a_string_is_invalid_input(self):
        with self.assertRaises(logic.InvalidInput) as caught:
            logic.run(logic.TOOL, json.dumps({"text": 3}))
        self.assertIn("`text`", str(caught.exception))

    def test_an_empty_text_is_invalid_input(self):
        with self.assertRaises(logic.InvalidInput) as caught:
            logic.run(logic.TOOL, json.dumps({"text": ""}))
        self.assertIn("empty", str(caught.exception))

    def test_input_that_is_not_json_is_invalid_input(self):
        with self.assertRaises(logic.InvalidInput):
            logic.run(logic.TOOL, "{not json")

    def test_another_tool_name_is_unknown(self):
        with self.assertRaises(logic.UnknownTool):
            logic.run("other_tool", "{}")

    def test_the_schema_requires_text(self):
        self.assertEqual(json.loads(logic.SCHEMA)["required"], ["text"])

    def test_a_config_that_is_not_an_object_is_refused(self):
        self.assertEqual(logic.read_config("{}"), {})
        with self.assertRaises(logic.InvalidConfig):
            logic.read_config("[1]")


if __name__ == "__main__":
    unittest.main()
