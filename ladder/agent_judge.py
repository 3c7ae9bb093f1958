"""The judge client: standard library only. It runs in the executor's own thread (no interpreter
to start per repeat: a judge study makes R x tasks x temperatures calls), or as a script:

    python ladder/agent_judge.py TASK_FILE

The task file's prompt is the whole judge prompt (task, frozen candidate, example checks); the
client sends it to `/chat/completions` at $OPENAI_BASE_URL and prints the reply as it came. The
temperature is the proxy's to impose (the judge condition's override); NF_JUDGE_MODEL names the
model, NF_JUDGE_MAX_TOKENS bounds the reply (the seed's first judge run lost most verdicts to a
small bound, so the default is generous).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from noisefloor.ladder.agent_http import chat_message, script_main


def run(task: dict, env: Mapping[str, str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of one judge call, as the script would give them."""
    body = {"model": env.get("NF_JUDGE_MODEL", "nf-builtin-1"), "temperature": 1.0,
            "max_tokens": int(env.get("NF_JUDGE_MAX_TOKENS", "400")),
            "messages": [{"role": "user", "content": task["prompt"]}]}
    try:
        message = chat_message(body, env)
    except ValueError as exc:
        return 1, "", f"judge: {exc}\n"
    return 0, (message.get("content") or "") + "\n", ""



def main(argv: list[str]) -> int:
    return script_main(run, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
