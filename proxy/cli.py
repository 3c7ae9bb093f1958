"""`nfproxy`: run the recording/replaying proxy, and read what it logged."""

from __future__ import annotations

import json
import secrets as _random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click

from noisefloor._cli import WrapsAfterDashes, default_group
from noisefloor.display import json_text, visible
from noisefloor.proxy import perturb
from noisefloor.proxy.keys import RuleError, Rules
from noisefloor.proxy.overrides import Override
from noisefloor.proxy.providers import PROVIDERS
from noisefloor.proxy.serve import ServeOptions, ca_environment, serve
from noisefloor.proxy.store import Store
from noisefloor.proxy.traffic import Labels

DEFAULT_STORE = "recordings/log.lmdb"


@default_group("run")
def main() -> None:
    """Record, replay and pass through LLM API traffic, content-addressed in an LMDB log.

    Without a subcommand, runs the proxy (`nfproxy run`).
    """


@main.command("run", cls=WrapsAfterDashes, context_settings={"ignore_unknown_options": False})
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
@click.option("--profile", type=click.Choice(sorted(PROVIDERS)), help="Force a provider profile (default: by host and path).")
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
@click.option("--replay-order", type=click.Choice(["content", "recorded"]), default="content", show_default=True,
              help="Replay pairing: by content (a request waits for nothing; only one that carries an answer not "
                   "served in its session is a call-order violation), or the recorded order, strictly.")
@click.option("--replay-log", type=click.Path(path_type=Path), metavar="STORE",
              help="Replay: write replay's own exchange records into this store (the --store path too: into the "
                   "recording). Default: none written; the recording stays byte-identical.")
@click.option("--replay-log-in-store", is_flag=True,
              help="Replay: write replay's own exchange records into the recording (--store) itself, as nfladder does.")
@click.option("--order-wait", default=5.0, show_default=True, type=click.FloatRange(min=0),
              help="Replay with --replay-order recorded: seconds a request waits for the requests that came before "
                   "it in the recording (concurrent harnesses send them a moment apart); then a call-order violation.")
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
        replay_timing: str, replay_order: str, replay_log: Path | None, replay_log_in_store: bool, order_wait: float, stream_timeout: float, confdir: Path | None, upstream_ca: str | None,
        max_body_mb: int,
        quiet: bool, command: tuple[str, ...]) -> None:
    """Run the proxy in the foreground until SIGINT or SIGTERM.

    With a COMMAND after `--`, start the proxy, run the command with the proxy environment set
    (reverse mode: OPENAI_BASE_URL, ANTHROPIC_BASE_URL, GOOGLE_GEMINI_BASE_URL; regular mode: HTTPS_PROXY and the CA
    variables), stop when it exits and return its status (3 if a strict replay missed instead).
    """
    host, port = _parse_listen(listen)
    _check_upstream(upstream)
    try:
        rules = Rules(ignore_fields=ignore_fields, profile=profile)
        override_list = [Override.parse(x) for x in sets]
        variant = (perturbation, perturb.pick(perturbation, perturb.load_variants(perturb_file))) if perturbation else None
    except (RuleError, perturb.PerturbError) as exc:
        raise click.BadParameter(str(exc)) from None
    options = ServeOptions(
        mode=mode, store_path=store_path, host=host, port=port, upstream=upstream, rules=rules,
        labels=Labels(session or _new_session_id(), task, replicate, condition), strict=strict,
        allow_reuse=allow_reuse, replay_sessions=replay_sessions, replay_timed=replay_timing == "recorded",
        order_wait=order_wait, replay_order=replay_order,
        replay_log=store_path if replay_log_in_store else replay_log, overrides=tuple(override_list), variant=variant,
        stream_timeout=stream_timeout,
        max_body=max_body_mb << 20, confdir=(confdir or store_path.parent / "mitmproxy-ca").absolute(),
        upstream_ca=upstream_ca,
        quiet=quiet, command=tuple(command),
    )
    sys.exit(serve(options))

def _parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise click.BadParameter(f"{listen!r} is not HOST:PORT (e.g. 127.0.0.1:8080)", param_hint="--listen")
    return host.strip("[]") or "127.0.0.1", int(port)


