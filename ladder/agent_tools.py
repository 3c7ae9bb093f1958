"""The built-in tool-calling client: standard library only, run in the executor's thread (or as
a script: `python ladder/agent_tools.py TASK_FILE`). It asks `/chat/completions` at
$OPENAI_BASE_URL the task's question with the task's tools in the OpenAI tool schema (native
tool calling) and prints the tool calls it got as JSON. The temperature is the proxy's to impose.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping

from noisefloor.ladder.agent_http import chat_message, script_main


def run(task: dict, env: Mapping[str, str]) -> tuple[int, str, str]:
    body = {"model": env.get("NF_AGENT_MODEL", "nf-builtin-1"), "temperature": 1.0,
            "messages": [{"role": "user", "content": task["prompt"]}], "tools": task.get("tools", [])}
    try:
        message = chat_message(body, env)
    except ValueError as exc:
        return 1, "", f"tools agent: {exc}\n"
    return 0, json.dumps(message.get("tool_calls") or []) + "\n", ""



def main(argv: list[str]) -> int:
    return script_main(run, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
