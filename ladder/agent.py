"""The built-in agents: standard library only. nfladder runs them in its executor's threads
(`--agent builtin` / `--agent completions`: no interpreter to start per run, which in a study of
hundreds of runs was most of its CPU); the same agents run as scripts:

    python -m noisefloor.ladder.agent TASK_FILE                 # chat models
    python -m noisefloor.ladder.agent --completions TASK_FILE   # base models

Each reads the task (task_id, prompt, entry_point) and asks the provider at $OPENAI_BASE_URL.
The chat agent asks `/chat/completions` for an implementation and retries once when the call
fails or the answer holds no code block (the seed study's one-retry structure). A base model
continues text far better than it follows instructions, so the completions agent sends the
signature and docstring themselves to `/completions` and stops where the function ends (the next
top-level `def`, `class`, `if __name__` or `print`); it retries once when the call fails. Both
print the final answer.

NF_AGENT_TEMPERATURE (default 0.7) and NF_AGENT_MAX_TOKENS set the sampling; NF_AGENT_MODEL the
model name; NF_AGENT_PROMPT_SUFFIX is appended to the prompt (a changed agent, for a gate), on
every task or, with NF_AGENT_PROMPT_SUFFIX_TASKS (comma-separated ids), on those only.
NF_AGENT_CUT_TASKS (comma-separated ids) changes the agent downstream of the model on those tasks:
its answer keeps only the first line of the code (the compare demo's candidate; requests unchanged).
NF_AGENT_NOISE=1 makes the agent add a random line to its prompt: an agent that changes its
requests, which a strict replay must catch.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from noisefloor.ladder.agent_http import FAILURES, Outcome, post, script_main

SYSTEM = "You are a careful Python programmer. Answer with one fenced python code block."
STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\n```"]  # where a completed function ends


def _sampled(env: Mapping[str, str], body: dict[str, Any]) -> dict[str, Any]:
    body = {"model": env.get("NF_AGENT_MODEL", "nf-builtin-1"),
            "temperature": float(env.get("NF_AGENT_TEMPERATURE", "0.7")), **body}
    if env.get("NF_AGENT_MAX_TOKENS"):
        body["max_tokens"] = int(env["NF_AGENT_MAX_TOKENS"])
    return body


def ask_chat(env: Mapping[str, str], prompt: str) -> str:
    doc = post(env, "/chat/completions", _sampled(env, {"messages": [{"role": "system", "content": SYSTEM},
                                                                      {"role": "user", "content": prompt}]}))
    return doc["choices"][0]["message"]["content"] or ""


def ask_completion(env: Mapping[str, str], prompt: str) -> str:
    doc = post(env, "/completions", _sampled(env, {"prompt": prompt, "stop": STOP}))
    return prompt + (doc["choices"][0]["text"] or "")


def _prompt(task: dict, env: Mapping[str, str], completions: bool) -> str:
    if completions:
        prompt = task["prompt"]
    else:
        prompt = f"Complete this Python function. Return the whole function.\n\n{task['prompt']}"
    if env.get("NF_AGENT_PROMPT_SUFFIX") and not completions and _listed(task, env, "NF_AGENT_PROMPT_SUFFIX_TASKS"):
        prompt = f"{prompt}\n\n{env['NF_AGENT_PROMPT_SUFFIX']}"
    if env.get("NF_AGENT_NOISE"):
        import uuid

        prompt = f"# request {uuid.uuid4()}\n{prompt}" if completions else f"{prompt}\n# request {uuid.uuid4()}"
    return prompt


def _listed(task: dict, env: Mapping[str, str], name: str) -> bool:
    """Whether a per-task change applies: the task is in `name`'s list, or the list is not set."""
    ids = env.get(name)
    return ids is None or str(task.get("task_id")) in ids.split(",")


def _cut(answer: str) -> str:
    """The answer with its code cut to the first line (a broken post-processing step)."""
    head, fence, rest = answer.partition("```python\n")
    return f"{head}{fence}{rest.splitlines()[0] if rest.strip() else ''}\n```\n" if fence else answer


def _answer(task: dict, env: Mapping[str, str], completions: bool) -> Outcome:
    prompt = _prompt(task, env, completions)
    answer, error = "", None
    for _ in range(2):  # one retry
        try:
            answer = ask_completion(env, prompt) if completions else ask_chat(env, prompt)
            error = None
        except FAILURES as exc:
            error = exc
            continue
        if completions or "```" in answer:
            break
    if error is not None and not answer:
        return 1, "", f"agent: request failed: {error}\n"
    if env.get("NF_AGENT_CUT_TASKS") and _listed(task, env, "NF_AGENT_CUT_TASKS"):
        answer = _cut(answer)
    return 0, answer + "\n", ""


def run(task: dict, env: Mapping[str, str]) -> Outcome:
    """The chat agent once: (exit status, stdout, stderr), as the script would give them."""
    return _answer(task, env, completions=False)


def run_completions(task: dict, env: Mapping[str, str]) -> Outcome:
    """The completions agent once, as `run`."""
    return _answer(task, env, completions=True)


def main(argv: list[str]) -> int:
    return script_main(run_completions if argv[:1] == ["--completions"] else run, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
