"""The built-in agents: standard library only, so hundreds of runs start fast.

    python -m noisefloor.ladder.agent TASK_FILE                 # chat models
    python -m noisefloor.ladder.agent --completions TASK_FILE   # base models

Reads the task (JSON: task_id, prompt, entry_point) and asks the provider at $OPENAI_BASE_URL.
The chat agent asks `/chat/completions` for an implementation and retries once when the call
fails or the answer holds no code block (the seed study's one-retry structure). A base model
continues text far better than it follows instructions, so the completions agent sends the
signature and docstring themselves to `/completions` and stops where the function ends (the next
top-level `def`, `class`, `if __name__` or `print`); it retries once when the call fails. Both
print the final answer.

NF_AGENT_TEMPERATURE (default 0.7) and NF_AGENT_MAX_TOKENS set the sampling; NF_AGENT_MODEL the
model name; NF_AGENT_PROMPT_SUFFIX is appended to the prompt (a changed agent, for a gate). NF_AGENT_NOISE=1 makes the agent add a random line to its prompt: an agent that
changes its requests, which a strict replay must catch.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
import uuid
from typing import Any

SYSTEM = "You are a careful Python programmer. Answer with one fenced python code block."
STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\n```"]  # where a completed function ends


def _post(base: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    body = {"model": os.environ.get("NF_AGENT_MODEL", "nf-builtin-1"),
            "temperature": float(os.environ.get("NF_AGENT_TEMPERATURE", "0.7")), **body}
    if os.environ.get("NF_AGENT_MAX_TOKENS"):
        body["max_tokens"] = int(os.environ["NF_AGENT_MAX_TOKENS"])
    req = urllib.request.Request(base.rstrip("/") + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json",
                                          "authorization": "Bearer " + os.environ.get("OPENAI_API_KEY", "sk-none")})
    with urllib.request.urlopen(req, timeout=float(os.environ.get("NF_AGENT_HTTP_TIMEOUT", "60"))) as resp:  # noqa: S310
        return json.load(resp)


def ask_chat(base: str, prompt: str) -> str:
    doc = _post(base, "/chat/completions", {"messages": [{"role": "system", "content": SYSTEM},
                                                         {"role": "user", "content": prompt}]})
    return doc["choices"][0]["message"]["content"] or ""


def ask_completion(base: str, prompt: str) -> str:
    doc = _post(base, "/completions", {"prompt": prompt, "stop": STOP})
    return prompt + (doc["choices"][0]["text"] or "")


def main(argv: list[str]) -> int:
    completions = argv[:1] == ["--completions"]
    task = json.loads(open(argv[-1]).read())
    if completions:
        prompt = task["prompt"]
    else:
        prompt = f"Complete this Python function. Return the whole function.\n\n{task['prompt']}"
    if os.environ.get("NF_AGENT_PROMPT_SUFFIX") and not completions:
        prompt = f"{prompt}\n\n{os.environ['NF_AGENT_PROMPT_SUFFIX']}"
    if os.environ.get("NF_AGENT_NOISE"):
        prompt = f"# request {uuid.uuid4()}\n{prompt}" if completions else f"{prompt}\n# request {uuid.uuid4()}"
    base = os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1")
    answer, error = "", None
    for _ in range(2):  # one retry
        try:
            answer = ask_completion(base, prompt) if completions else ask_chat(base, prompt)
            error = None
        except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
            error = exc
            continue
        if completions or "```" in answer:
            break
    if error is not None and not answer:
        print(f"agent: request failed: {error}", file=sys.stderr)
        return 1
    print(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
