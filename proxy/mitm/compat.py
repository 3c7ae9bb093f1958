"""Every mitmproxy internal nfproxy touches, in one place, for both supported lines.

nfproxy runs on mitmproxy 11.0 (Python 3.11) and 12.3 (Python 3.12+). The flow API addons see
(`flow.request`, `flow.response`, `flow.metadata`) is mitmproxy's public contract; what is not —
the master built by hand, the connection table a stalled stream is cut through, the HTTP stream
that sends a replayed stream chunk by chunk, the direct `Response` constructor, `CertStore` and
the CA's file name, the flow-file reader — lives here and nowhere else, so an upgrade that moves
one of them breaks one module, and `probe()` (run by the tests) names which.
"""

from __future__ import annotations

import inspect
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, BinaryIO

import mitmproxy.version
from mitmproxy import ctx, http
from mitmproxy.net.http import status_codes
from mitmproxy.proxy.server_hooks import ServerConnectionHookData

from noisefloor.errors import InputError

# the public names addons are written against, re-exported so nothing else imports mitmproxy
HTTPFlow = http.HTTPFlow
Response = http.Response
ServerHook = ServerConnectionHookData

VERSION: str = mitmproxy.version.VERSION
LINE: int = int(VERSION.split(".")[0])  # 11 or 12
SUPPORTED_LINES = (11, 12)

# mitmproxy writes its CA as <basename>-ca.pem (key and certificate) and <basename>-ca-cert.pem
# (the certificate clients trust) in its confdir.
CA_BASENAME = "mitmproxy"
CA_CERT_FILE = f"{CA_BASENAME}-ca-cert.pem"
CA_KEY_SIZE = 2048


def ca_cert_path(confdir: Path) -> Path:
    """The certificate a client must trust to accept nfproxy's TLS interception."""
    return confdir / CA_CERT_FILE


def ensure_ca(confdir: Path) -> Path:
    """Creates the CA in `confdir` on first use (as the proxy would); its certificate's path."""
    from mitmproxy.certs import CertStore

    confdir.mkdir(parents=True, exist_ok=True)
    CertStore.from_store(confdir, CA_BASENAME, CA_KEY_SIZE)
    return ca_cert_path(confdir)


def build_response(status: int, headers: Iterable[tuple[bytes, bytes]], raw_body: bytes) -> http.Response:
    """A response with the body bytes as given (already encoded per its Content-Encoding).

    Built with the constructor, not Response.make: make() re-encodes the body and costs a replayed
    answer more than the lookup."""
    now = time.time()
    reason = status_codes.RESPONSES.get(status, "").encode()
    return http.Response(b"HTTP/1.1", status, reason, http.Headers(headers), raw_body, None, now, now)


def make_response(status: int, body: bytes, headers: dict[str, str]) -> http.Response:
    """A response nfproxy composes itself (its error answers): mitmproxy encodes as it would."""
    return http.Response.make(status, body, headers)


def close_server_connection(flow: http.HTTPFlow, reason: str) -> bool:
    """Cuts the flow's upstream connection (a stalled stream): mitmproxy then fails the flow and
    closes the client's stream. Whether a connection was found."""
    proxyserver = ctx.master.addons.get("proxyserver")
    for handler in list(proxyserver.connections.values()):
        io = handler.transports.get(flow.server_conn)
        if io is not None and io.writer is not None:
            io.writer.close()
            if io.handler is not None:
                io.handler.cancel(reason)
            return True
    return False


# -- streamed answers an addon sets --------------------------------------------------------------

_STREAMED = "nf_streamed"  # flow.metadata: the chunks (and their due times) of a streamed answer


def stream_answer(flow: http.HTTPFlow, response: http.Response, chunks: Sequence[bytes],
                  due_s: Sequence[float] | None = None) -> None:
    """Answer `flow` from the request hook with `response`'s head, then each of `chunks` as its own
    piece of the body (an HTTP/1.1 chunk), sent by mitmproxy's own HTTP layer on the client's
    connection: no second server, no connection, no parse. `due_s`: each chunk's time from the
    head, in seconds (the layer waits, without holding the event loop, before a chunk not yet
    due); None sends them all at once. `response`'s body is ignored: a body of unknown
    length, chunked on HTTP/1.1. Needs `lean_master`'s (`_streamed_answers`) layer in place."""
    response.headers["transfer-encoding"] = "chunked"
    response.raw_content = b""
    flow.response = response
    flow.metadata[_STREAMED] = (chunks, due_s)


