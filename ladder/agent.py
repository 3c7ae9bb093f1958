"""The built-in agent: standard library only, so hundreds of runs start fast.

    python -m noisefloor.ladder.agent TASK_FILE

Reads the task (JSON: task_id, prompt, entry_point), asks the chat-completions endpoint at
$OPENAI_BASE_URL for an implementation at temperature 0.7, and retries once when the call fails
or the answer holds no code block (the seed study's one-retry structure). Prints the final answer.
NF_AGENT_MAX_TOKENS caps the answer length. NF_AGENT_NOISE=1 makes it add a random line to its prompt: an agent that changes its requests,
which a strict replay must catch.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
import uuid

SYSTEM = "You are a careful Python programmer. Answer with one fenced python code block."


def ask(base: str, prompt: str) -> str:
    body = {"model": os.environ.get("NF_AGENT_MODEL", "nf-builtin-1"), "temperature": 0.7,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]}
    if os.environ.get("NF_AGENT_MAX_TOKENS"):
        body["max_tokens"] = int(os.environ["NF_AGENT_MAX_TOKENS"])
    req = urllib.request.Request(base.rstrip("/") + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json",
                                          "authorization": "Bearer " + os.environ.get("OPENAI_API_KEY", "sk-none")})
    with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 - the configured endpoint
        return json.load(resp)["choices"][0]["message"]["content"] or ""


def main() -> int:
    task = json.loads(open(sys.argv[1]).read())
    prompt = f"Complete this Python function. Return the whole function.\n\n{task['prompt']}"
    if os.environ.get("NF_AGENT_NOISE"):
        prompt += f"\n# request {uuid.uuid4()}"
    base = os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1")
    answer, error = "", None
    for _ in range(2):  # one retry
        try:
            answer = ask(base, prompt)
            error = None
        except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
            error = exc
            continue
        if "```" in answer:
            break
    if error is not None and not answer:
        print(f"agent: request failed: {error}", file=sys.stderr)
        return 1
    print(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
