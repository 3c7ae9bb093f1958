"""Serving: one nfproxy run, from options (`options.ServeOptions`) to exit status.

`serve` opens the store and the engine (recorder or replayer), runs a lean mitmproxy master with
the noisefloor addons (and a wrapped command, if any), prints the summary and returns the exit
status.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import os
import shlex
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from noisefloor.display import counted, visible
from noisefloor.errors import EXIT_ERROR, EXIT_OK, EXIT_REPLAY_FAILED, InputError, NoisefloorError, StateError
from noisefloor.exit_codes import NOT_STARTED, WRAPPED_FAILED
from noisefloor.proxy._stats import Stats
from noisefloor.proxy.cli.options import ServeOptions
from noisefloor.proxy.launch import FINISH_SIGNAL, READY, READY_LINE_ENV
from noisefloor.proxy.replay.log import DeferredLog
from noisefloor.proxy.store.env import is_read_only
from noisefloor.proxy.store.log import Store, StoreError

EXIT_INTERRUPTED_BASE = 128  # ended by signal N: 128 + N (SIGINT 130, SIGTERM 143), as a shell reports it


def serve(o: ServeOptions) -> int:
    """Run until SIGINT / SIGTERM / FINISH_SIGNAL (or the wrapped command's end); the exit status.

    SIGINT and SIGTERM end the run with 128 + the signal (130, 143), the summary printed and every
    recorded exchange kept; that status wins over everything. FINISH_SIGNAL ends it with the run's
    own status: 0, 5 for exchanges not recorded, 3 for a strict replay that missed. A wrapped
    command that could not start is 127; one that failed is 6 (its own status printed), which wins
    over the replay's 3."""
    try:
        return _serve(o)
    except KeyboardInterrupt:  # before the proxy's own handlers are in place: nothing recorded yet
        click.echo("nfproxy: interrupted before it listened", err=True)
        return EXIT_INTERRUPTED_BASE + signal.SIGINT


def _serve(o: ServeOptions) -> int:
    check_port(o.host, o.port)  # before any work: mitmproxy's own advice for a busy port is not nfproxy's
    store, engine, upstream, writer = _open_engine(o)
    stats: Stats = engine.stats if engine is not None else Stats()
    run = _Serve(o, upstream)
    run.note = engine.ready_note() if o.replaying else ""
    try:
        asyncio.run(run.run(engine, stats))
    finally:
        try:
            if writer is not None:
                writer.close()
            if o.mode == "record":  # the answers released whose full write a loop turn had still to do
                engine.track_answers()
        finally:
            if store is not None:
                store.close()
    if not o.quiet:
        _summary(o, engine, stats)
    return _status_of(o, run, stats)


def _summary(o: ServeOptions, engine: Any, stats: Stats) -> None:
    click.echo(stats.summary(o.mode, str(o.store_path)), err=True)
    for line in engine.summary_lines() if o.replaying and engine is not None else ():
        click.echo(line, err=True)
    if stats.tls_failures:
        click.echo(f"nfproxy: {stats.tls_failures} client TLS handshakes failed: the client does not trust the "
                   f"nfproxy CA; run `nfproxy ca --confdir {o.ca_dir}` for the file and environment to set", err=True)


def _status_of(o: ServeOptions, run: _Serve, stats: Stats) -> int:
    if run.signal and run.signal != FINISH_SIGNAL:  # interrupted: 130 / 143, whatever the command or replay did
        return EXIT_INTERRUPTED_BASE + run.signal
    if run.returncode == NOT_STARTED:
        return NOT_STARTED
    if run.returncode:  # a wrapped command that failed: said as such, whatever its own number meant to it
        return WRAPPED_FAILED
    if o.replaying and o.strict and (stats.misses or stats.order_violations or stats.errors):
        return EXIT_REPLAY_FAILED
    if stats.unrecorded or stats.unwritten:  # a recording with holes must not pass for a whole one
        return EXIT_ERROR
    return EXIT_OK


def _same(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()


def _open_engine(o: ServeOptions) -> tuple[Store | None, Any, str | None, DeferredLog | None]:
    mode, store_path, rules, upstream, replay_log = o.mode, o.store_path, o.rules, o.upstream, o.replay_log
    if mode == "passthrough":
        return None, None, upstream, None
    from noisefloor.proxy.replay.replayer import Replayer

    # Replay writes into the recording only when asked (--replay-log STORE): a recording kept as a
    # test fixture stays byte-identical through any number of replays.
    into_source = mode == "replay" and replay_log is not None and _same(replay_log, store_path)
    read_only = mode == "replay" and (not into_source or is_read_only(store_path))
    try:
        # a stored body decompresses to no more than --max-body-mb: a bomb in the store costs what one on the wire would
        store = Store.open(store_path, write=not read_only, create=(mode == "record"), max_body=o.max_body)
        if mode == "record":
            store.lock_for_recording()
    except StoreError:
        if "store" in locals():
            store.close()
        raise
    writer = None
    try:
        if mode == "record":
            engine: Any = _recorder(o, store)
        else:
            def lost(exc: Exception) -> None:  # one request's log record; the next ones are written
                engine.stats.errors += 1
                click.echo(f"nfproxy: a replay log record could not be built ({exc.__class__.__name__}); "
                           "the answer was served, the record is missing", err=True)

            if into_source and read_only:
                click.echo(f"nfproxy: store {store_path} is read-only: replay answers from it but writes no log "
                           "records of its own (the summary still counts every request)", err=True)
                sink = _discard
            elif replay_log is None:
                sink = _discard
            else:
                target = store if into_source else Store.open(replay_log, write=True, create=True)
                writer = DeferredLog(target, on_error=lost)
                if not into_source:
                    target.bind_rules(rules.id, rules.describe(), also=rules.legacy_ids)
                    writer.closes = target
                sink = writer.submit
            sources, turn = _replay_sources(o, store)
            engine = Replayer(store, rules, strict=o.strict, allow_reuse=o.allow_reuse, sources=sources,
                              log=sink, order=o.replay_order, say=lambda line: click.echo(line, err=True))
            engine.turn = turn
            if engine.recorded == 0:
                raise StoreError(f"store {store_path} holds no recorded exchanges; record with --mode record first")
            upstream = upstream or store.meta("upstream")
    except NoisefloorError:  # a user's error, already one line; a bug keeps its traceback
        if writer is not None:
            writer.close()
        store.close()
        raise
    return store, engine, upstream, writer


def _replay_sources(o: ServeOptions, store: Store) -> tuple[tuple[str, ...], Any]:
    """The recorded sessions replay answers from, and the turn `--replay-session next / first` took."""
    from noisefloor.proxy.replay import turns

    how = turns.wanted(o.replay_sessions)
    if how is None:
        return o.replay_sessions, None
    turn = turns.take(store, o.store_path, o.ca_dir / turns.FOLDER, how)
    return (turn.session,), turn


def _recorder(o: ServeOptions, store: Store) -> Any:
    """The recorder, with what a killed nfproxy left written first and the session checked."""
    from noisefloor.proxy.record.recorder import Recorder

    engine = Recorder(store, o.rules)
    _recording_session(o, engine)
    if engine.recovered:
        click.echo(f"nfproxy: {counted(engine.recovered, 'answered exchange')} a killed nfproxy had not "
                   "written in full, written first", err=True)
    if o.upstream:
        store.set_meta("upstream", o.upstream)
    return engine


def _recording_session(o: ServeOptions, recorder: Any) -> None:
    """Refuse (one line) a --session the store already holds, or with --new-session say which
    numbered session this run records into."""
    from noisefloor.proxy.mitm.record_hook import refused_session

    recorder.numbered = o.new_session
    name = o.labels.session
    chosen = recorder.session_for(name)
    if chosen is None:
        raise InputError(refused_session(name))
    if chosen != name and not o.quiet:
        click.echo(f"nfproxy: recording into session '{visible(chosen)}' (the store holds '{visible(name)}')",
                   err=True)


def _discard(build: Any) -> None:
    """The replay log of a read-only store: nothing is written."""


class _Serve:
    """One proxy run: mitmproxy with the noisefloor addons, and optionally a wrapped command."""

    def __init__(self, o: ServeOptions, upstream: str | None) -> None:
        self.o = o
        self.mode, self.host, self.upstream = o.mode, o.host, upstream  # replay: the recording's upstream
        self.confdir, self.store_path, self.quiet, self.command = o.ca_dir, o.store_path, o.quiet, list(o.command)
        self.returncode: int | None = None
        self.signal = 0  # the signal that ended the run, if one did
        self.note = ""  # replay: which recorded sessions it follows (the ready line says it)

    async def run(self, engine: Any, stats: Stats) -> None:
        # Start-up (mitmproxy's import, its addons) allocates objects that live as long as the proxy:
        # the cyclic collector's passes over them find nothing and cost ~10% of the start's CPU.
        # Back on at the ready line (`_Ready`), or here if the start fails.
        gc.disable()
        from noisefloor.proxy.mitm import compat as mitm_compat

        # reverse mode: the CA only when a client speaks TLS to nfproxy; forward mode hands clients its file
        master = mitm_compat.lean_master(sys.stderr, lazy_ca=bool(self.upstream))
        master.options.update(
            listen_host=self.host,
            listen_port=self.o.port,
            mode=[f"reverse:{self.upstream}" if self.upstream else "regular"],
            # lazy: no upstream connection before a request needs one (replay needs none at all, and
            # a dead upstream in record mode becomes a recorded error exchange, not a lost connection)
            connection_strategy="lazy",
            confdir=str(self.confdir),
            termlog_verbosity="warn",
        )
        if self.o.upstream_ca:
            master.options.update(ssl_verify_upstream_trusted_ca=self.o.upstream_ca)
        self._add_addons(master, engine, stats)
        loop = asyncio.get_running_loop()

        def stop(sig: int) -> None:
            self.signal = self.signal or sig
            master.shutdown()

        for sig in (signal.SIGINT, signal.SIGTERM, FINISH_SIGNAL):
            loop.add_signal_handler(sig, stop, sig)
        master._asyncio_exception_handler = _quiet_cancellations(master._asyncio_exception_handler)
        try:
            await master.run()
        except asyncio.CancelledError:  # a shutdown mid-start: the summary still follows, no traceback
            pass
        finally:  # asyncio.run cancels what is left after this, with its own handler: keep that quiet too
            gc.enable()
            loop.set_exception_handler(_quiet_cancellations(lambda lp, ctx: lp.default_exception_handler(ctx)))

    def _add_addons(self, master: Any, engine: Any, stats: Stats) -> None:
        """The noisefloor addons of this mode, as one chain entry."""
        from noisefloor.proxy.mitm.addon import (
            BodyLimit,
            BodyRewrites,
            Group,
            NoUpstream,
            SessionLabels,
            Streams,
            TlsFailures,
        )
        from noisefloor.proxy.mitm.record_hook import Record
        from noisefloor.proxy.mitm.replay_hook import Replay

        o = self.o
        addons: list[Any] = [BodyLimit(o.max_body, stats), SessionLabels(o.labels),
                             BodyRewrites(list(o.overrides), o.variant), TlsFailures(stats)]
        if self.mode == "record":
            addons += [Record(engine, lambda: bool(self.signal)),
                       Streams(o.stream_timeout, capture=True, limit=o.max_body, timed=o.record_timing)]
        elif self.mode == "replay":
            addons.append(Replay(engine, o.replay_timed, o.order_wait))
            master.addons.add(NoUpstream(stats))  # its own chain entry: independent of the group
        else:
            addons.append(Streams(o.stream_timeout, capture=False))
        master.addons.add(Group(*addons, _Ready(self, master)))

    def environment(self, port: int) -> dict[str, str]:
        url = f"http://{self.host}:{port}"
        if self.upstream:  # each provider module names the variables its SDKs read
            from noisefloor.proxy.providers import sdk_env

            return {"NFPROXY_URL": url, **sdk_env(url)}
        from noisefloor.proxy.mitm.compat import ca_cert_path

        ca = os.path.abspath(ca_cert_path(self.confdir))  # a command may change directory
        return {"NFPROXY_URL": url, "HTTPS_PROXY": url, "HTTP_PROXY": url, "https_proxy": url, "http_proxy": url,
                **ca_environment(ca)}

    async def wrap(self, master: Any, port: int) -> None:
        env = {**os.environ, **self.environment(port)}
        try:
            proc = await asyncio.create_subprocess_exec(*self.command, env=env)
        except OSError as exc:
            click.echo(f"nfproxy: cannot run {self.command[0]!r}: {exc.strerror}", err=True)
            self.returncode = NOT_STARTED
            master.shutdown()
            return
        try:
            self.returncode = _status(await proc.wait())
        finally:
            if proc.returncode is None:  # the proxy is shutting down first: take the command with it
                proc.terminate()
                self.returncode = _status(await proc.wait())
            elif self.returncode:
                click.echo(failed_line(self.command, self.returncode), err=True)
            master.shutdown()


def _quiet_cancellations(handler: Any) -> Any:
    """mitmproxy's loop exception handler, minus the client-connection tasks that a shutdown
    cancels (asyncio's stream callback reports each one as an error with a traceback)."""

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if isinstance(context.get("exception"), asyncio.CancelledError):
            return
        handler(loop, context)

    return handle


def failed_line(command: Sequence[str], status: int) -> str:
    """The one line that says a wrapped command failed, with its own status, and what nfproxy exits with."""
    how = f"was killed by signal {status - EXIT_INTERRUPTED_BASE}" if status > EXIT_INTERRUPTED_BASE else \
        f"exited {status}"
    shown = visible(shlex.join(command))
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return (f"nfproxy: the wrapped command `{shown}` {how}; nfproxy exits {WRAPPED_FAILED} (a failed wrapped "
            "command; its own status is the one above)")


def _status(code: int) -> int:
    """A child's exit status as a shell reports it: killed by signal N is 128 + N."""
    return EXIT_INTERRUPTED_BASE - code if code < 0 else code


def check_port(host: str, port: int) -> None:
    """Refuse, with the fix, an address nfproxy cannot listen on (a busy port most often)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will
        try:
            sock.bind((host, port))
        except OSError as exc:
            busy = exc.errno == errno.EADDRINUSE
            why = "the port is in use (another nfproxy?)" if busy else (exc.strerror or str(exc))
            raise StateError(f"cannot listen on {host}:{port}: {why}; choose another port, or --listen {host}:0 "
                             "for any free one (the ready line names it)") from None


def ca_environment(ca: str) -> dict[str, str]:
    return {"SSL_CERT_FILE": ca, "REQUESTS_CA_BUNDLE": ca, "NODE_EXTRA_CA_CERTS": ca, "CURL_CA_BUNDLE": ca}


class _Ready:
    """Prints the address once mitmproxy listens, then starts the wrapped command if there is one."""

    def __init__(self, serve: _Serve, master: Any) -> None:
        self.serve = serve
        self.master = master
        self._task: asyncio.Task[None] | None = None

    def running(self) -> None:
        from noisefloor.proxy.mitm.compat import listen_addrs

        # Everything loaded so far (mitmproxy, its addons, the replay index) lives as long as the
        # proxy: keep it out of the cyclic collector's full passes, which otherwise stall a request.
        gc.freeze()
        gc.enable()
        addrs = listen_addrs()
        if not addrs:
            return
        host, port = addrs[0][:2]
        s = self.serve
        target = f"-> {s.upstream}" if s.upstream else "(regular proxy)"
        if s.mode == "replay" and s.upstream:  # a replay answers from the store: never an arrow to a live host
            target = f"for {s.upstream} (answered from the store, nothing sent there)"
        where = "" if s.mode == "passthrough" else f", store {s.store_path}"
        if not s.quiet:
            click.echo(f"nfproxy {s.mode} listening on http://{host}:{port} {target}{where}"
                       + (f"; {s.note}" if s.note else ""), err=True)
        if not s.quiet or os.environ.get(READY_LINE_ENV):  # machine-readable (the port, when 0 was asked for)
            print(f"{READY}{host}:{port}", file=sys.stderr, flush=True)
        if s.command:
            self._task = asyncio.get_running_loop().create_task(s.wrap(self.master, port))


