"""Tool calls (OpenAI's `tools` / `tool_choice`) in one format every model can follow, valid by construction.

A small model's native tool-call syntax differs by family and is often missing from its template
(SmolLM2's has none), so tools go the way llama.cpp's generic handler takes them: a system message
lists the tools and asks for a JSON object, and decoding is constrained to a JSON Schema of exactly
that object: {"tool_call": {"name": <one of the tools>, "arguments": <that tool's parameters>}}, or,
where `tool_choice` is "auto", {"response": "<text>"}. The arguments therefore always parse and
match the tool's schema; the reply becomes `tool_calls` (one call a reply) or plain content.
"""
from __future__ import annotations

import json
import uuid

from ..config import ResponseFormat
from ..errors import ConfigError  # schemas.parse answers it with a 400

INSTRUCTIONS = ("You can call these tools (JSON Schema of each one's arguments):\n{tools}\n"
                "Reply with one JSON object: {{\"tool_call\": {{\"name\": <tool name>, \"arguments\": {{...}}}}}} "
                "to call a tool{or_answer}.")


def _functions(tools) -> list[dict]:
    if not isinstance(tools, list) or not tools:
        raise ConfigError("'tools' must be a non-empty list of {\"type\": \"function\", \"function\": {...}}")
    out = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ConfigError("each tool must be {\"type\": \"function\", \"function\": {\"name\": ..., "
                               "\"parameters\": {JSON Schema}}}")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ConfigError(f"tool '{fn['name']}': 'parameters' must be a JSON Schema object")
        out.append({"name": fn["name"], "description": fn.get("description", ""), "parameters": params})
    return out


def _choice(tool_choice, names: list[str]) -> str | None:
    """"auto", "required", or the one tool's name; None for "none"."""
    if tool_choice in (None, "auto", "required"):
        return tool_choice or "auto"
    if tool_choice == "none":
        return None
    fn = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if name not in names:
        raise ConfigError(f"'tool_choice' must be \"auto\", \"required\", \"none\" or "
                           f"{{\"type\": \"function\", \"function\": {{\"name\": one of {names}}}}}")
    return name


def _call_schema(fn: dict) -> dict:
    return {"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
            "properties": {"name": {"const": fn["name"]}, "arguments": fn["parameters"]}}


def schema(functions: list[dict], choice: str) -> dict:
    """The JSON Schema a reply is constrained to."""
    chosen = [f for f in functions if choice in ("auto", "required", f["name"])]
    calls = {"type": "object", "additionalProperties": False, "required": ["tool_call"],
             "properties": {"tool_call": {"anyOf": [_call_schema(f) for f in chosen]}}}
    if choice != "auto":
        return calls
    answer = {"type": "object", "additionalProperties": False, "required": ["response"],
              "properties": {"response": {"type": "string"}}}
    return {"anyOf": [calls, answer]}


def _history(messages: list[dict]) -> list[dict]:
    """Earlier tool calls and results as the text the model saw and would write."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if m.get("role") == "assistant" and calls:
            fn = calls[0].get("function") if isinstance(calls, list) and isinstance(calls[0], dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise ConfigError("an assistant message's 'tool_calls' must be [{\"type\": \"function\", "
                                   "\"function\": {\"name\": ..., \"arguments\": \"{...}\"}}]")
            arguments = fn.get("arguments", "{}")
            try:
                arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
            except json.JSONDecodeError:
                raise ConfigError("an assistant message's tool_calls arguments are not valid JSON") from None
            m = {"role": "assistant", "content": json.dumps({"tool_call": {"name": fn.get("name"),
                                                                           "arguments": arguments}})}
        out.append({"role": m["role"], "content": m.get("content") or ""})
    return out


def prepare(messages: list[dict], tools, tool_choice) -> tuple[list[dict], ResponseFormat | None]:
    """The messages with the tools' system message, and the reply's constraint (None: tools not used)."""
    functions = _functions(tools)
    choice = _choice(tool_choice, [f["name"] for f in functions])
    if choice is None:
        return _history(messages), None
    listed = json.dumps([{k: f[k] for k in ("name", "description", "parameters")} for f in functions])
    text = INSTRUCTIONS.format(tools=listed, or_answer=", or {\"response\": <your answer>} to answer directly"
                               if choice == "auto" else "")
    history = _history(messages)
    if history and history[0]["role"] == "system":
        history[0] = {"role": "system", "content": history[0]["content"] + "\n\n" + text}
    else:
        history.insert(0, {"role": "system", "content": text})
    return history, ResponseFormat("json_schema", schema=schema(functions, choice))


def reply(text: str) -> tuple[str | None, list[dict] | None]:
    """(content, tool_calls) of a constrained reply; a reply cut short by max_tokens stays text."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return text, None
    if isinstance(obj, dict) and isinstance(obj.get("tool_call"), dict):
        call = obj["tool_call"]
        return None, [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                       "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}]
    if isinstance(obj, dict) and isinstance(obj.get("response"), str):
        return obj["response"], None
    return text, None
