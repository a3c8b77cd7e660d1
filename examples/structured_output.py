"""A device that must get valid JSON every time: a schema through the openai client's `parse`, then a tool call.

    specdeploy serve engine.plan &
    python examples/structured_output.py http://127.0.0.1:8000/v1

The server holds decoding to the schema (speculation stays on and exact), so the reply always
parses; a tool call's arguments always match the tool's parameters.
"""
import json
import sys
from typing import Literal

from openai import OpenAI
from pydantic import BaseModel, Field


class Command(BaseModel):
    device: Literal["lamp", "fan", "heater"]
    action: Literal["on", "off", "dim"]
    level: int = Field(ge=0, le=100)


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}}


def main(base_url: str) -> None:
    client = OpenAI(base_url=base_url, api_key="not-needed")
    reply = client.chat.completions.parse(
        model="specdeploy", response_format=Command, max_tokens=64, temperature=0,
        messages=[{"role": "user", "content": "Dim the lamp to thirty percent."}])
    command = reply.choices[0].message.parsed
    print(f"command: {command.device} {command.action} {command.level}")

    reply = client.chat.completions.create(
        model="specdeploy", tools=[WEATHER_TOOL], tool_choice="required", max_tokens=64, temperature=0,
        messages=[{"role": "user", "content": "Is it raining in Bergen?"}])
    call = reply.choices[0].message.tool_calls[0]
    print(f"tool call: {call.function.name}({json.loads(call.function.arguments)})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/v1")
