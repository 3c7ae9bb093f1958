"""`nfproxy`: run the recording/replaying proxy, and read what it logged."""

from __future__ import annotations

import asyncio
import base64
import functools
import gc
import json
import os
import secrets as _random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click

from noisefloor._cli import default_group
from noisefloor.errors import EXIT_REPLAY_FAILED
from noisefloor.proxy import perturb
from noisefloor.proxy.keys import RuleError, Rules
from noisefloor.proxy.overrides import Override
from noisefloor.proxy.profiles import PROFILES
from noisefloor.proxy.store import DeferredLog, Store, StoreError, is_read_only
from noisefloor.proxy.traffic import Labels, Stats

DEFAULT_STORE = "recordings/log.lmdb"


@default_group("run")
def main() -> None:
    """Record, replay and pass through LLM API traffic, content-addressed in an LMDB log.

    Without a subcommand, runs the proxy (`nfproxy run`).
    """


@main.command("run", context_settings={"ignore_unknown_options": False})
@click.option("--mode", type=click.Choice(["record", "replay", "passthrough"]), default="record", show_default=True)
@click.option("--strict/--no-strict", default=True, show_default=True,
              help="Replay: answer a miss or a call-order violation with an error, exit non-zero at the end.")
@click.option("--allow-reuse", is_flag=True, help="Replay: once a key's recorded answers run out, repeat the last one.")
@click.option("--store", "store_path", default=DEFAULT_STORE, show_default=True, type=click.Path(path_type=Path))
@click.option("--listen", default="127.0.0.1:8080", show_default=True, help="HOST:PORT to listen on (port 0: any free).")
@click.option("--upstream", help="Reverse mode: the provider origin, e.g. https://api.openai.com. Without it, "
              "nfproxy is a regular HTTP(S) proxy (HTTPS_PROXY plus its CA, see `nfproxy ca`).")
@click.option("--session", help="Session label for requests without an x-nf-session header (default: generated).")
@click.option("--task", help="Task label stamped on every exchange.")
@click.option("--replicate", help="Replicate label stamped on every exchange.")
@click.option("--condition", help="Condition label (live, t0, replay, ...) stamped on every exchange.")
@click.option("--ignore-field", "ignore_fields", multiple=True, metavar="POINTER",
              help="JSON pointer dropped from the key (not from the forwarded body); repeatable; * matches any member.")
@click.option("--profile", type=click.Choice(sorted(PROFILES)), help="Force a provider profile (default: by host and path).")
@click.option("--set", "sets", multiple=True, metavar="POINTER=VALUE",
              help="Rewrite the JSON request body before keying and forwarding, e.g. --set /temperature=0; repeatable.")
@click.option("--perturb", "perturbation", metavar="VARIANT",
              help="Rewrite the last user message: compact_user_request, tool_instruction_prefix, request_label_wrap, "
                   "call_only_suffix, or a variant from --perturb-file; stamped on every exchange.")
