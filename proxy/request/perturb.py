"""Semantics-preserving prompt perturbations of the last user message, for the perturbation floor.

Four named variants (the audit's family; the wording here is this project's own):
- compact_user_request: whitespace runs collapsed to one space, ends trimmed;
- tool_instruction_prefix: a generic line asking to use the provided tools when needed, before;
- request_label_wrap: the request between neutral boundary labels;
- call_only_suffix: a generic line asking for a function call rather than prose, after.
User-defined variants come from a JSON file: {"name": {"prefix": "...", "suffix": "...",
"template": "... {text} ..."}} (template wins when given).

Only the last user turn's text changes; each provider module says where it is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from noisefloor import bounded
from noisefloor.errors import InputError
from noisefloor.proxy import providers
from noisefloor.proxy.providers import Provider, Rewrite

BUILTIN: dict[str, Rewrite] = {
    "compact_user_request": lambda t: re.sub(r"\s+", " ", t).strip(),
    "tool_instruction_prefix": lambda t: "When a provided tool fits the request, use it.\n\n" + t,
    "request_label_wrap": lambda t: "<request>\n" + t + "\n</request>",
    "call_only_suffix": lambda t: t + "\n\nReply with the function call itself, not with prose.",
}


class PerturbError(InputError):
    """An unknown variant or an unreadable variants file."""


def load_variants(path: Path | None) -> dict[str, Rewrite]:
    variants = dict(BUILTIN)
    if path is None:
        return variants
    try:
        with path.open("rb") as fh:
            doc = bounded.loads(bounded.read_capped(fh, str(path), 1 << 20, PerturbError), str(path), PerturbError)
    except OSError as exc:
        raise PerturbError(f"cannot read perturbation file {path}: {exc.strerror}") from None
    if not isinstance(doc, dict):
        raise PerturbError(f"{path}: expected a JSON object of variant name -> {{prefix, suffix, template}}")
    for name, spec in doc.items():
        if not isinstance(spec, dict) or not all(isinstance(spec.get(k, ""), str) for k in ("prefix", "suffix", "template")):
            raise PerturbError(f"{path}: variant {name!r} must be an object whose prefix, suffix or template are strings")
        variants[name] = _from_spec(spec)
    return variants


def _from_spec(spec: Mapping[str, str]) -> Rewrite:
    template = spec.get("template")
    if template is not None:
        if "{text}" not in template:
            raise PerturbError("a perturbation template must contain {text}")
        return lambda t: template.replace("{text}", t)
    prefix, suffix = spec.get("prefix", ""), spec.get("suffix", "")
    return lambda t: prefix + t + suffix


def pick(name: str, variants: Mapping[str, Rewrite]) -> Rewrite:
    if name not in variants:
        raise PerturbError(f"unknown perturbation {name!r}; choose one of {', '.join(sorted(variants))} "
                           "or define it with --perturb-file")
    return variants[name]


def apply(doc: dict[str, Any], rewrite: Rewrite, provider: Provider | None = None) -> dict[str, Any] | None:
    """A copy of the request with its last user text rewritten, or None if it has no user text.
    Where that text is, the request's provider says (default: the first known shape it has)."""
    return providers.rewrite_user(provider or providers.PROVIDERS["generic"], doc, rewrite)
