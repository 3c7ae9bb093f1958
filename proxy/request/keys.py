"""Canonical form and content address of a request.

The key must not move when nothing that matters moved (JSON key order, whitespace, transfer
compression, a rotated API key, an SDK retry counter) and must move when anything the model sees
moved. The rule set that decides this has its own identity, stored with every recording, so a
replay under different rules is refused instead of silently missing or, worse, silently hitting.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from noisefloor.errors import InputError, NoisefloorError
from noisefloor.proxy import providers
from noisefloor.proxy.request import secrets

RULES_VERSION = 2

# What main keyed with before the providers package: its rules id is still accepted, since the
# keys it produced are the keys produced now (KEYING_VERSION 1 is that keying).
_V1_PROFILES = {"openai": ["/user", "/prompt_cache_key", "/safety_identifier"],
                "openai-responses": ["/user", "/prompt_cache_key", "/safety_identifier"],
                "anthropic": ["/metadata/user_id"], "gemini": [], "generic": []}
_V1_SECRET_QUERY_PARAMS = ["access_token", "api-key", "api_key", "apikey", "key", "token"]

# Headers kept in every key, whatever the provider: the version headers of the providers there
# were when the rules id took this form. Part of the id, so frozen: a provider's own version
# headers (`Provider.version_headers`) are kept in its requests' keys on top of these.
DEFAULT_HEADER_ALLOWLIST: tuple[str, ...] = ("anthropic-beta", "anthropic-version", "openai-beta")


class RuleError(InputError):
    """A normalization rule that cannot be applied (bad JSON pointer)."""


@dataclass(frozen=True)
class Rules:
    """The normalization rule set; its `id` is stored with a recording."""

    header_allowlist: tuple[str, ...] = DEFAULT_HEADER_ALLOWLIST
    ignore_fields: tuple[str, ...] = ()
    profile: str | None = None  # forced provider profile; None: picked per request from host and path

    def __post_init__(self) -> None:
        for pointer in self.ignore_fields:
            parse_pointer(pointer)
        if self.profile is not None and self.profile not in providers.PROVIDERS:
            raise RuleError(f"unknown profile {self.profile!r}; choose one of {', '.join(providers.PROVIDERS)}")
        object.__setattr__(self, "header_allowlist", tuple(sorted({h.lower() for h in self.header_allowlist})))
        object.__setattr__(self, "ignore_fields", tuple(sorted(set(self.ignore_fields))))

    @classmethod
    def described(cls, description: Any) -> Rules | None:
        """The rule set a stored description (`describe`) names, or None when it is not one this
        version rebuilds (a store's own, read back: merge's comparison, an index's repair)."""
        try:
            return cls(tuple(description["header_allowlist"]), tuple(description["ignore_fields"]),
                       description.get("profile"))
        except (TypeError, KeyError, ValueError, AttributeError, NoisefloorError):
            return None

    def keyed_by(self) -> dict[str, Any]:
        """Only what moves keys: the id is made of this. Providers' own keying is one version
        number (`providers.KEYING_VERSION`), so adding a provider, or changing what metadata one
        extracts, leaves every store's id as it was."""
        return {
            "version": RULES_VERSION,
            "header_allowlist": list(self.header_allowlist),
            "ignore_fields": list(self.ignore_fields),
            "secret_query_params": sorted(secrets.SECRET_QUERY_PARAMS),
            "profile": self.profile,
            "keying": providers.KEYING_VERSION,
        }

    def describe(self) -> dict[str, Any]:
        """The id's parts, and for people the ignored fields of each provider (not hashed)."""
        return {**self.keyed_by(), "providers": {p.name: list(p.ignore_fields) for p in providers.PROVIDERS.values()}}

    @cached_property
    def id(self) -> str:
        return sha256_hex(canonical_json(self.keyed_by()))[:16]

    @cached_property
    def legacy_ids(self) -> tuple[str, ...]:
        """Ids of earlier rule-id schemes that produce the same keys (stores recorded by them replay)."""
        if providers.KEYING_VERSION != 1 or self.profile not in (None, *_V1_PROFILES):
            return ()
        v1 = {"version": 1, "header_allowlist": list(self.header_allowlist), "ignore_fields": list(self.ignore_fields),
              "secret_query_params": _V1_SECRET_QUERY_PARAMS, "profile": self.profile, "profiles": _V1_PROFILES}
        return (sha256_hex(canonical_json(v1))[:16],)


@dataclass(frozen=True)
class CanonicalRequest:
    method: str
    host: str
    path: str
    query: tuple[tuple[str, str], ...]
    headers: tuple[tuple[str, str], ...]
    body: Any
    body_kind: str  # "json", "raw" or "empty"
    notes: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "host": self.host,
            "path": self.path,
            "query": [list(p) for p in self.query],
            "headers": dict(self.headers),
            "body_kind": self.body_kind,
            "body": self.body,
        }

    @cached_property
    def text(self) -> str:
        return canonical_json(self.as_dict())

    @cached_property
    def key(self) -> str:
        return sha256_hex(self.text)

    def pretty(self) -> str:
        """Line-oriented rendering used for the nearest-request diff."""
        return json.dumps(self.as_dict(), sort_keys=True, indent=1, ensure_ascii=False)


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(data: str | bytes) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def parse_pointer(pointer: str) -> list[str]:
    """RFC 6901 JSON pointer to tokens; `*` matches every member or element."""
    if pointer == "":
        raise RuleError("an empty JSON pointer would drop the whole body; name a field such as /metadata/user_id")
    if not pointer.startswith("/"):
        raise RuleError(f"JSON pointer {pointer!r} must start with '/', e.g. /metadata/request_id")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


