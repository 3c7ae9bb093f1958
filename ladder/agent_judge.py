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

import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping


def run(task: dict, env: Mapping[str, str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of one judge call, as the script would give them."""
    base = env.get("OPENAI_BASE_URL", "https://api.openai.com/v1")
    body = {"model": env.get("NF_JUDGE_MODEL", "nf-builtin-1"), "temperature": 1.0,
            "max_tokens": int(env.get("NF_JUDGE_MAX_TOKENS", "400")),
            "messages": [{"role": "user", "content": task["prompt"]}]}
    req = urllib.request.Request(base.rstrip("/") + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json",
                                          "authorization": "Bearer " + env.get("OPENAI_API_KEY", "sk-none")})
    error = None
    for _ in range(2):  # one retry of a failed call; an unparseable reply is kept, not retried
        try:
            with urllib.request.urlopen(req, timeout=float(env.get("NF_AGENT_HTTP_TIMEOUT", "60"))) as resp:  # noqa: S310
                doc = json.load(resp)
            return 0, (doc["choices"][0]["message"]["content"] or "") + "\n", ""
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            error = exc
    return 1, "", f"judge: request failed: {error}\n"


def main(argv: list[str]) -> int:
    code, out, err = run(json.loads(open(argv[-1]).read()), os.environ)
    sys.stdout.write(out)
    sys.stderr.write(err)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
