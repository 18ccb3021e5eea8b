"""Drives `sandgym proxy` with the official openai client, as an agent with its own loop would.

Usage: python openai_through_proxy.py BASE_URL. Makes one plain and one streamed chat completion
(tools offered, token ids and logprobs asked as vLLM takes them) and prints what the client got,
as JSON, for test/integration/model-proxy.test.ts to compare with the proxy's records.
"""

import json
import sys

import openai

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "exec",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
MESSAGES = [
    {"role": "system", "content": "You are a test."},
    {"role": "user", "content": "List the files."},
]


def main() -> None:
    client = openai.OpenAI(base_url=sys.argv[1], api_key="client-key-not-for-records", max_retries=0)
    extra = {"return_token_ids": True, "return_tokens_as_token_ids": True}
    plain = client.chat.completions.create(
        model="fake", messages=MESSAGES, tools=TOOLS, logprobs=True, extra_body=extra
    )
    choice = plain.choices[0]
    out = {
        "plain": {
            "content": choice.message.content,
            "calls": [[c.id, c.function.name, c.function.arguments] for c in choice.message.tool_calls or []],
            "logprobs": [t.logprob for t in choice.logprobs.content],
            "usage": [plain.usage.prompt_tokens, plain.usage.completion_tokens],
        }
    }
    content, calls = "", {}
    usage = None
    stream = client.chat.completions.create(
        model="fake",
        messages=MESSAGES,
        tools=TOOLS,
        logprobs=True,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
    )
    for chunk in stream:
        if chunk.usage:
            usage = [chunk.usage.prompt_tokens, chunk.usage.completion_tokens]
        for c in chunk.choices:
            content += c.delta.content or ""
            for call in c.delta.tool_calls or []:
                known = calls.setdefault(call.index, ["", "", ""])
                known[0] += call.id or ""
                known[1] += (call.function and call.function.name) or ""
                known[2] += (call.function and call.function.arguments) or ""
    out["streamed"] = {"content": content, "calls": [calls[i] for i in sorted(calls)], "usage": usage}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
