"""What the built-in stdlib clients (chat, completions, judge, tools) share: one JSON POST to
$OPENAI_BASE_URL, one chat call with one retry, and the script entry point. Standard library
only, so each client still runs as a plain script."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

Outcome = tuple[int, str, str]  # (exit status, stdout, stderr), as the script would give them
FAILURES = (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError)  # a failed or broken call


def post(env: Mapping[str, str], path: str, body: dict[str, Any]) -> dict[str, Any]:
    """One POST of `body` to $OPENAI_BASE_URL + `path`; the decoded JSON answer."""
    base = env.get("OPENAI_BASE_URL", "https://api.openai.com/v1")
    req = urllib.request.Request(base.rstrip("/") + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json",
                                          "authorization": "Bearer " + env.get("OPENAI_API_KEY", "sk-none")})
    with urllib.request.urlopen(req, timeout=float(env.get("NF_AGENT_HTTP_TIMEOUT", "60"))) as resp:  # noqa: S310
        return json.load(resp)


def chat_message(body: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """The first choice's message for `body` at $OPENAI_BASE_URL/chat/completions; one retry of a
    failed call. Raises ValueError when both tries fail."""
    error: Exception | None = None
    for _ in range(2):
        try:
            message = post(env, "/chat/completions", body)["choices"][0]["message"]
            if not isinstance(message, dict):
                raise TypeError("message is not an object")
            return message
        except FAILURES as exc:
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
