"""What the built-in stdlib clients (judge, tools) share: one chat call with one retry, and the
script entry point. Standard library only, so either client still runs as a plain script."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

Outcome = tuple[int, str, str]  # (exit status, stdout, stderr), as the script would give them


def chat_message(body: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """The first choice's message for `body` at $OPENAI_BASE_URL/chat/completions; one retry of a
    failed call. Raises OSError or ValueError (a broken answer) when both tries fail."""
    base = env.get("OPENAI_BASE_URL", "https://api.openai.com/v1")
    req = urllib.request.Request(base.rstrip("/") + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json",
                                          "authorization": "Bearer " + env.get("OPENAI_API_KEY", "sk-none")})
    error: Exception | None = None
    for _ in range(2):
        try:
            with urllib.request.urlopen(req, timeout=float(env.get("NF_AGENT_HTTP_TIMEOUT", "60"))) as resp:  # noqa: S310
                doc = json.load(resp)
            message = doc["choices"][0]["message"]
            if not isinstance(message, dict):
                raise TypeError("message is not an object")
            return message
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            error = exc
    raise ValueError(f"request failed: {error}")


def script_main(run: Callable[[dict, Mapping[str, str]], Outcome], argv: list[str]) -> int:
    """`python CLIENT.py TASK_FILE`: run once on the task file, print as the inline run returns."""
    import os

    with open(argv[-1]) as f:
        code, out, err = run(json.loads(f.read()), os.environ)
    sys.stdout.write(out)
    sys.stderr.write(err)
    return code
