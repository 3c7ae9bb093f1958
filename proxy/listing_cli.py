"""`nfproxy log` and `nfproxy show`: reading a store, a line per exchange or one exchange whole,
registered on nfproxy's group."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable
from itertools import islice
from pathlib import Path
from typing import Any

import click

from noisefloor.display import json_text, visible
from noisefloor.proxy.listing import Filters
from noisefloor.proxy.options import store_option
from noisefloor.proxy.store import Exchange, Store


@click.command("log")
@store_option
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
    filters = Filters(condition=condition, task=task, session=session, status=status,
                      result="miss" if miss else result, model=model)
    with Store.open(store_path, write=False) as store:
        if as_json:
            _json_lines(islice((ex for ex in store.exchanges() if filters.wanted(ex, store)), limit))
            return
        # the records' heads suffice, except for filters that read more
        source = store.exchanges() if filters.q or filters.order else store.heads()
        _listing(islice((ex for ex in source if filters.wanted(ex, store)), limit), store_path, sessions_only)


def _json_lines(exchanges: Iterable[Exchange]) -> None:
    """Streamed: one record in memory at a time; characters JSON leaves raw but a terminal obeys are escaped."""
    write = sys.stdout.buffer.write
    for ex in exchanges:
        write(json_text(ex.json_bytes().decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape") + b"\n")
    sys.stdout.flush()


def _listing(exchanges: Iterable[Exchange], store_path: Path, sessions_only: bool) -> None:
    """The sessions, then a line per exchange. One pass: lines go to a spool file while sessions are
    counted, so memory holds sessions, never exchanges."""
    per_session: dict[str, list[Any]] = {}  # name -> [exchanges, modes, condition]
    stamp = _Stamps()
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="surrogateescape") as spool:
        for ex in exchanges:
            s = per_session.get(ex.session)
            if s is None:
                s = per_session[ex.session] = [0, set(), ex.condition]
            s[0] += 1
            s[1].add(ex.mode)
            if not sessions_only:
                spool.write(_line(ex, stamp))
        click.echo(f"{len(per_session)} sessions in {store_path}")
        for name, (n, modes, cond) in per_session.items():
            shown = f" condition={visible(cond)}" if cond else ""
            click.echo(f"  {visible(name)}: {n} exchanges ({', '.join(sorted(modes))}){shown}")
        sys.stdout.flush()
        spool.seek(0)
        shutil.copyfileobj(spool, sys.stdout, 1 << 20)


def _line(ex: Exchange, stamp: _Stamps) -> str:
    code = ex.status if ex.response is not None else "ERR"
    res = ex.replay_result or ("error" if ex.error else "")
    # labels and URLs came from clients: shown with control characters visible
    return (f"{ex.id:>6} {stamp(ex.time)} {ex.mode:<7} {visible(ex.session)} {visible(ex.request['method'])} "
            f"{visible(ex.request['url'])} {code} {res} key={ex.key[:12]} occ={ex.occurrence}\n")


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


@click.command("show")
@click.argument("exchange_id", type=int)
@store_option
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


def register(group: click.Group) -> None:
    group.add_command(log_cmd)
    group.add_command(show_cmd)