def _check_upstream(upstream: str | None) -> None:
    """An origin with a scheme and a host; `127.0.0.1:9100` would be read as https and fail on every request."""
    if upstream is None:
        return
    parts = urlsplit(upstream)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise click.BadParameter(f"{upstream!r} is not an origin with a scheme; write http://{upstream} (or "
                                 f"https://{upstream})", param_hint="--upstream")


def _new_session_id() -> str:
    return time.strftime("run-%Y%m%dT%H%M%S-") + _random.token_hex(3)


@main.command("ca")
@click.option("--confdir", type=click.Path(path_type=Path), default=Path(DEFAULT_STORE).parent / "mitmproxy-ca",
              show_default=True, help="The folder nfproxy keeps its CA in (beside the store by default).")
@click.option("--listen", default="127.0.0.1:8080", show_default=True, help="Where the proxy listens (for HTTPS_PROXY).")
def ca_cmd(confdir: Path, listen: str) -> None:
    """Print the CA certificate path and the environment a client needs to trust it (forward mode)."""
    from noisefloor.proxy.mitm_compat import ensure_ca

    ca = ensure_ca(confdir.resolve())  # creates the CA on first use
    click.echo(f"# nfproxy CA certificate: {ca}")
    click.echo(f"# for a client using nfproxy (listening on {listen}) as its HTTPS proxy:")
    for k, v in {"HTTPS_PROXY": f"http://{listen}", **ca_environment(str(ca))}.items():
        click.echo(f"export {k}={v}")


# -- reading the log -------------------------------------------------------------------------


@main.command("log")
@click.option("--store", "store_path", default=DEFAULT_STORE, show_default=True, type=click.Path(path_type=Path))
@click.option("--session", help="Only this session's exchanges.")
@click.option("--task", help="Only exchanges labelled with this task.")
@click.option("--condition", help="Only exchanges labelled with this condition.")
@click.option("--status", help="Only this response status: 200, 4xx, 5xx, or error (no response).")
@click.option("--result", type=click.Choice(["recorded", "hit", "miss", "order_violation", "error"]),
              help="Only this replay result (miss: the requests a replay could not answer).")
