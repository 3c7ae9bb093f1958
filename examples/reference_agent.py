"""A reference agent using the official `openai` SDK, with the seed study's one-retry structure.

    OPENAI_BASE_URL=... OPENAI_API_KEY=... python examples/reference_agent.py TASK_FILE

NF_AGENT_MODEL and NF_AGENT_TEMPERATURE choose the model and temperature (gpt-4o-mini, 0.7);
NF_AGENT_PROMPT_SUFFIX is appended to the prompt (a changed agent, for README's gate step).

It works unchanged against nfladder's built-in provider, a local OpenAI-compatible server
(llama.cpp, vLLM, ...), or a hosted API: everything it needs comes from the environment that
nfladder (or nfproxy wrapping a command) sets. The task file is JSON with task_id, prompt and
entry_point. The answer is printed; nfverify grades what the proxy recorded, not this output.
"""

from __future__ import annotations

import json
import os
import sys

import openai


def main() -> int:
    task = json.loads(open(sys.argv[1]).read())
    client = openai.OpenAI(max_retries=0, timeout=120)
    prompt = f"Complete this Python function. Return the whole function in one python code block.\n\n{task['prompt']}"
    if os.environ.get("NF_AGENT_PROMPT_SUFFIX"):  # a changed agent, as a gate compares it with the unchanged one
        prompt += "\n\n" + os.environ["NF_AGENT_PROMPT_SUFFIX"]
    answer = ""
    for attempt in range(2):  # an initial failure may trigger one retry
        try:
            r = client.chat.completions.create(
                model=os.environ.get("NF_AGENT_MODEL", "gpt-4o-mini"),
                temperature=float(os.environ.get("NF_AGENT_TEMPERATURE", "0.7")),
                messages=[{"role": "user", "content": prompt}],
            )
            answer = r.choices[0].message.content or ""
        except openai.APIError as exc:
            print(f"attempt {attempt}: {exc.__class__.__name__}: {exc}", file=sys.stderr)
            continue
        if "```" in answer:
            break
    if not answer:
        return 1
    print(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