def _streamed_answers() -> None:
    """Teach mitmproxy's HTTP stream to send a `stream_answer`: once per process.

    mitmproxy sends an answer an addon sets in one piece (`HttpStream.send_response`); a streamed
    one is sent here as mitmproxy sends a stream from a server: its head, its chunks, then the
    response hook and the end of the message. A chunk not yet due parks this one stream (a
    blocking `RequestWakeup`: the layer resumes it from a timer, other streams and connections go
    on) rather than the event loop."""
    from mitmproxy.proxy import commands, events
    from mitmproxy.proxy.layers.http import HttpStream, ResponseData, ResponseHeaders, SendHttp

    plain = HttpStream.send_response
    if getattr(plain, "nf_streamed", False):
        return
    if not hasattr(events.Wakeup, "reply"):  # the layer resumes a paused generator with `event.reply`
        setattr(events.Wakeup, "reply", None)  # noqa: B010 - a class attribute mitmproxy 11 lacks

    def send_response(self: Any, already_streamed: bool = False) -> Any:
        planned = None if already_streamed else self.flow.metadata.pop(_STREAMED, None)
        if planned is None:
            return (yield from plain(self, already_streamed))
        chunks, due = planned
        client = self.context.client
        sock = _client_socket(client)
        _cork(sock, True)  # the head leaves with the first chunk, in one segment
        yield SendHttp(ResponseHeaders(self.stream_id, self.flow.response, False), client)
        start = time.monotonic()
        for i, chunk in enumerate(chunks):
            wait = 0.0 if due is None else due[i] - (time.monotonic() - start)
            if wait > 0:
                _cork(sock, False)
                pause = commands.RequestWakeup(wait)
                pause.blocking = True
                yield pause
                _cork(sock, True)
            yield SendHttp(ResponseData(self.stream_id, chunk), client)
            if i == 0:  # out now; the chunks due with it follow in as few segments as they fill
                _cork(sock, False)
                _cork(sock, True)
        _cork(sock, False)
        return (yield from plain(self, already_streamed=True))

    send_response.nf_streamed = True  # type: ignore[attr-defined]
    setattr(HttpStream, "send_response", send_response)  # noqa: B010 - the layer's method, replaced once


def _client_socket(client: Any) -> Any:
    """The socket under a client connection (its handler's transport); None if there is none."""
    handler = ctx.master.addons.get("proxyserver").connections.get(client.id)
    io = None if handler is None else handler.transports.get(client)
    return None if io is None or io.writer is None else io.writer.get_extra_info("socket")


def _cork(sock: Any, on: bool) -> None:
    """TCP_CORK on (held back) or off (sent now) for a client's socket.

    Each SendData is its own write: a streamed answer's head would leave alone, wake the client,
    and on a busy host the proxy may then wait for a CPU before its first chunk follows. Corked,
    the two leave in one segment, as a provider's server sends them."""
    if sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, on)
        except OSError:  # not TCP (a test's socket pair), or closed already: nothing to hold back
            pass


class FlowFileError(InputError):
    """A file that is not a readable mitmproxy flow file (`mitmdump -w`)."""


def read_http_flows(fh: BinaryIO) -> Iterator[http.HTTPFlow]:
    """The HTTP flows of a mitmproxy flow file, in order (other flow types skipped)."""
    from mitmproxy import io
    from mitmproxy.exceptions import FlowReadException

    try:
        for flow in io.FlowReader(fh).stream():
            if isinstance(flow, http.HTTPFlow):
                yield flow
    except FlowReadException as exc:
        raise FlowFileError(str(exc)) from None


def listen_addrs() -> list[tuple[Any, ...]]:
    """The addresses the running proxy listens on (the port, when 0 was asked for)."""
    return list(ctx.master.addons.get("proxyserver").listen_addrs())


