"""The nfview web app: static assets shipped with the package, JSON read from the source, and
headers that keep recorded text from ever running (a strict Content-Security-Policy, no sniffing).

Read-only by construction: the store is opened without write access, only GET and HEAD are
answered, and a request whose Host is not this loopback address is refused (DNS rebinding).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from noisefloor.display import visible
from noisefloor.errors import NoisefloorError, StateError
from noisefloor.proxy.cli.listing import FilterError
from noisefloor.proxy.store.log import DEFAULT_MAX_BODY, BodyOverLimit, Store
from noisefloor.viewer import grid, pages
from noisefloor.viewer.source import Source, page_rows, read_json, read_outcomes

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "font-src 'none'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
}
ASSETS = {"index.html": "text/html", "app.js": "text/javascript", "style.css": "text/css"}
STORE_KEY = web.AppKey("store", object)
SOURCE_KEY = web.AppKey("source", Source)
HOSTS_KEY = web.AppKey("hosts", set)


def _asset(name: str) -> bytes:
    return resources.files("noisefloor.viewer").joinpath("static", name).read_bytes()


@web.middleware
async def guard(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                ) -> web.StreamResponse:
    hosts = request.app[HOSTS_KEY]
    if hosts and request.host not in hosts:
        resp: web.StreamResponse = web.Response(status=421, text="nfview answers only its own loopback address\n")
    elif request.method not in ("GET", "HEAD"):
        resp = web.Response(status=405, text="nfview is read-only\n")
    else:
        try:
            resp = await handler(request)
        except web.HTTPException as exc:
            resp = web.Response(status=exc.status, text=exc.text or exc.reason, content_type="text/plain")
        except NoisefloorError as exc:  # a store damaged under the viewer: one line, the page says it
            resp = web.Response(status=500, text=str(exc), content_type="text/plain")
    resp.headers.update(SECURITY_HEADERS)
    return resp


def _json(doc: Any, status: int = 200) -> web.Response:
    # `<` escaped too: even a JSON body sniffed as markup holds no tag; a NaN or infinity anywhere (an
    # outcome row or a report may hold one) as the string JSON can hold
    text = json.dumps(_finite(doc), ensure_ascii=False, allow_nan=False, default=str).replace("<", "\\u003c")
    # a lone surrogate (JSON rows may spell one with a \u escape) has no UTF-8: written back as that escape
    return web.Response(body=text.encode("utf-8", "backslashreplace"), status=status, content_type="application/json",
                        charset="utf-8")


def _int(request: web.Request, name: str, default: int) -> int:
    try:
        return max(0, int(request.query.get(name, default)))
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name} must be a whole number") from None


def _store(request: web.Request) -> Store:
    store = request.app[STORE_KEY]
    if store is None:
        raise web.HTTPNotFound(text="this source has no nfproxy store")
    return store  # type: ignore[return-value]


async def index(request: web.Request) -> web.Response:
    return web.Response(body=_asset("index.html"), content_type="text/html", charset="utf-8")


async def asset(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in ASSETS:
        raise web.HTTPNotFound()
    return web.Response(body=_asset(name), content_type=ASSETS[name], charset="utf-8")


async def plot(request: web.Request) -> web.Response:
    path = request.app[SOURCE_KEY].plot(request.match_info["name"])
    if path is None:
        raise web.HTTPNotFound()
    return web.Response(body=path.read_bytes(), content_type="image/png")


TRAJECTORIES_UP_TO = 50_000  # exchanges: a larger store's summary is `nfanalyze STORE`'s (it reads every body)


async def summary(request: web.Request) -> web.Response:
    source = request.app[SOURCE_KEY]
    store: Store | None = request.app[STORE_KEY]  # type: ignore[assignment]
    doc: dict[str, Any] = {"source": source.describe(), "report": None, "gate": None, "store": None}
    if source.report:
        doc["report"] = read_json(source.inside(source.report))
    if source.gate:
        doc["gate"] = read_json(source.inside(source.gate))
    if store is not None:
        doc["store"] = {"exchanges": len(store), "rules_id": store.meta("rules_id"), "format": store.meta("format")}
        if not source.report and len(store) <= TRAJECTORIES_UP_TO and not store.outcome_rows():
            from noisefloor.analyzer.logstats import steps_of
            from noisefloor.analyzer.trajectories import summarize

            try:
                doc["trajectories"] = summarize(steps_of(store)).to_json()
            except BodyOverLimit as exc:  # one answer past this viewer's --max-body-mb: the rest still shows
                doc["trajectories_note"] = f"Trajectories not computed: {exc}"
    return _json(doc)


def _finite(doc: Any) -> Any:
    """NaN and infinities (an interval's end, a planted outcome) as strings: JSON has no number for them."""
    if isinstance(doc, float) and doc != doc or doc in (float("inf"), float("-inf")):
        return str(doc)
    if isinstance(doc, dict):
        return {k: _finite(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [_finite(v) for v in doc]
    return doc


def _filters(request: web.Request) -> pages.Filters:
    try:
        return pages.Filters.from_query(request.query)
    except FilterError as exc:
        raise web.HTTPBadRequest(text=str(exc)) from None


async def exchanges(request: web.Request) -> web.Response:
    filters = _filters(request)
    return _json(pages.exchange_page(_store(request), _int(request, "after", 0), _int(request, "limit", 50), filters))


async def sessions(request: web.Request) -> web.Response:
    filters = _filters(request)
    return _json(pages.session_page(_store(request), _int(request, "after", 0), filters))


async def exchange(request: web.Request) -> web.Response:
    try:
        exchange_id = int(request.match_info["id"])
    except ValueError:
        raise web.HTTPNotFound() from None
    view = pages.exchange_view(_store(request), exchange_id)
    if view is None:
        raise web.HTTPNotFound(text=f"no exchange {exchange_id}")
    return _json(view)


async def outcomes(request: web.Request) -> web.Response:
    source = request.app[SOURCE_KEY]
    store: Store | None = request.app[STORE_KEY]  # type: ignore[assignment]
    offset, limit = _int(request, "offset", 0), min(_int(request, "limit", 100), pages.MAX_LIMIT) or 1
    condition, task = request.query.get("condition") or None, request.query.get("task") or None
    if source.outcomes is not None:
        rows, nxt = read_outcomes(source.inside(source.outcomes), offset, limit, condition, task)
    elif store is not None:
        rows, nxt = page_rows(store.outcome_rows(), offset, limit, condition, task)
    else:
        rows, nxt = [], None
    return _json({"items": rows, "next": nxt})


GRID_ROWS = 2_000_000  # outcome rows the grid reads at most (a study's; past this a file is not one)


async def outcome_grid(request: web.Request) -> web.Response:
    """Every condition's tasks x replicates as pass / fail cells, flipping tasks first."""
    source = request.app[SOURCE_KEY]
    store: Store | None = request.app[STORE_KEY]  # type: ignore[assignment]
    if source.outcomes is not None:
        rows, _ = read_outcomes(source.outcomes, 0, GRID_ROWS, None, None)
    elif store is not None:
        rows = store.outcome_rows()
    else:
        rows = []
    return _json(grid.grid(rows))


def make_app(source: Source, store: Store | None, hosts: set[str] | None = None) -> web.Application:
    app = web.Application(middlewares=[guard])
    app[SOURCE_KEY] = source
    app[STORE_KEY] = store
    app[HOSTS_KEY] = hosts or set()
    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", asset)
    app.router.add_get("/plot/{name}", plot)
    app.router.add_get("/api/summary", summary)
    app.router.add_get("/api/exchanges", exchanges)
    app.router.add_get("/api/sessions", sessions)
    app.router.add_get("/api/exchange/{id}", exchange)
    app.router.add_get("/api/outcomes", outcomes)
    app.router.add_get("/api/grid", outcome_grid)
    return app


def open_store(source: Source, max_body: int = DEFAULT_MAX_BODY) -> Store | None:
    """The source's store, read-only, its bodies read up to `max_body` bytes (--max-body-mb)."""
    return None if source.store is None else Store.open(source.store, write=False, max_body=max_body)


class _OneLine(logging.Formatter):
    """The server's log as one visible line per event: a malformed request (no Host, a bad request
    line) or a failure in a handler is named with its exception's type and message, no traceback."""

    def format(self, record: logging.LogRecord) -> str:
        exc = record.exc_info[1] if record.exc_info else None
        why = f": {type(exc).__name__}: {exc}" if exc is not None else ""
        return "nfview: " + visible(f"{record.getMessage()}{why}")


def server_logger() -> logging.Logger:
    """aiohttp's server log for this process, one line per event on stderr (`_OneLine`)."""
    log = logging.getLogger("noisefloor.viewer.server")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(_OneLine())
        log.addHandler(handler)
        log.propagate = False
    return log


def serve_path(path: str | Path, host: str, port: int, ready: Callable[[str], None],
               max_body: int = DEFAULT_MAX_BODY) -> None:
    """Serve until interrupted; `ready` gets the URL once the port is bound. A port that cannot be
    bound (taken, not allowed) is one line (`StateError`)."""
    import asyncio

    from noisefloor.viewer.source import locate

    source = locate(path)
    store = open_store(source, max_body)

    async def main() -> None:
        runner = web.AppRunner(make_app(source, store), access_log=None, logger=server_logger())
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise StateError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); choose another --listen "
                             "port (port 0: any free one)") from None
        bound = runner.addresses[0][1]
        shown = f"[{host}]" if ":" in host else host  # an IPv6 literal in a URL and a Host header
        runner.app[HOSTS_KEY].update({f"{shown}:{bound}", f"localhost:{bound}"})
        ready(f"http://{shown}:{bound}/")
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    finally:
        if store is not None:
            store.close()
