"""Who a request belongs to: the session, task, replicate and condition an agent run labels its
requests with, by header or by a path prefix for agents whose headers cannot be set."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from urllib.parse import unquote

LABEL_HEADERS = {
    "x-nf-session": "session",
    "x-nf-task": "task",
    "x-nf-replicate": "replicate",
    "x-nf-condition": "condition",
    "x-nf-replay-from": "replay_from",
}
# Labels can also ride in a path prefix, for agents whose headers cannot be set but whose base URL
# can: /_nf/session=s1,task=HumanEval%2F0,replicate=2/v1/chat/completions
LABEL_PREFIX = "/_nf/"


@dataclass(frozen=True)
class Labels:
    """Who a request belongs to: one session is one agent run (task x replicate x condition)."""

    session: str
    task: str | None = None
    replicate: str | None = None
    condition: str | None = None
    replay_from: str | None = None  # replay: answer only from this recorded session

    def overlay(self, headers: Mapping[str, str]) -> Labels:
        """Per-request label headers win over the proxy-wide defaults."""
        found = {attr: headers[h] for h, attr in LABEL_HEADERS.items() if headers.get(h)}
        return replace(self, **found) if found else self


def split_label_prefix(path: str) -> tuple[dict[str, str], str]:
    """Labels from a `/_nf/k=v,k=v` path prefix, and the path without it."""
    if not path.startswith(LABEL_PREFIX):
        return {}, path
    head, _, rest = path[len(LABEL_PREFIX):].partition("/")
    labels = {}
    for part in head.split(","):
        k, sep, v = part.partition("=")
        if sep and f"x-nf-{k.replace('_', '-')}" in LABEL_HEADERS:
            labels[f"x-nf-{k.replace('_', '-')}"] = unquote(v)
    return labels, "/" + rest