def _addons_package_alone() -> None:
    """Make `mitmproxy.addons` importable without running its `__init__`, which imports all thirty
    default addons (and flask, ldap3, passlib with them): measured, a third of a proxy's start-up
    CPU, for addons a lean master never loads. `default_addons` still works: asking for it runs the
    real `__init__` then. A no-op once the package is imported the usual way."""
    if "mitmproxy.addons" in sys.modules:
        return
    import importlib.util

    import mitmproxy

    spec = importlib.util.find_spec("mitmproxy.addons")
    if spec is None or spec.loader is None or not spec.submodule_search_locations:
        return  # not a plain package: import it the usual way
    package = importlib.util.module_from_spec(spec)  # __path__ set, __init__ not run
    loader = spec.loader

    def whole(name: str) -> Any:
        if name != "default_addons":  # a submodule: the import system loads it on its own
            raise AttributeError(name)
        loader.exec_module(package)  # the real __init__, into this module
        return package.__dict__[name]

    # typeshed declares ModuleType.__getattr__ as a method; a module's __getattr__ is set like this (PEP 562)
    package.__getattr__ = whole  # type: ignore[method-assign]
    sys.modules["mitmproxy.addons"] = package
    mitmproxy.addons = package


def lean_master(log_to: IO[str] | None = None, *, lazy_ca: bool = False) -> Any:
    """A mitmproxy master with only the addons a recording proxy needs.

    mitmdump's master carries some thirty more (playback, scripts, cookie and header rewriting,
    saving flows), and mitmproxy offers every flow event to each of them: measured, that dispatch
    cost a replayed answer more than nfproxy's own lookup. Block stays, so a proxy listening on a
    public address still refuses clients from the internet. Must be called inside the event loop.
    `lazy_ca`: the CA is read (or created) when a client's TLS handshake first needs it (`_tls_config`).
    """
    _addons_package_alone()
    from mitmproxy.addons import (
        block,
        core,
        disable_h2c,
        errorcheck,
        next_layer,
        proxyserver,
        tlsconfig,
        update_alt_svc,
    )
    from mitmproxy.addons.termlog import TermLog
    from mitmproxy.master import Master
    from mitmproxy.options import Options

    _streamed_answers()
    master = Master(Options())
    master.addons.add(
        core.Core(),
        block.Block(),
        disable_h2c.DisableH2C(),
        proxyserver.Proxyserver(),
        next_layer.NextLayer(),
        _tls_config(tlsconfig, lazy_ca),
        update_alt_svc.UpdateAltSvc(),
        errorcheck.ErrorCheck(),
        TermLog(out=log_to or sys.stderr),  # stdout belongs to a wrapped command
    )
    return master


# mitmproxy's options that make TlsConfig (re)load its CA store (the eMudhra pair: 12.x)
_CA_OPTIONS = frozenset({"certs", "confdir", "key_size", "cert_passphrase", "emudhra", "emudhra_old"})
# TlsConfig's methods that read its CA store, directly or through one another (11.0 and 12.3;
# `request` serves the CA's revocation list in 12.x): the lazy CA loads the store before each runs,
# and `probe` fails when an upgrade reads it anywhere else
CA_READERS = ("get_cert", "crl_path", "tls_start_client", "quic_start_client", "request")


def _tls_config(tlsconfig: Any, lazy: bool) -> Any:
    """mitmproxy's TlsConfig; lazy: one that reads its CA only when it is first used.

    mitmproxy reads the CA (checking its RSA key, ~60 ms) when the confdir is set and again when the
    proxy starts, and creates one in a new confdir: a reverse proxy whose clients speak plain HTTP,
    which is how nfladder and most harnesses use nfproxy, has no use for it (on 11.0 never loads it)."""
    if not lazy:
        return tlsconfig.TlsConfig()

    class LazyCa(tlsconfig.TlsConfig):
        due: frozenset[str] = frozenset({"confdir"})  # the CA options to apply when the store is loaded

        def configure(self, updated: Any) -> None:
            names = {updated} if isinstance(updated, str) else set(updated)
            if names & _CA_OPTIONS:
                self.due, self.certstore = frozenset(names & _CA_OPTIONS), None
            super().configure(names - _CA_OPTIONS)

        def load_ca(self) -> None:
            if self.certstore is None:
                super().configure(self.due)

    def loaded_first(name: str) -> Callable[..., Any]:
        plain = getattr(tlsconfig.TlsConfig, name)

        def run(self: Any, *args: Any) -> Any:
            self.load_ca()
            return plain(self, *args)

        run.__name__ = name
        return run

    for name in CA_READERS:
        if hasattr(tlsconfig.TlsConfig, name):
            setattr(LazyCa, name, loaded_first(name))
    return LazyCa()


