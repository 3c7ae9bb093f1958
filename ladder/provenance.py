"""The provenance manifest every nfladder report carries (seed 000 §6's release report): what was
run, on what, by which versions, and which recording a replay claim is about.

"Served" is what the answers named; OpenAI-compatible local servers echo the requested name, so
the manifest also keeps what the provider itself listed at /v1/models (asked once per run).
"""

from __future__ import annotations

import hashlib
import json
import urllib.request
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from noisefloor.display import md, visible
from noisefloor.outcome_rows import OutcomeRow

DEPENDENCIES = ("mitmproxy", "numpy", "scipy", "lmdb", "zstandard", "aiohttp", "click")


def provider_models(upstream: str, timeout: float = 5.0) -> dict[str, Any]:
    """What the provider lists at /v1/models: {"models": [...]} or {"error": "..."}; never raises."""
    url = upstream.rstrip("/") + ("/models" if upstream.rstrip("/").endswith("/v1") else "/v1/models")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (the user's own provider URL)
            doc = json.loads(resp.read(1 << 20))
        ids = sorted({str(m.get("id")) for m in doc.get("data", []) if isinstance(m, dict) and m.get("id")})
        return {"url": url, "models": ids}
    except (OSError, ValueError, AttributeError) as exc:
        return {"url": url, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}


def sha256_file(path: Path) -> str | None:
    try:
        h = hashlib.sha256()
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()
    except OSError:
        return None


def recording_id(store_path: Path) -> dict[str, Any]:
    """A content hash of the recording: every recorded exchange's key, occurrence, condition,
    session and response body hash, in a fixed order (independent of arrival order and of the
    store's byte layout), and the rules ids that keyed them."""
    from noisefloor.proxy.store.log import Store

    items, rules = [], set()
    with Store.open(store_path, write=False) as store:
        for ex in store.exchanges():
            if ex.mode != "record":
                continue
            rules.add(ex.rules_id)
            items.append([ex.condition, ex.session, ex.key, ex.occurrence,
                          (ex.response or {}).get("body") if ex.response else None])
    items.sort(key=lambda x: json.dumps(x, default=str))
    digest = hashlib.sha256(json.dumps(items, default=str).encode()).hexdigest()
    return {"recording_id": digest[:32], "recorded_exchanges": len(items), "rules_ids": sorted(r for r in rules if r)}


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def manifest(cfg: Any, rows: Sequence[OutcomeRow], doc: dict[str, Any]) -> dict[str, Any]:
    ids = sorted({t.task_id for t in cfg.tasks})
    by_requested = doc.get("served_by_requested") or {}  # every call of every agent, not only its last
    requested = sorted({r.model for r in rows if r.model} | {k.split(" / ", 1)[1] for k in by_requested})
    served = sorted({r.served_model for r in rows if r.served_model} | {m for v in by_requested.values() for m in v})
    sampling = sorted({json.dumps({"condition": r.condition, "temperature": r.temperature, "top_p": r.top_p,
                                   "seed": r.seed}) for r in rows})
    graders = sorted({r.grader_version for r in rows if r.grader_version})
    rec = recording_id(cfg.out / "log.lmdb")
    settings = doc.get("settings", {})
    return {
        "design": doc.get("design"),
        "task_set": {"tasks": len(ids), "sha256": hashlib.sha256("\n".join(ids).encode()).hexdigest()},
        "dataset": {"path": str(cfg.dataset) if cfg.dataset else None,
                    "sha256": sha256_file(Path(cfg.dataset)) if cfg.dataset else None},
        "models": {"requested": requested, "served": served, "served_by_requested": by_requested,
                   "provider_lists": getattr(cfg, "provider_listing", None)},
        "sampling": [json.loads(s) for s in sampling],
        "grader": graders,
        **rec,
        "coupling": (f"replay results hold for this recording ({rec['recording_id'][:16]}...) under rules "
                     f"{', '.join(rec['rules_ids']) or '-'}: a new recording or new keying rules is a new study"),
        "bootstrap": {"resamples": settings.get("bootstrap"), "seed": settings.get("seed"), "method": "joint task bootstrap (percentile)"},
        "versions": {"noisefloor": _version("noisefloor"), **{d: _version(d) for d in DEPENDENCIES}},
    }


def lines(m: dict[str, Any]) -> list[str]:
    listed = m["models"]["provider_lists"] or {}
    provider = ", ".join(listed.get("models", [])) or listed.get("error", "not asked")
    samp = "; ".join(f"{s['condition']}: T={s['temperature']}" + (f", top_p={s['top_p']}" if s["top_p"] is not None else "")
                     + (f", seed={s['seed']}" if s["seed"] is not None else "") for s in m["sampling"])
    return [
        f"task set: {m['task_set']['tasks']} tasks, sha256 {m['task_set']['sha256'][:16]}...",
        f"dataset: {m['dataset']['path']} (sha256 {(m['dataset']['sha256'] or '-')[:16]}...)",
        f"models requested: {', '.join(m['models']['requested']) or '-'}; served (as answers named them): "
        f"{', '.join(m['models']['served']) or '-'}; the provider lists at /v1/models: {provider}",
        f"sampling: {samp or '-'}",
        f"grader / judge: {', '.join(m['grader']) or '-'}",
        f"recording: {m['recording_id']} ({m['recorded_exchanges']} recorded exchanges); {m['coupling']}",
        f"bootstrap: {m['bootstrap']['resamples']} resamples, seed {m['bootstrap']['seed']}",
        "versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v),
    ]


def text(m: dict[str, Any]) -> str:
    """The manifest for a terminal: model names, paths and the provider's listing come from outside."""
    return "Provenance:\n" + "\n".join(f"  {visible(line)}" for line in lines(m))


def markdown(m: dict[str, Any]) -> str:
    """The manifest as Markdown, every line escaped whole (its outside names can be no markup)."""
    return "## Provenance\n\n" + "\n".join(f"- {md(line)}" for line in lines(m))