@lru_cache(maxsize=256)
def _tokens(pointer: str) -> tuple[str, ...]:
    return tuple(parse_pointer(pointer))


def drop_pointer(doc: Any, tokens: Sequence[str]) -> Any:
    """`doc` without the addressed field(s), copied only where something is dropped; missing
    paths are ignored."""
    if not tokens:
        return doc
    head, rest = tokens[0], tokens[1:]
    if isinstance(doc, dict):
        names = list(doc) if head == "*" else [head] if head in doc else []
        if not names:  # nothing to drop: no copy (the common case for per-provider fields)
            return doc
        out = dict(doc)
        for name in names:
            if rest:
                out[name] = drop_pointer(out[name], rest)
            else:
                del out[name]
        return out
    if isinstance(doc, list):
        if head == "*":
            idx = range(len(doc))
        elif head.isdigit() and int(head) < len(doc):
            idx = [int(head)]
        else:
            return doc
        out_list = list(doc)
        if not rest:
            dropped = set(idx)
            return [v for i, v in enumerate(out_list) if i not in dropped]
        for i in idx:
            out_list[i] = drop_pointer(out_list[i], rest)
        return out_list
    return doc


def canonicalize(
    method: str,
    host: str,
    path_and_query: str,
    headers: Iterable[tuple[str, str]],
    body: bytes,
    rules: Rules,
) -> CanonicalRequest:
    """Build the canonical request from an already decoded body."""
    provider = providers.pick(rules.profile, host, path_and_query)
    parts = urlsplit(path_and_query)
    query = tuple(
        sorted(
            (k, v)
            for k, v in parse_qsl(parts.query, keep_blank_values=True)
            if k.lower() not in secrets.SECRET_QUERY_PARAMS
        )
    ) if parts.query else ()
    allow = {*rules.header_allowlist, *provider.version_headers}
    kept = tuple(sorted((k.lower(), v.strip()) for k, v in headers if k.lower() in allow))
    notes: list[str] = []
    if not body:
        kind, value = "empty", None
    else:
        try:
            parsed = json.loads(body)
        except (UnicodeDecodeError, ValueError, RecursionError):
            parsed = _NOT_JSON
        if parsed is _NOT_JSON:
            kind, value = "raw", _raw(body)
            notes.append("body is not JSON; keyed on its raw bytes")
        else:
            kind = "json"
            for pointer in (*rules.ignore_fields, *provider.ignore_fields):
                parsed = drop_pointer(parsed, _tokens(pointer))
            value = parsed
    canon = CanonicalRequest(
        method=method.upper(),
        host=host.lower().split(":")[0] if not host.startswith("[") else host.lower(),
        path=parts.path or "/",
        query=query,
        headers=kept,
        body=value,
        body_kind=kind,
        notes=tuple(notes),
    )
    try:
        canon.key  # noqa: B018 - computed now: a body that cannot be hashed as JSON is keyed on its bytes
    except (UnicodeEncodeError, ValueError, RecursionError) as exc:
        note = f"JSON body cannot be canonicalized ({exc.__class__.__name__}); keyed on its raw bytes"
        canon = replace(canon, body=_raw(body), body_kind="raw", notes=(*canon.notes, note))
    return canon


def _raw(body: bytes) -> dict[str, Any]:
    return {"sha256": sha256_hex(body), "size": len(body)}


_NOT_JSON = object()