def ca_readers() -> set[str]:
    """TlsConfig's methods (besides `configure`, which loads it) that read the CA store, directly or
    through another such method: by their source, so a new reader an upgrade adds is found."""
    from mitmproxy.addons.tlsconfig import TlsConfig

    sources = {name: inspect.getsource(fn) for name, fn in vars(TlsConfig).items()
               if inspect.isfunction(fn) and name not in ("configure", "running")}
    readers = {name for name, src in sources.items() if "certstore" in src}
    while grown := {n for n, src in sources.items() if n not in readers and any(f".{r}(" in src for r in readers)}:
        readers |= grown
    return readers


def _ca_read_only_where_loaded() -> None:
    unknown = ca_readers() - set(CA_READERS)
    if unknown:
        raise LookupError(f"TlsConfig reads its CA in {', '.join(sorted(unknown))} too: add it to CA_READERS")


# -- probing: what an upgrade must keep ------------------------------------------------------------


def _attr(dotted: str) -> Any:
    """The object at a dotted path (module, then attributes); raises naming the missing part."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for i, name in enumerate(parts[cut:], cut):
            if not hasattr(obj, name):
                raise LookupError(f"{'.'.join(parts[:i + 1])} is gone")
            obj = getattr(obj, name)
        return obj
    raise LookupError(f"module {parts[0]} is gone")


def _params(dotted: str, want: tuple[str, ...]) -> Callable[[], None]:
    def check() -> None:
        got = tuple(p for p in inspect.signature(_attr(dotted)).parameters if p not in ("self", "cls"))
        if got[:len(want)] != want:
            raise LookupError(f"{dotted}{inspect.signature(_attr(dotted))} no longer takes ({', '.join(want)})")
    return check


def _all(*checks: Callable[[], None]) -> Callable[[], None]:
    def check() -> None:
        for c in checks:
            c()
    return check


def _exists(*dotted: str) -> Callable[[], None]:
    def check() -> None:
        for d in dotted:
            _attr(d)
    return check


def _fields(dotted: str, names: tuple[str, ...]) -> Callable[[], None]:
    def check() -> None:
        cls = _attr(dotted)
        declared = set(getattr(cls, "__dataclass_fields__", ())) | set(getattr(cls, "__annotations__", ()))
        missing = [n for n in names if n not in declared]
        if missing:
            raise LookupError(f"{dotted} lost {', '.join(missing)}")
    return check


def _connections_by_client_id() -> None:
    from mitmproxy.addons.proxyserver import Proxyserver
    from mitmproxy.proxy import mode_servers

    if not isinstance(getattr(Proxyserver(), "connections", None), dict):
        raise LookupError("Proxyserver.connections is no longer a dict")
    if "register_connection(handler.layer.context.client.id" not in inspect.getsource(mode_servers):
        raise LookupError("mode_servers no longer registers a connection by its client's id")


def _line() -> None:
    if LINE not in SUPPORTED_LINES:
        raise LookupError(f"mitmproxy {VERSION} is not a tested line ({', '.join(map(str, SUPPORTED_LINES))})")


# Each internal nfproxy relies on, by the name a failure should print.
INTERNALS: dict[str, Callable[[], None]] = {
    "mitmproxy.version.VERSION (a tested line)": _line,
    "mitmproxy.master.Master(opts)": _params("mitmproxy.master.Master.__init__", ("opts",)),
    "mitmproxy.options.Options()": _exists("mitmproxy.options.Options"),
    "lean master addons (core, block, disable_h2c, proxyserver, next_layer, tlsconfig, update_alt_svc, "
    "errorcheck, termlog)": _exists(
        "mitmproxy.addons.core.Core", "mitmproxy.addons.block.Block", "mitmproxy.addons.disable_h2c.DisableH2C",
        "mitmproxy.addons.proxyserver.Proxyserver", "mitmproxy.addons.next_layer.NextLayer",
        "mitmproxy.addons.tlsconfig.TlsConfig", "mitmproxy.addons.update_alt_svc.UpdateAltSvc",
        "mitmproxy.addons.errorcheck.ErrorCheck"),
    "mitmproxy.addons.termlog.TermLog(out)": _params("mitmproxy.addons.termlog.TermLog.__init__", ("out",)),
    "mitmproxy.addons.proxyserver.Proxyserver.listen_addrs": _exists(
        "mitmproxy.addons.proxyserver.Proxyserver.listen_addrs"),
    "mitmproxy.proxy.server.ConnectionHandler.transports": _fields(
        "mitmproxy.proxy.server.ConnectionHandler", ("transports",)),
    "mitmproxy.proxy.server.ConnectionIO(handler, reader, writer)": _fields(
        "mitmproxy.proxy.server.ConnectionIO", ("handler", "reader", "writer")),
    "mitmproxy.http.Response(http_version, status_code, reason, headers, content, trailers, timestamp_start, "
    "timestamp_end)": _params("mitmproxy.http.Response.__init__", (
        "http_version", "status_code", "reason", "headers", "content", "trailers", "timestamp_start",
        "timestamp_end")),
    "mitmproxy.http.Response.make(status_code, content, headers)": _params(
        "mitmproxy.http.Response.make", ("status_code", "content", "headers")),
    "mitmproxy.net.http.status_codes.RESPONSES": _exists("mitmproxy.net.http.status_codes.RESPONSES"),
    "mitmproxy.proxy.server_hooks.ServerConnectionHookData(server, client)": _fields(
        "mitmproxy.proxy.server_hooks.ServerConnectionHookData", ("server", "client")),
    "mitmproxy.io.FlowReader(fo).stream(), mitmproxy.exceptions.FlowReadException": _exists(
        "mitmproxy.io.FlowReader.stream", "mitmproxy.exceptions.FlowReadException"),
    "mitmproxy.addons.tlsconfig.TlsConfig reads its CA only in " + ", ".join(CA_READERS) + " (the lazy CA)":
        _ca_read_only_where_loaded,
    "mitmproxy.addons.tlsconfig.TlsConfig.configure(updated), .running(), .certstore": _exists(
        "mitmproxy.addons.tlsconfig.TlsConfig.configure", "mitmproxy.addons.tlsconfig.TlsConfig.running",
        "mitmproxy.addons.tlsconfig.TlsConfig.certstore"),
    "mitmproxy.proxy.layers.http.HttpStream.send_response(already_streamed) (a streamed answer)": _params(
        "mitmproxy.proxy.layers.http.HttpStream.send_response", ("already_streamed",)),
    "mitmproxy.proxy.layers.http.ResponseHeaders(stream_id, response, end_stream)": _fields(
        "mitmproxy.proxy.layers.http.ResponseHeaders", ("stream_id", "response", "end_stream")),
    "mitmproxy.proxy.layers.http.ResponseData(stream_id, data), SendHttp(event, connection)": _all(
        _fields("mitmproxy.proxy.layers.http.ResponseData", ("stream_id", "data")),
        _fields("mitmproxy.proxy.layers.http.SendHttp", ("event", "connection"))),
    "mitmproxy.proxy.commands.RequestWakeup(delay), events.Wakeup(command) (a paced stream's pause)": _all(
        _params("mitmproxy.proxy.commands.RequestWakeup.__init__", ("delay",)),
        _fields("mitmproxy.proxy.events.Wakeup", ("command",))),
    "mitmproxy.addons.proxyserver.Proxyserver.connections, by the client's id (a streamed answer's socket)":
        _connections_by_client_id,
    "mitmproxy.certs.CertStore.from_store(path, basename, key_size)": _params(
        "mitmproxy.certs.CertStore.from_store", ("path", "basename", "key_size")),
}


def probe() -> dict[str, str]:
    """Each internal that moved, with what changed; empty when this mitmproxy fits."""
    problems = {}
    for name, check in INTERNALS.items():
        try:
            check()
        except Exception as exc:  # noqa: BLE001 - any failure is the report
            problems[name] = f"{type(exc).__name__}: {exc}"
    return problems
