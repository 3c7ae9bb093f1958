"""Small agents written against today's SDKs and frameworks, unchanged, for tests/proxy/test_current_sdks.py.

    python tests/current_sdk_agents.py SDK            # wrap form: base URLs and keys from the environment
    python tests/current_sdk_agents.py SDK BASE_URL   # base-URL form: the proxy's address passed explicitly

Each makes a plain call, a streamed one where the SDK streams against the test upstream, and four
concurrent calls, then prints one line `RESULT <json>` with everything it got back (texts, and
for the raw SDK clients a digest of the response bytes).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
from collections.abc import Callable
from typing import Any

PROMPTS = [f"concurrent question {i}" for i in range(4)]


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def openai_sdk(base: str | None) -> dict[str, Any]:
    import openai

    kw: dict[str, Any] = {"base_url": base + "/v1", "api_key": os.environ["OPENAI_API_KEY"]} if base else {}
    client = openai.OpenAI(max_retries=0, **kw)
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o-mini",
                                                           messages=[{"role": "user", "content": "plain"}])
    out: dict[str, Any] = {"plain": raw.parse().choices[0].message.content, "bytes": digest(raw.http_response.content)}
    stream = client.chat.completions.create(model="gpt-4o-mini", stream=True,
                                            messages=[{"role": "user", "content": "streamed"}])
    out["stream"] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    out["responses"] = client.responses.create(model="gpt-5-mini", input="responses api").output_text

    async def many() -> list[str]:
        async with openai.AsyncOpenAI(max_retries=0, **kw) as aclient:
            calls = [aclient.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": p}])
                     for p in PROMPTS]
            return [r.choices[0].message.content for r in await asyncio.gather(*calls)]

    out["concurrent"] = asyncio.run(many())
    return out


def anthropic_sdk(base: str | None) -> dict[str, Any]:
    import anthropic

    kw: dict[str, Any] = {"base_url": base, "api_key": os.environ["ANTHROPIC_API_KEY"]} if base else {}
    client = anthropic.Anthropic(max_retries=0, **kw)
    ask = {"model": "claude-haiku-4-5", "max_tokens": 64}
    raw = client.messages.with_raw_response.create(messages=[{"role": "user", "content": "plain"}], **ask)
    out: dict[str, Any] = {"plain": raw.parse().content[0].text, "bytes": digest(raw.http_response.content)}
    with client.messages.stream(messages=[{"role": "user", "content": "streamed"}], **ask) as stream:
        out["stream"] = "".join(stream.text_stream)

    async def many() -> list[str]:
        async with anthropic.AsyncAnthropic(max_retries=0, **kw) as aclient:
            calls = [aclient.messages.create(messages=[{"role": "user", "content": p}], **ask) for p in PROMPTS]
            return [r.content[0].text for r in await asyncio.gather(*calls)]

    out["concurrent"] = asyncio.run(many())
    return out


def langchain_openai(base: str | None) -> dict[str, Any]:
    from langchain_openai import ChatOpenAI

    kw: dict[str, Any] = {"base_url": base + "/v1", "api_key": os.environ["OPENAI_API_KEY"]} if base else {}
    llm = ChatOpenAI(model="gpt-4o-mini", temperature=0, max_retries=0, **kw)
    out: dict[str, Any] = {"plain": llm.invoke("plain").content}
    out["stream"] = "".join(str(chunk.content) for chunk in llm.stream("streamed"))
    out["concurrent"] = [m.content for m in asyncio.run(llm.abatch(PROMPTS))]
    return out


def openai_agents(base: str | None) -> dict[str, Any]:
    from agents import Agent, Runner, set_default_openai_client, set_tracing_disabled

    set_tracing_disabled(True)  # traces would go to OpenAI's own endpoint, not through the proxy
    if base:
        import openai

        set_default_openai_client(openai.AsyncOpenAI(base_url=base + "/v1", api_key=os.environ["OPENAI_API_KEY"],
                                                     max_retries=0), use_for_tracing=False)
    agent = Agent(name="helper", instructions="Answer briefly.", model="gpt-5-mini")  # the Responses API

    async def main() -> dict[str, Any]:  # one event loop: the SDK's client keeps its connections
        out: dict[str, Any] = {"plain": (await Runner.run(agent, "plain")).final_output}
        out["concurrent"] = [r.final_output for r in await asyncio.gather(*(Runner.run(agent, p) for p in PROMPTS))]
        return out

    return asyncio.run(main())


def pydantic_ai(base: str | None) -> dict[str, Any]:
    from pydantic_ai import Agent
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.anthropic import AnthropicProvider
    from pydantic_ai.providers.openai import OpenAIProvider

    if base:
        oa = OpenAIProvider(base_url=base + "/v1", api_key=os.environ["OPENAI_API_KEY"])
        an = AnthropicProvider(base_url=base, api_key=os.environ["ANTHROPIC_API_KEY"])
    else:  # the SDK clients read the base URLs nfproxy's wrap form sets
        import anthropic
        import openai

        oa = OpenAIProvider(openai_client=openai.AsyncOpenAI())
        an = AnthropicProvider(anthropic_client=anthropic.AsyncAnthropic())
    chat = Agent(OpenAIChatModel("gpt-4o-mini", provider=oa), instructions="Answer briefly.")
    claude = Agent(AnthropicModel("claude-haiku-4-5", provider=an), instructions="Answer briefly.")

    async def main() -> dict[str, Any]:  # one event loop: the providers' clients keep their connections
        out: dict[str, Any] = {"plain": (await chat.run("plain")).output, "anthropic": (await claude.run("plain")).output}
        async with chat.run_stream("streamed") as streamed:
            out["stream"] = await streamed.get_output()
        out["concurrent"] = [r.output for r in await asyncio.gather(*(chat.run(p) for p in PROMPTS))]
        return out

    return asyncio.run(main())


def google_genai(base: str | None) -> dict[str, Any]:
    from google import genai
    from google.genai import types

    if base:
        client = genai.Client(api_key=os.environ["GEMINI_API_KEY"], http_options=types.HttpOptions(base_url=base))
    else:
        client = genai.Client()  # GEMINI_API_KEY and GOOGLE_GEMINI_BASE_URL from the environment
    out: dict[str, Any] = {"plain": client.models.generate_content(model="gemini-2.5-flash", contents="plain").text}

    async def many() -> list[str]:
        calls = [client.aio.models.generate_content(model="gemini-2.5-flash", contents=p) for p in PROMPTS]
        return [r.text for r in await asyncio.gather(*calls)]

    out["concurrent"] = asyncio.run(many())
    return out


def litellm_router(base: str | None) -> dict[str, Any]:
    import litellm

    kw: dict[str, Any] = {"api_base": base + "/v1", "api_key": os.environ["OPENAI_API_KEY"]} if base else {}
    ask = {"model": "openai/gpt-4o-mini", "temperature": 0, **kw}
    out: dict[str, Any] = {"plain": litellm.completion(messages=[{"role": "user", "content": "plain"}],
                                                       **ask).choices[0].message.content}
    chunks = litellm.completion(messages=[{"role": "user", "content": "streamed"}], stream=True, **ask)
    out["stream"] = "".join(c.choices[0].delta.content or "" for c in chunks)

    async def many() -> list[str]:
        calls = [litellm.acompletion(messages=[{"role": "user", "content": p}], **ask) for p in PROMPTS]
        return [r.choices[0].message.content for r in await asyncio.gather(*calls)]

    out["concurrent"] = asyncio.run(many())
    return out


AGENTS: dict[str, Callable[[str | None], dict[str, Any]]] = {
    "openai": openai_sdk,
    "anthropic": anthropic_sdk,
    "langchain-openai": langchain_openai,
    "openai-agents": openai_agents,
    "pydantic-ai": pydantic_ai,
    "google-genai": google_genai,
    "litellm": litellm_router,
}

if __name__ == "__main__":
    result = AGENTS[sys.argv[1]](sys.argv[2] if len(sys.argv) > 2 else None)
    print("RESULT " + json.dumps(result, sort_keys=True))
