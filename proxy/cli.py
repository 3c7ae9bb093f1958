"""`nfproxy`: run the recording/replaying proxy, and read what it logged."""

from __future__ import annotations

import asyncio
import base64
import json
import secrets as _random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click

from proxy.keys import Rules, RuleError
from proxy.store import QueuedWriter, Store, StoreError
from proxy.traffic import Labels, Stats

DEFAULT_STORE = "recordings/log.lmdb"
EXIT_REPLAY_FAILED = 3


class _DefaultToRun(click.Group):
    """`nfproxy --mode record ...` means `nfproxy run --mode record ...`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h", "--version")):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_DefaultToRun, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="noisefloor")
def main() -> None:
    """Record, replay and pass through LLM API traffic, content-addressed in an LMDB log.

    Without a subcommand, runs the proxy (`nfproxy run`).
    """


@main.command("run")
@click.option("--mode", type=click.Choice(["record", "replay", "passthrough"]), default="record", show_default=True)
@click.option("--strict/--no-strict", default=True, show_default=True,
              help="Replay: answer a miss or a call-order violation with an error, exit non-zero at the end.")
@click.option("--allow-reuse", is_flag=True, help="Replay: once a key's recorded answers run out, repeat the last one.")
@click.option("--store", "store_path", default=DEFAULT_STORE, show_default=True, type=click.Path(path_type=Path))
@click.option("--listen", default="127.0.0.1:8080", show_default=True, help="HOST:PORT to listen on (port 0: any free).")
@click.option("--upstream", help="Reverse mode: the provider base URL, e.g. https://api.openai.com. Without it, "
              "nfproxy is a regular HTTP(S) proxy.")
@click.option("--session", help="Session label for requests without an x-nf-session header (default: generated).")
@click.option("--task", help="Task label stamped on every exchange.")
@click.option("--replicate", help="Replicate label stamped on every exchange.")
@click.option("--condition", help="Condition label (live, t0, replay, ...) stamped on every exchange.")
@click.option("--ignore-field", "ignore_fields", multiple=True, metavar="POINTER",
              help="JSON pointer dropped from the key (not from the forwarded body); repeatable; * matches any member.")
@click.option("--replay-session", "replay_sessions", multiple=True,
              help="Replay only answers recorded in this session; repeatable (default: all recorded sessions).")
@click.option("--confdir", type=click.Path(path_type=Path),
              help="mitmproxy state folder (CA certificates); default: mitmproxy-ca beside the store.")
@click.option("-q", "--quiet", is_flag=True, help="No ready line and no summary.")
def run(mode: str, strict: bool, allow_reuse: bool, store_path: Path, listen: str, upstream: str | None,
        session: str | None, task: str | None, replicate: str | None, condition: str | None,
        ignore_fields: tuple[str, ...], replay_sessions: tuple[str, ...], confdir: Path | None, quiet: bool) -> None:
    """Run the proxy in the foreground until SIGINT or SIGTERM."""
    host, port = _parse_listen(listen)
    try:
        rules = Rules(ignore_fields=ignore_fields)
    except RuleError as exc:
        raise click.BadParameter(str(exc), param_hint="--ignore-field") from None
    labels = Labels(session or _new_session_id(), task, replicate, condition)
    store, engine, upstream, writer = _open_engine(mode, store_path, rules, upstream, strict, allow_reuse,
                                                   replay_sessions)
    addons = _addons(mode, engine, labels)
    stats: Stats = engine.stats if engine is not None else Stats()
    try:
        asyncio.run(_serve(host, port, upstream, addons, confdir or store_path.parent / "mitmproxy-ca",
                           mode, store_path, quiet))
    finally:
        try:
            if writer is not None:
                writer.close()
        finally:
            if store is not None:
                store.close()
    if not quiet:
        click.echo(stats.summary(mode, str(store_path)), err=True)
    if mode == "replay" and strict and (stats.misses or stats.order_violations):
        sys.exit(EXIT_REPLAY_FAILED)


def _open_engine(mode: str, store_path: Path, rules: Rules, upstream: str | None, strict: bool, allow_reuse: bool,
                 replay_sessions: tuple[str, ...]) -> tuple[Store | None, Any, str | None, QueuedWriter | None]:
    if mode == "passthrough":
        return None, None, upstream, None
    from proxy.recorder import Recorder
    from proxy.replayer import Replayer

    try:
        store = Store.open(store_path, write=True, create=(mode == "record"))
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    writer = None
    try:
        if mode == "record":
            engine: Any = Recorder(store, rules)
            if upstream:
                store.set_meta("upstream", upstream)
        else:
            writer = QueuedWriter(store)
            engine = Replayer(store, rules, strict=strict, allow_reuse=allow_reuse, sources=replay_sessions,
                              log=writer.submit)
            if engine.recorded == 0:
                raise StoreError(f"store {store_path} holds no recorded exchanges; record with --mode record first")
            upstream = upstream or store.meta("upstream")
    except (StoreError, ValueError) as exc:
        if writer is not None:
            writer.close()
        store.close()
        raise click.ClickException(str(exc)) from None
    return store, engine, upstream, writer


def _addons(mode: str, engine: Any, labels: Labels) -> list[Any]:
    from proxy.addon import Record, Replay, SessionLabels

    if mode == "record":
        return [SessionLabels(labels), Record(engine)]
    if mode == "replay":
        return [SessionLabels(labels), Replay(engine)]
    return [SessionLabels(labels)]


async def _serve(host: str, port: int, upstream: str | None, addons: list[Any], confdir: Path, mode: str,
                 store_path: Path, quiet: bool) -> None:
    from mitmproxy.options import Options
    from mitmproxy.tools.dump import DumpMaster

    spec = f"reverse:{upstream}" if upstream else "regular"
    master = DumpMaster(Options(), with_termlog=True, with_dumper=False)
    master.options.update(
        listen_host=host,
        listen_port=port,
        mode=[spec],
        # lazy: no upstream connection before a request needs one (replay needs none at all, and
        # a dead upstream in record mode becomes a recorded error exchange, not a lost connection)
        connection_strategy="lazy",
        confdir=str(confdir),
        termlog_verbosity="warn",
    )
    master.addons.add(*addons, _Ready(mode, upstream, store_path, quiet))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, master.shutdown)
    await master.run()


class _Ready:
    """Prints the address once mitmproxy listens, so scripts and tests can wait for it."""

    def __init__(self, mode: str, upstream: str | None, store_path: Path, quiet: bool) -> None:
        self.mode, self.upstream, self.store_path, self.quiet = mode, upstream, store_path, quiet

    def running(self) -> None:
        from mitmproxy import ctx

        addrs = ctx.master.addons.get("proxyserver").listen_addrs()
        if not addrs:
            return
        host, port = addrs[0][:2]
        target = f"-> {self.upstream}" if self.upstream else "(regular proxy)"
        where = "" if self.mode == "passthrough" else f", store {self.store_path}"
        line = f"nfproxy {self.mode} listening on http://{host}:{port} {target}{where}"
        if not self.quiet:
            click.echo(line, err=True)
        # machine-readable too: the port when 0 was asked for
        sys.stderr.flush()
        print(f"NFPROXY_READY {host}:{port}", file=sys.stderr, flush=True)


def _parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise click.BadParameter(f"{listen!r} is not HOST:PORT (e.g. 127.0.0.1:8080)", param_hint="--listen")
    return host.strip("[]") or "127.0.0.1", int(port)


def _new_session_id() -> str:
    return time.strftime("run-%Y%m%dT%H%M%S-") + _random.token_hex(3)


# -- reading the log -------------------------------------------------------------------------


def _open_reader(store_path: Path) -> Store:
    try:
        return Store.open(store_path, write=False)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None


@main.command("log")
@click.option("--store", "store_path", default=DEFAULT_STORE, show_default=True, type=click.Path(path_type=Path))
@click.option("--session", help="Only this session's exchanges.")
@click.option("--sessions-only", is_flag=True, help="List sessions, not exchanges.")
def log_cmd(store_path: Path, session: str | None, sessions_only: bool) -> None:
    """List sessions and exchanges, a line each."""
    with _open_reader(store_path) as store:
        per_session: dict[str, dict[str, Any]] = {}
        lines = []
        for ex in store.exchanges():
            s = per_session.setdefault(ex.session, {"n": 0, "modes": set(), "first": ex.time, "condition": ex.condition})
            s["n"] += 1
            s["modes"].add(ex.mode)
            if session and ex.session != session:
                continue
            status = ex.response["status"] if ex.response else "ERR"
            result = ex.replay_result or ("error" if ex.error else "")
            url = ex.request["url"]
            lines.append(
                f"{ex.id:>6} {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(ex.time))} {ex.mode:<7} "
                f"{ex.session} {ex.request['method']} {url} {status} {result} key={ex.key[:12]} occ={ex.occurrence}"
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
    from proxy.keys import decode_body

    raw = store.body(part.get("body"))
    if raw is None:
        return None
    encoding = next((v for k, v in part["headers"] if k.lower() == "content-encoding"), None)
    data = decode_body(raw, encoding)[0]
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
