"""The built-in tool-calling client: standard library only, run in the executor's thread (or as
a script: `python ladder/agent_tools.py TASK_FILE`). It asks `/chat/completions` at
$OPENAI_BASE_URL the task's question with the task's tools in the OpenAI tool schema (native
tool calling) and prints the tool calls it got as JSON. The temperature is the proxy's to impose.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping


def run(task: dict, env: Mapping[str, str]) -> tuple[int, str, str]:
    base = env.get("OPENAI_BASE_URL", "https://api.openai.com/v1")
    body = {"model": env.get("NF_AGENT_MODEL", "nf-builtin-1"), "temperature": 1.0,
            "messages": [{"role": "user", "content": task["prompt"]}], "tools": task.get("tools", [])}
    req = urllib.request.Request(base.rstrip("/") + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json",
                                          "authorization": "Bearer " + env.get("OPENAI_API_KEY", "sk-none")})
    error = None
    for _ in range(2):  # one retry of a failed call
        try:
            with urllib.request.urlopen(req, timeout=float(env.get("NF_AGENT_HTTP_TIMEOUT", "60"))) as resp:  # noqa: S310
                doc = json.load(resp)
            calls = doc["choices"][0]["message"].get("tool_calls") or []
            return 0, json.dumps(calls) + "\n", ""
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            error = exc
    return 1, "", f"tools agent: request failed: {error}\n"


def main(argv: list[str]) -> int:
    code, out, err = run(json.loads(open(argv[-1]).read()), os.environ)
    sys.stdout.write(out)
    sys.stderr.write(err)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
