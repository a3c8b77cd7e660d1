"""Tools in the generic JSON format: the prompt the model sees, the schema it is held to, the reply parsed."""
import json

import pytest

from specdeploy.serve.schemas import RequestError, parse
from specdeploy.serve.tools import prepare, reply

pytestmark = pytest.mark.unit
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "Weather in Oslo?"}]


def test_required_tools_constrain_to_a_call_and_list_the_tools_in_a_system_message():
    messages, fmt = prepare(ASK, [WEATHER], "required")
    assert messages[0]["role"] == "system" and "get_weather" in messages[0]["content"]
    call = fmt.schema["properties"]["tool_call"]["anyOf"][0]
    assert call["properties"]["name"] == {"const": "get_weather"} and "response" not in json.dumps(fmt.schema)
    auto = prepare(ASK, [WEATHER], "auto")[1].schema
    assert [sorted(s["properties"]) for s in auto["anyOf"]] == [["tool_call"], ["response"]]
    assert prepare(ASK, [WEATHER], "none")[1] is None


def test_replies_become_tool_calls_or_content():
    content, calls = reply('{"tool_call":{"name":"get_weather","arguments":{"city":"Oslo"}}}')
    assert content is None and calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert reply('{"response":"It is sunny."}') == ("It is sunny.", None)
    assert reply('{"tool_call":{"na') == ('{"tool_call":{"na', None)  # cut short by max_tokens


def test_earlier_calls_and_results_are_shown_as_the_model_wrote_them():
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}, {"role": "tool", "tool_call_id": "c1",
                                                                    "content": "12 C, rain"}]
    req = parse({"messages": history, "tools": [WEATHER]}, chat=True, max_context=512)
    assert req.tools and json.loads(req.prompt[2]["content"])["tool_call"]["arguments"] == {"city": "Oslo"}
    assert req.prompt[3] == {"role": "tool", "content": "12 C, rain"}


@pytest.mark.parametrize("body, fragment", [
    ({"tools": "x"}, "non-empty list"),
    ({"tools": [{"type": "function", "function": {}}]}, "each tool"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "not both"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": "get_weather"}}, "tool_choice"),
    ({"tools": [WEATHER], "messages": ASK + [{"role": "assistant", "content": None,
                                              "tool_calls": [{"function": None}]}]}, "tool_calls"),
])
def test_bad_tools_are_refused(body, fragment):
    with pytest.raises(RequestError, match=fragment):
        parse({"messages": ASK, **body}, chat=True, max_context=512)


def test_without_tools_a_template_sees_roles_and_content_only():
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f"}}]},
                     {"role": "user", "content": "ok", "name": "ann"}]
    req = parse({"messages": history}, chat=True, max_context=512)
    assert req.prompt == [{"role": "user", "content": "Weather in Oslo?"}, {"role": "assistant", "content": ""},
                          {"role": "user", "content": "ok"}]