@click.option("--miss", is_flag=True, help="Same as --result miss.")
@click.option("--model", help="Only exchanges the provider answered with this model.")
@click.option("--limit", type=click.IntRange(min=1), help="Stop after this many exchanges.")
@click.option("--sessions-only", is_flag=True, help="List sessions, not exchanges.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per exchange (JSON Lines), for scripts.")
def log_cmd(store_path: Path, session: str | None, task: str | None, condition: str | None, status: str | None,
            result: str | None, miss: bool, model: str | None, limit: int | None, sessions_only: bool,
            as_json: bool) -> None:
    """List sessions and exchanges, a line each."""
    from itertools import islice

    from noisefloor.proxy.listing import Filters

    filters = Filters(condition=condition, task=task, session=session, status=status,
                      result="miss" if miss else result, model=model)

    with Store.open(store_path, write=False) as store:
        if as_json:  # streamed: one record in memory at a time
            write = sys.stdout.buffer.write
            for ex in islice((ex for ex in store.exchanges() if filters.wanted(ex, store)), limit):
                # characters JSON leaves raw but a terminal obeys are escaped (display.json_text)
                write(json_text(ex.json_bytes().decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
                      + b"\n")
            sys.stdout.flush()
            return
        # one pass over the records' heads (whole records only for filters that read more): lines
        # go to a spool file while sessions are counted, so memory holds sessions, never exchanges
        source = store.exchanges() if filters.q or filters.order else store.heads()
        per_session: dict[str, list[Any]] = {}  # name -> [exchanges, modes, condition]
        stamp = _Stamps()
        with tempfile.TemporaryFile("w+", encoding="utf-8", errors="surrogateescape") as spool:
            write = spool.write
            for ex in islice((ex for ex in source if filters.wanted(ex, store)), limit):
                s = per_session.get(ex.session)
                if s is None:
                    s = per_session[ex.session] = [0, set(), ex.condition]
                s[0] += 1
                s[1].add(ex.mode)
                if sessions_only:
                    continue
                code = ex.status if ex.response is not None else "ERR"
                res = ex.replay_result or ("error" if ex.error else "")
                # labels and URLs came from clients: shown with control characters visible
                write(f"{ex.id:>6} {stamp(ex.time)} {ex.mode:<7} {visible(ex.session)} {visible(ex.request['method'])} "
                      f"{visible(ex.request['url'])} {code} {res} key={ex.key[:12]} occ={ex.occurrence}\n")
            click.echo(f"{len(per_session)} sessions in {store_path}")
            for name, (n, modes, cond) in per_session.items():
                shown = f" condition={visible(cond)}" if cond else ""
                click.echo(f"  {visible(name)}: {n} exchanges ({', '.join(sorted(modes))}){shown}")
            sys.stdout.flush()
            spool.seek(0)
            shutil.copyfileobj(spool, sys.stdout, 1 << 20)


class _Stamps:
    """Local time to the second, formatted once per second rather than once per exchange."""

    def __init__(self) -> None:
        self._second: int | None = None
        self._text = ""

    def __call__(self, t: float) -> str:
        second = int(t)
        if second != self._second:
            self._second, self._text = second, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        return self._text


@main.command("show")
@click.argument("exchange_id", type=int)
@click.option("--store", "store_path", default=DEFAULT_STORE, show_default=True, type=click.Path(path_type=Path))
def show_cmd(exchange_id: int, store_path: Path) -> None:
    """Print one exchange: its record and both bodies, decompressed (secrets were never stored)."""
    with Store.open(store_path, write=False) as store:
        ex = store.exchange(exchange_id)
        if ex is None:
            raise click.ClickException(f"no exchange {exchange_id} in {store_path}; list them with `nfproxy log`")
        doc = ex.to_json()
        for part in ("request", "response"):
            if doc[part]:
                doc[part] = dict(doc[part])  # to_json is shallow: the exchange's own objects stay as read
                doc[part]["body_text"] = store.readable_body(doc[part], exchange_id, part)
        click.echo(json_text(json.dumps(doc, indent=2, ensure_ascii=False)))



@main.command("merge")
@click.argument("out", type=click.Path(path_type=Path))
@click.argument("shards", nargs=-1, required=True, type=click.Path(path_type=Path))
def merge_cmd(out: Path, shards: tuple[Path, ...]) -> None:
    """Combine stores recorded by different processes or machines into OUT (created if new).

    Bodies are deduplicated by content hash; sessions, replay order and outcome rows are kept. A
    damaged shard, a session name in two shards with different exchanges, or shards recorded
    under different normalization rules are refused before anything is written. Merging again
    adds only what OUT lacks, so an interrupted merge is finished by running it again.
    """
    from noisefloor.proxy.merge import merge

    r = merge(out, list(shards), lambda s: click.echo(f"nfproxy merge: {s}", err=True))
    click.echo(f"merged {r.shards} shards into {out}: {r.sessions_added} sessions and {r.exchanges_added} exchanges "
               f"added, {r.sessions_present} sessions already there; {r.bodies_added} bodies added, "
               f"{r.bodies_shared} shared; {r.outcome_rows_added} outcome rows added")


@main.command("compact")
@click.option("--store", "store_path", default=DEFAULT_STORE, show_default=True, type=click.Path(path_type=Path))
def compact_cmd(store_path: Path) -> None:
    """Rewrite a store in place: every value verified, compression dictionaries trained on all of it,
    the data file cut to the pages it uses. Run it on a finished recording (not while a proxy records)."""
    _rewrite(store_path, "compacted")


@main.command("migrate")
@click.option("--store", "store_path", default=DEFAULT_STORE, show_default=True, type=click.Path(path_type=Path))
def migrate_cmd(store_path: Path) -> None:
    """Rewrite a store made by an older nfproxy in today's format (older stores are also read as they are)."""
    _rewrite(store_path, "migrated")


def _rewrite(store_path: Path, verb: str) -> None:
    from noisefloor.proxy.compact import rewrite
    from noisefloor.proxy.store import FORMAT

    r = rewrite(store_path, lambda s: click.echo(f"nfproxy: {s}", err=True))
    was = f" from {r.from_format}" if r.from_format and r.from_format != FORMAT else ""
    click.echo(f"{verb} {store_path}{was} to {FORMAT}: {r.exchanges} exchanges, {r.bodies} bodies; data file "
               f"{r.before_bytes / 1e6:.1f} MB -> {r.after_bytes / 1e6:.1f} MB")


from noisefloor.proxy import transfer_cli  # noqa: E402 - export / import, kept in their own module

transfer_cli.register(main)


if __name__ == "__main__":  # last: every subcommand is defined by now (launch.py's fallback form runs this)
    main()
