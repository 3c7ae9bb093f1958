"""Recordings in and out: a store as HAR 1.2 (for other tools) or as JSON Lines (a reviewable diff
in a pull request), and traffic from HAR or mitmproxy flows into a store.

Import goes through the recorder, so an imported exchange is keyed, numbered and stored exactly as
one recorded through the proxy, secrets erased on the way in (credential headers and query
parameters redacted, their values erased from both bodies). A HAR nfproxy exported carries the
wire bytes, labels and stream chunk layout in `_noisefloor` fields, so export, import and strict
replay give back the same answers.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qsl, urlsplit

from noisefloor.errors import InputError
from noisefloor.proxy.headers import header
from noisefloor.proxy.keys import Rules
from noisefloor.proxy.recorder import Recorder
from noisefloor.proxy.store import Exchange, Store
from noisefloor.proxy.traffic import LABEL_HEADERS, Labels, RequestData, ResponseData

HAR_CREATOR = {"name": "nfproxy", "version": "1"}
LABEL_FIELDS = ("session", "task", "replicate", "condition")
MAX_HAR_BYTES = 4 << 30


class TransferError(InputError):
    """A file that cannot be imported; the message names the entry and the fix."""


# -- export --------------------------------------------------------------------------------------


def _iso(t: float | None) -> str:
    return datetime.fromtimestamp(t or 0, UTC).isoformat().replace("+00:00", "Z")


def _text_or_base64(data: bytes, encoded: bool) -> tuple[str, str | None]:
    if not encoded:
        try:
            return data.decode("utf-8"), None
        except UnicodeDecodeError:
            pass
    return base64.b64encode(data).decode(), "base64"


def _har_headers(headers: Iterable[Any]) -> list[dict[str, str]]:
    return [{"name": str(k), "value": str(v)} for k, v in headers]


def har_entry(store: Store, ex: Exchange) -> dict[str, Any]:
    """One exchange as a HAR entry; bodies are the stored bytes (as on the wire)."""
    req = ex.request
    body = store.body(req.get("body")) or b""
    text, enc = _text_or_base64(body, bool(header(req["headers"], "content-encoding")))
    request: dict[str, Any] = {
        "method": req["method"], "url": req["url"], "httpVersion": "HTTP/1.1", "cookies": [],
        "headers": _har_headers(req["headers"]),
        "queryString": [{"name": k, "value": v} for k, v in parse_qsl(urlsplit(req["url"]).query)],
        "headersSize": -1, "bodySize": len(body),
    }
    if body:
        request["postData"] = {"mimeType": header(req["headers"], "content-type") or "", "text": text,
                               **({"_encoding": enc} if enc else {})}
    nf: dict[str, Any] = {k: getattr(ex, k) for k in (*LABEL_FIELDS, "id", "key", "occurrence", "seq", "mode",
                                                      "model", "error", "end", "notes")}
    entry: dict[str, Any] = {"startedDateTime": _iso(ex.time),
                             "time": ex.latency_ms if ex.latency_ms is not None else 0,
                             "request": request, "cache": {},
                             "timings": {"send": 0, "wait": ex.latency_ms or 0, "receive": 0},
                             "_noisefloor": nf}
    resp = ex.response
    if resp is None:
        entry["response"] = {"status": 0, "statusText": "", "httpVersion": "HTTP/1.1", "cookies": [], "headers": [],
                             "content": {"size": 0, "mimeType": ""}, "redirectURL": "", "headersSize": -1,
                             "bodySize": -1, "_error": ex.error}
        return entry
    rbody = store.body(resp.get("body")) or b""
    rtext, renc = _text_or_base64(rbody, bool(header(resp["headers"], "content-encoding")))
    content: dict[str, Any] = {"size": len(rbody), "mimeType": header(resp["headers"], "content-type") or ""}
    if rbody:
        content["text"] = rtext
        if renc:
            content["encoding"] = renc
    entry["response"] = {"status": resp["status"], "statusText": "", "httpVersion": "HTTP/1.1", "cookies": [],
                         "headers": _har_headers(resp["headers"]), "content": content, "redirectURL": "",
                         "headersSize": -1, "bodySize": len(rbody)}
    nf["wire"] = True  # bodies are the stored (still content-encoded) bytes
    if resp.get("chunks") is not None:
        nf["chunks"] = resp["chunks"]
        nf["partial"] = resp.get("partial", False)
    return entry


def selected(store: Store, session: str | None, mode: str | None) -> Iterator[Exchange]:
    for ex in store.exchanges():
        if (session is None or ex.session == session) and (mode is None or ex.mode == mode):
            yield ex


def export_har(store: Store, out: IO[str], *, session: str | None = None, mode: str | None = "record") -> int:
    """Write a HAR document, entry by entry (the store is never held in memory whole)."""
    out.write('{"log": {"version": "1.2", "creator": ' + json.dumps(HAR_CREATOR) + ', "pages": [], "entries": [\n')
    n = 0
    for ex in selected(store, session, mode):
        out.write((",\n" if n else "") + json.dumps(har_entry(store, ex), ensure_ascii=False))
        n += 1
    out.write("\n]}}\n")
    return n


def _readable(store: Store, part: dict[str, Any]) -> Any:
    data = store.decoded_body(part)
    if not data:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}
    try:
        return json.loads(text)
    except ValueError:
        return text


def jsonl_line(store: Store, ex: Exchange) -> dict[str, Any]:
    """One exchange for review: labels, key, both bodies decoded; no times (they change every run)."""
    doc: dict[str, Any] = {k: getattr(ex, k) for k in (*LABEL_FIELDS, "key", "occurrence", "mode", "model",
                                                       "finish_reason", "error")}
    doc["request"] = {"method": ex.request["method"], "url": ex.request["url"], "headers": ex.request["headers"],
                      "body": _readable(store, ex.request)}
    if ex.response is not None:
        doc["response"] = {"status": ex.response["status"], "headers": ex.response["headers"],
                           "body": _readable(store, ex.response)}
    return doc


def export_jsonl(store: Store, out: IO[str], *, session: str | None = None, mode: str | None = "record") -> int:
    n = 0
    for ex in selected(store, session, mode):
        out.write(json.dumps(jsonl_line(store, ex), ensure_ascii=False, sort_keys=True) + "\n")
        n += 1
    return n


# -- import --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Incoming:
    """One exchange to import, from whatever file it came."""

    method: str
    url: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    started: float
    status: int | None  # None: no response (a failed connection)
    response_headers: tuple[tuple[str, str], ...] = ()
    response_body: bytes = b""
    ended: float | None = None
    latency_ms: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    layout: tuple[tuple[float, int], ...] | None = None
    partial: bool = False
    error: str | None = None


@dataclass(frozen=True)
class ImportResult:
    exchanges: int
    sessions: tuple[str, ...]


def import_into(path: str | os.PathLike[str], items: Iterable[Incoming], session: str,
                rules: Rules | None = None) -> ImportResult:
    """Record `items` into the store at `path` (created if new) as the proxy would have."""
    rules = rules or Rules()
    sessions: list[str] = []
    n = 0
    with Store.open(path, write=True, create=True) as store:
        store.lock_for_recording()
        recorder = Recorder(store, rules)
        for item in items:
            labels_found = {k.lower(): v for k, v in item.headers if k.lower() in LABEL_HEADERS}
            headers = tuple((k, v) for k, v in item.headers if k.lower() not in LABEL_HEADERS)
            labels = Labels(session).overlay(labels_found)
            given = {k: v for k, v in item.labels.items() if k in LABEL_FIELDS and v is not None}
            if given:
                labels = replace(labels, **{k: str(v) for k, v in given.items()})
            parts = urlsplit(item.url)
            if not parts.scheme or not parts.hostname:
                raise TransferError(f"exchange {n + 1}: {item.url!r} is not an absolute URL")
            request = RequestData(item.method.upper(), item.url, parts.hostname,
                                  parts.path + (f"?{parts.query}" if parts.query else ""), headers, item.body,
                                  arrived=item.started)
            response = None
            if item.status is not None:
                response = ResponseData(item.status, item.response_headers, item.response_body, item.layout,
                                        item.partial)
            pending = recorder.begin(request, labels)
            recorder.finish(pending, response, error=item.error, latency_ms=item.latency_ms,
                            notes=["imported"], end=item.ended if item.ended is not None else item.started)
            if labels.session not in sessions:
                sessions.append(labels.session)
            n += 1
    return ImportResult(n, tuple(sessions))


def _b(text: str | None, encoding: str | None, where: str) -> bytes:
    if not text:
        return b""
    if encoding == "base64":
        try:
            return base64.b64decode(text, validate=True)
        except ValueError:
            raise TransferError(f"{where}: text is not valid base64") from None
    return text.encode("utf-8", "surrogatepass")


def _pairs(items: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(items, list) or not all(isinstance(h, dict) and "name" in h for h in items):
        raise TransferError(f"{where}: headers must be a list of {{name, value}}")
    return tuple((str(h["name"]), str(h.get("value", ""))) for h in items)


def _started(value: Any, where: str) -> float:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise TransferError(f"{where}: startedDateTime {value!r} is not an ISO 8601 time") from None


_DECODED_DROP = ("content-encoding", "content-length")


def har_items(path: Path) -> Iterator[Incoming]:
    """The entries of a HAR file. An entry nfproxy did not export holds decoded bodies (what
    browsers save): its Content-Encoding and Content-Length are dropped to match."""
    if path.stat().st_size > MAX_HAR_BYTES:
        raise TransferError(f"{path} is over {MAX_HAR_BYTES >> 30} GB; split it before importing")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        entries = doc["log"]["entries"]
    except (ValueError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise TransferError(f"{path} is not a HAR file ({exc.__class__.__name__}: {exc}); export one as HAR 1.2") \
            from None
    if not isinstance(entries, list):
        raise TransferError(f"{path}: log.entries is not a list")
    for i, e in enumerate(entries, 1):
        where = f"{path} entry {i}"
        try:
            req, resp = e["request"], e.get("response") or {}
            nf = e.get("_noisefloor") or {}
            wire = bool(nf.get("wire"))
            post = req.get("postData") or {}
            headers = _pairs(req.get("headers", []), where)
            rheaders = _pairs(resp.get("headers", []), where)
            if not wire:
                rheaders = tuple((k, v) for k, v in rheaders if k.lower() not in _DECODED_DROP)
            content = resp.get("content") or {}
            started = _started(e["startedDateTime"], where)
            elapsed = float(e.get("time") or 0)
            status = int(resp.get("status") or 0)
            layout = nf.get("chunks")
            yield Incoming(
                method=str(req["method"]), url=str(req["url"]), headers=headers,
                body=_b(post.get("text"), post.get("_encoding") or post.get("encoding"), where),
                started=started, status=status or None, response_headers=rheaders,
                response_body=_b(content.get("text"), content.get("encoding"), where),
                ended=float(nf["end"]) if nf.get("end") is not None else started + elapsed / 1000,
                latency_ms=elapsed if elapsed >= 0 else None,
                labels={k: nf[k] for k in LABEL_FIELDS if nf.get(k) is not None},
                layout=tuple((float(t), int(n)) for t, n in layout) if layout is not None else None,
                partial=bool(nf.get("partial")), error=nf.get("error") or resp.get("_error") if not status else None)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, TransferError):
                raise
            raise TransferError(f"{where} is incomplete ({exc.__class__.__name__}: {exc}); "
                                "each entry needs request.method, request.url and startedDateTime") from None