@click.option("--perturb-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help='JSON of user-defined variants: {"name": {"prefix": "...", "suffix": "...", "template": "..{text}.."}}.')
@click.option("--replay-session", "replay_sessions", multiple=True,
              help="Replay only answers recorded in this session; repeatable (default: all recorded sessions).")
@click.option("--replay-timing", type=click.Choice(["none", "recorded"]), default="none", show_default=True,
              help="Replay streams at once, or with the recorded gaps between chunks.")
@click.option("--order-wait", default=5.0, show_default=True, type=click.FloatRange(min=0),
              help="Replay: seconds a request waits for the requests that came before it in the recording "
                   "(concurrent harnesses send them a moment apart); then it is a call-order violation.")
@click.option("--stream-timeout", default=120.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds a stream may stall before its upstream connection is closed and an error is logged.")
@click.option("--confdir", type=click.Path(path_type=Path),
              help="mitmproxy state folder (CA certificates); default: mitmproxy-ca beside the store.")
@click.option("--upstream-ca", type=click.Path(exists=True, dir_okay=False),
              help="Extra CA bundle (PEM) to trust for upstream TLS, e.g. a self-signed local server.")
@click.option("--max-body-mb", default=64, show_default=True, type=click.IntRange(min=1),
              help="Largest request body, after undoing Content-Encoding; a larger one gets 413 and is not forwarded.")
@click.option("-q", "--quiet", is_flag=True, help="No ready line and no summary.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(mode: str, strict: bool, allow_reuse: bool, store_path: Path, listen: str, upstream: str | None,
        session: str | None, task: str | None, replicate: str | None, condition: str | None,
        ignore_fields: tuple[str, ...], profile: str | None, sets: tuple[str, ...], perturbation: str | None,
        perturb_file: Path | None, replay_sessions: tuple[str, ...],
        replay_timing: str, order_wait: float, stream_timeout: float, confdir: Path | None, upstream_ca: str | None,
        max_body_mb: int,
        quiet: bool, command: tuple[str, ...]) -> None:
    """Run the proxy in the foreground until SIGINT or SIGTERM.

    With a COMMAND after `--`, start the proxy, run the command with the proxy environment set
    (reverse mode: OPENAI_BASE_URL, ANTHROPIC_BASE_URL, GOOGLE_GEMINI_BASE_URL; regular mode: HTTPS_PROXY and the CA
    variables), stop when it exits and return its status (3 if a strict replay missed instead).
    """
    host, port = _parse_listen(listen)
    try:
        rules = Rules(ignore_fields=ignore_fields, profile=profile)
        override_list = [Override.parse(x) for x in sets]
        variant = (perturbation, perturb.pick(perturbation, perturb.load_variants(perturb_file))) if perturbation else None
    except (RuleError, perturb.PerturbError) as exc:
        raise click.BadParameter(str(exc)) from None
    labels = Labels(session or _new_session_id(), task, replicate, condition)
    store, engine, upstream, writer = _open_engine(mode, store_path, rules, upstream, strict, allow_reuse,
                                                   replay_sessions)
    stats: Stats = engine.stats if engine is not None else Stats()
    confdir = confdir or store_path.parent / "mitmproxy-ca"
    serve = _Serve(mode, host, port, upstream, confdir, store_path, quiet, list(command), upstream_ca)
    try:
        asyncio.run(serve.run(engine, labels, override_list, variant, replay_timing == "recorded", stream_timeout, stats,
                              max_body_mb << 20, order_wait))
    finally:
        try:
            if writer is not None:
                writer.close()
        finally:
            if store is not None:
                store.close()
    if not quiet:
        click.echo(stats.summary(mode, str(store_path)), err=True)
        if stats.tls_failures:
            click.echo(f"nfproxy: {stats.tls_failures} client TLS handshakes failed: the client does not trust the "
                       f"nfproxy CA; run `nfproxy ca --confdir {confdir}` for the file and environment to set", err=True)
    replay_failed = mode == "replay" and strict and bool(stats.misses or stats.order_violations or stats.errors)
    if serve.returncode:
        sys.exit(serve.returncode)
    if replay_failed:
        sys.exit(EXIT_REPLAY_FAILED)


def _open_engine(mode: str, store_path: Path, rules: Rules, upstream: str | None, strict: bool, allow_reuse: bool,
                 replay_sessions: tuple[str, ...]) -> tuple[Store | None, Any, str | None, DeferredLog | None]:
    if mode == "passthrough":
        return None, None, upstream, None
    from noisefloor.proxy.recorder import Recorder
    from noisefloor.proxy.replayer import Replayer

    read_only = mode == "replay" and is_read_only(store_path)
    try:
        store = Store.open(store_path, write=not read_only, create=(mode == "record"))
        if mode == "record":
            store.lock_for_recording()
    except StoreError as exc:
        if "store" in locals():
            store.close()
        raise click.ClickException(str(exc)) from None
    writer = None
    try:
        if mode == "record":
            engine: Any = Recorder(store, rules)
            if upstream:
                store.set_meta("upstream", upstream)
        else:
            def lost(exc: Exception) -> None:  # one request's log record; the next ones are written
                engine.stats.errors += 1
                click.echo(f"nfproxy: a replay log record could not be built ({exc.__class__.__name__}); "
                           "the answer was served, the record is missing", err=True)

            if read_only:
                click.echo(f"nfproxy: store {store_path} is read-only: replay answers from it but writes no log "
                           "records of its own (the summary still counts every request)", err=True)
                sink = _discard
            else:
                writer = DeferredLog(store, on_error=lost)
                sink = writer.submit
            engine = Replayer(store, rules, strict=strict, allow_reuse=allow_reuse, sources=replay_sessions, log=sink)
            if engine.recorded == 0:
                raise StoreError(f"store {store_path} holds no recorded exchanges; record with --mode record first")
            upstream = upstream or store.meta("upstream")
    except (StoreError, ValueError) as exc:
        if writer is not None:
            writer.close()
        store.close()
        raise click.ClickException(str(exc)) from None
    return store, engine, upstream, writer


def _discard(build: Any) -> None:
    """The replay log of a read-only store: nothing is written."""


class _Serve:
    """One proxy run: mitmproxy with the noisefloor addons, and optionally a wrapped command."""

    def __init__(self, mode: str, host: str, port: int, upstream: str | None, confdir: Path, store_path: Path,
                 quiet: bool, command: list[str], upstream_ca: str | None) -> None:
        self.mode, self.host, self.port, self.upstream = mode, host, port, upstream
        self.confdir, self.store_path, self.quiet, self.command = confdir, store_path, quiet, command
        self.upstream_ca = upstream_ca
        self.returncode: int | None = None

    async def run(self, engine: Any, labels: Labels, overrides: list[Override], variant: tuple[str, Any] | None,
                  timed: bool, stream_timeout: float, stats: Stats, max_body: int, order_wait: float) -> None:
        from noisefloor.proxy.addon import (
            BodyLimit,
            BodyRewrites,
            Group,
            NoUpstream,
            Record,
            Replay,
            SessionLabels,
            Streams,
            TlsFailures,
        )
        from noisefloor.proxy.sse import StreamServer

        master = _lean_master()
        master.options.update(
            listen_host=self.host,
            listen_port=self.port,
            mode=[f"reverse:{self.upstream}" if self.upstream else "regular"],
            # lazy: no upstream connection before a request needs one (replay needs none at all, and
            # a dead upstream in record mode becomes a recorded error exchange, not a lost connection)
            connection_strategy="lazy",
            confdir=str(self.confdir),
            termlog_verbosity="warn",
        )
        if self.upstream_ca:
            master.options.update(ssl_verify_upstream_trusted_ca=self.upstream_ca)
        addons: list[Any] = [BodyLimit(max_body, stats), SessionLabels(labels), BodyRewrites(overrides, variant),
                             TlsFailures(stats)]
        streams = None
        if self.mode == "record":
            addons += [Record(engine), Streams(stream_timeout, capture=True)]
        elif self.mode == "replay":
            streams = StreamServer()
            await streams.start()
            addons.append(Replay(engine, streams, timed, order_wait))
            master.addons.add(NoUpstream(streams, stats))  # its own chain entry: independent of the group
        else:
            addons.append(Streams(stream_timeout, capture=False))
        master.addons.add(Group(*addons, _Ready(self, master)))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, master.shutdown)
        try:
            await master.run()
        finally:
            if streams is not None:
                await streams.stop()

    def environment(self, port: int) -> dict[str, str]:
        url = f"http://{self.host}:{port}"
        if self.upstream:
            return {"NFPROXY_URL": url, "OPENAI_BASE_URL": url + "/v1", "ANTHROPIC_BASE_URL": url,
                    "GOOGLE_GEMINI_BASE_URL": url}  # read by the google-genai SDK
        ca = str(self.confdir / "mitmproxy-ca-cert.pem")
        return {"NFPROXY_URL": url, "HTTPS_PROXY": url, "HTTP_PROXY": url, "https_proxy": url, "http_proxy": url,
                **ca_environment(ca)}

    async def wrap(self, master: Any, port: int) -> None:
        env = {**os.environ, **self.environment(port)}
        try:
            proc = await asyncio.create_subprocess_exec(*self.command, env=env)
        except OSError as exc:
            click.echo(f"nfproxy: cannot run {self.command[0]!r}: {exc.strerror}", err=True)
            self.returncode = 127
            master.shutdown()
            return
        try:
            self.returncode = await proc.wait()
        finally:
            if proc.returncode is None:  # the proxy is shutting down first: take the command with it
                proc.terminate()
                self.returncode = await proc.wait()
            master.shutdown()


def _lean_master() -> Any:
    """A mitmproxy master with only the addons a recording proxy needs.

    mitmdump's master carries some thirty more (playback, scripts, cookie and header rewriting,
    saving flows), and mitmproxy offers every flow event to each of them: measured, that dispatch
    cost a replayed answer more than nfproxy's own lookup. Block stays, so a proxy listening on a
    public address still refuses clients from the internet.
    """
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

    master = Master(Options())
    master.addons.add(
        core.Core(),
        block.Block(),
        disable_h2c.DisableH2C(),
        proxyserver.Proxyserver(),
        next_layer.NextLayer(),
        tlsconfig.TlsConfig(),
        update_alt_svc.UpdateAltSvc(),
        errorcheck.ErrorCheck(),
        TermLog(out=sys.stderr),  # stdout belongs to a wrapped command
    )
    return master


def ca_environment(ca: str) -> dict[str, str]:
    return {"SSL_CERT_FILE": ca, "REQUESTS_CA_BUNDLE": ca, "NODE_EXTRA_CA_CERTS": ca, "CURL_CA_BUNDLE": ca}


class _Ready:
    """Prints the address once mitmproxy listens, then starts the wrapped command if there is one."""

    def __init__(self, serve: _Serve, master: Any) -> None:
        self.serve = serve
        self.master = master
        self._task: asyncio.Task[None] | None = None

    def running(self) -> None:
        from mitmproxy import ctx

        addrs = ctx.master.addons.get("proxyserver").listen_addrs()
        if not addrs:
            return
        host, port = addrs[0][:2]
        # Everything loaded so far (mitmproxy, its addons, the replay index) lives as long as the
        # proxy: keep it out of the cyclic collector's full passes, which otherwise stall a request.
        gc.freeze()
        s = self.serve
        target = f"-> {s.upstream}" if s.upstream else "(regular proxy)"
        where = "" if s.mode == "passthrough" else f", store {s.store_path}"
        if not s.quiet:
            click.echo(f"nfproxy {s.mode} listening on http://{host}:{port} {target}{where}", err=True)
        # machine-readable too (the port, when 0 was asked for)
        print(f"NFPROXY_READY {host}:{port}", file=sys.stderr, flush=True)
        if s.command:
            self._task = asyncio.get_running_loop().create_task(s.wrap(self.master, port))


def _parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise click.BadParameter(f"{listen!r} is not HOST:PORT (e.g. 127.0.0.1:8080)", param_hint="--listen")
    return host.strip("[]") or "127.0.0.1", int(port)


def _new_session_id() -> str:
    return time.strftime("run-%Y%m%dT%H%M%S-") + _random.token_hex(3)


@main.command("ca")
@click.option("--confdir", type=click.Path(path_type=Path), default=Path(DEFAULT_STORE).parent / "mitmproxy-ca",
              show_default=True, help="The folder nfproxy keeps its CA in (beside the store by default).")
@click.option("--listen", default="127.0.0.1:8080", show_default=True, help="Where the proxy listens (for HTTPS_PROXY).")
def ca_cmd(confdir: Path, listen: str) -> None:
    """Print the CA certificate path and the environment a client needs to trust it (forward mode)."""
    from mitmproxy.certs import CertStore

    confdir.mkdir(parents=True, exist_ok=True)
    CertStore.from_store(confdir, "mitmproxy", 2048)  # creates the CA on first use
    ca = confdir.resolve() / "mitmproxy-ca-cert.pem"
    click.echo(f"# nfproxy CA certificate: {ca}")
    click.echo(f"# for a client using nfproxy (listening on {listen}) as its HTTPS proxy:")
    for k, v in {"HTTPS_PROXY": f"http://{listen}", **ca_environment(str(ca))}.items():
        click.echo(f"export {k}={v}")


# -- reading the log -------------------------------------------------------------------------


def _open_reader(store_path: Path) -> Store:
    return Store.open(store_path, write=False)


def _store_errors(fn: Any) -> Any:
    """A command that reads a store: a missing or damaged one is one line and exit 1, never a traceback."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except StoreError as exc:
            raise click.ClickException(str(exc)) from None

    return run


@main.command("log")
@click.option("--store", "store_path", default=DEFAULT_STORE, show_default=True, type=click.Path(path_type=Path))
@click.option("--session", help="Only this session's exchanges.")
@click.option("--task", help="Only exchanges labelled with this task.")
@click.option("--condition", help="Only exchanges labelled with this condition.")
@click.option("--sessions-only", is_flag=True, help="List sessions, not exchanges.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per exchange (JSON Lines), for scripts.")
@_store_errors
def log_cmd(store_path: Path, session: str | None, task: str | None, condition: str | None, sessions_only: bool,
            as_json: bool) -> None:
    """List sessions and exchanges, a line each."""

    def wanted(ex: Any) -> bool:
        return ((session is None or ex.session == session) and (task is None or ex.task == task)
                and (condition is None or ex.condition == condition))

    with _open_reader(store_path) as store:
        if as_json:
            for ex in store.exchanges():
                if wanted(ex):
                    click.echo(json.dumps(ex.to_json(), ensure_ascii=False))
            return
        per_session: dict[str, dict[str, Any]] = {}
        lines = []
        for ex in store.exchanges():
            if not wanted(ex):
                continue
            s = per_session.setdefault(ex.session, {"n": 0, "modes": set(), "first": ex.time, "condition": ex.condition})
            s["n"] += 1
            s["modes"].add(ex.mode)
            status = ex.response["status"] if ex.response else "ERR"
            result = ex.replay_result or ("error" if ex.error else "")
            lines.append(
                f"{ex.id:>6} {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(ex.time))} {ex.mode:<7} "
                f"{ex.session} {ex.request['method']} {ex.request['url']} {status} {result} key={ex.key[:12]} "
                f"occ={ex.occurrence}"
            )
        click.echo(f"{len(per_session)} sessions in {store_path}")
        for name, s in per_session.items():
            cond = f" condition={s['condition']}" if s["condition"] else ""
            click.echo(f"  {name}: {s['n']} exchanges ({', '.join(sorted(s['modes']))}){cond}")
        if not sessions_only:
            click.echo("\n".join(lines))


@main.command("show")
@click.argument("exchange_id", type=int)
@click.option("--store", "store_path", default=DEFAULT_STORE, show_default=True, type=click.Path(path_type=Path))
@_store_errors
def show_cmd(exchange_id: int, store_path: Path) -> None:
    """Print one exchange: its record and both bodies, decompressed (secrets were never stored)."""
    with _open_reader(store_path) as store:
        ex = store.exchange(exchange_id)
        if ex is None:
            raise click.ClickException(f"no exchange {exchange_id} in {store_path}; list them with `nfproxy log`")
        doc = ex.to_json()
        for part in ("request", "response"):
            if doc[part]:
                doc[part]["body_text"] = _render(store, doc[part])
        click.echo(json.dumps(doc, indent=2, ensure_ascii=False))


def _render(store: Store, part: dict[str, Any]) -> Any:
    """A stored body for reading: decoded, parsed as JSON when it is JSON."""
    data = store.decoded_body(part)
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}
    try:
        return json.loads(text)
    except ValueError:
        return text


if __name__ == "__main__":
    main()
