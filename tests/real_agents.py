"""Four third-party agents, each with one tool, for tests/proxy/test_real_agents.py (run in nfproxy's
wrap form: base URLs and keys from the environment):

    python tests/real_agents.py AGENT [concurrent]

openai-agents (Responses API), pydantic-ai (chat completions), a langgraph ReAct agent (chat
completions, streamed) and smolagents' ToolCallingAgent (which keeps earlier tool calls as text).
The system prompt (NF_SYSTEM), the tool's description (NF_TOOL_DOC) and a suffix of the tool's
result (NF_TOOL_SUFFIX) can be changed from the environment. Prints `RESULT <json>`: the final
answer (or, with `concurrent`, the four answers of four agents run at once).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from typing import Any

SYSTEM = os.environ.get("NF_SYSTEM", "You are a weather assistant. Use the tool.")
TOOL_DOC = os.environ.get("NF_TOOL_DOC", "Get today's weather forecast for a city.")
QUESTIONS = [f"What should I wear today? (traveller {i})" for i in range(4)]


def get_weather(city: str) -> str:
    """Get today's weather forecast for a city."""
    return f"forecast: {city} light rain, 14 C{os.environ.get('NF_TOOL_SUFFIX', '')}"


def openai_agents(questions: list[str]) -> list[str]:
    from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # traces would go to OpenAI's own endpoint, not through the proxy
    tool = function_tool(get_weather, description_override=TOOL_DOC)
    agent = Agent(name="weather", instructions=SYSTEM, tools=[tool], model="gpt-4.1-mini",
                  model_settings=ModelSettings(temperature=0.9))

    async def main() -> list[str]:
        return [str(r.final_output) for r in await asyncio.gather(*(Runner.run(agent, q) for q in questions))]

    return asyncio.run(main())


def pydantic_ai(questions: list[str]) -> list[str]:
    import openai
    from pydantic_ai import Agent, Tool
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(openai_client=openai.AsyncOpenAI(max_retries=0)))
    agent = Agent(model, instructions=SYSTEM, model_settings={"temperature": 0.9},
                  tools=[Tool(get_weather, description=TOOL_DOC)])

    async def main() -> list[str]:
        return [str(r.output) for r in await asyncio.gather(*(agent.run(q) for q in questions))]

    return asyncio.run(main())


def langgraph_react(questions: list[str]) -> list[str]:
    from langchain_core.tools import StructuredTool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    llm = ChatOpenAI(model="gpt-4o-mini", temperature=0.9, streaming=True, max_retries=0)
    tool = StructuredTool.from_function(func=get_weather, name="get_weather", description=TOOL_DOC)
    agent = create_react_agent(llm, [tool], prompt=SYSTEM)

    async def main() -> list[str]:
        runs = await asyncio.gather(*(agent.ainvoke({"messages": [("user", q)]}) for q in questions))
        return [str(r["messages"][-1].content) for r in runs]

    return asyncio.run(main())


def smolagents_agent(questions: list[str]) -> list[str]:
    from concurrent.futures import ThreadPoolExecutor

    from smolagents import OpenAIServerModel, Tool, ToolCallingAgent

    class Weather(Tool):
        name = "get_weather"
        description = TOOL_DOC
        inputs = {"city": {"type": "string", "description": "the city"}}
        output_type = "string"

        def forward(self, city: str) -> str:  # type: ignore[override]
            return get_weather(city)

    def one(q: str) -> str:
        # retry=False: smolagents retries any error whose text holds "429" for minutes (a replay miss's
        # message quotes a request key, which may), and a test run must end when the replay refuses
        model = OpenAIServerModel(model_id="gpt-4o-mini", api_base=os.environ["OPENAI_BASE_URL"],
                                  api_key=os.environ["OPENAI_API_KEY"], temperature=0.9, retry=False,
                                  client_kwargs={"max_retries": 0})
        agent = ToolCallingAgent(tools=[Weather()], model=model, max_steps=4, verbosity_level=0, instructions=SYSTEM)
        return str(agent.run(q))

    with ThreadPoolExecutor(len(questions)) as pool:
        return list(pool.map(one, questions))


AGENTS: dict[str, Callable[[list[str]], list[str]]] = {
    "openai-agents": openai_agents,
    "pydantic-ai": pydantic_ai,
    "langgraph": langgraph_react,
    "smolagents": smolagents_agent,
}


def main(argv: list[str]) -> int:
    questions = QUESTIONS if argv[1:2] == ["concurrent"] else QUESTIONS[:1]
    answers: Any = AGENTS[argv[0]](questions)
    print("RESULT " + json.dumps(answers), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
