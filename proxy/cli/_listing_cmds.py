"""`nfproxy log` and `nfproxy show`: reading a store, a line per exchange or one exchange whole,
registered on nfproxy's group."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

import click

from noisefloor.display import Visible, json_line, json_text
from noisefloor.proxy.cli.listing import Filters
from noisefloor.proxy.cli.options import max_body_option, split_store, store_words
from noisefloor.proxy.store.exchange import Head
from noisefloor.proxy.store.heads import Parts
from noisefloor.proxy.store.log import Exchange, Store


@click.command("log")
@store_words("[STORE]")
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
@max_body_option
def log_cmd(words: tuple[str, ...], store_opt: Path | None, session: str | None, task: str | None,
            condition: str | None, status: str | None, result: str | None, miss: bool, model: str | None,
            limit: int | None, sessions_only: bool, as_json: bool, max_body_mb: int) -> None:
    """List STORE's sessions and exchanges, a line each (STORE: recordings/log.lmdb by default)."""
    store_path, _ = split_store(words, store_opt, (0, 0))
    filters = Filters(condition=condition, task=task, session=session, status=status,
                      result="miss" if miss else result, model=model)
    with Store.open(store_path, write=False, max_body=max_body_mb << 20) as store:
        if note := store.answered.note():  # listed once they are written: say where they are
            click.echo(f"nfproxy log: {note}", err=True)
        if as_json:
            if filters.empty and limit is None:  # every record: the stored texts, checked, a batch at a time
                _json_chunks(store.walk.listed_chunks())
                return
            lines = (ex.json_bytes() for ex in _wanted(store.exchanges(), filters, store)) if not filters.empty \
                else store.walk.listed_records()  # no filter: the stored text, checked, with no Exchange built
            _json_lines(islice(lines, limit))
            return
        line = _Line(Visible())
        if filters.empty and limit is None:  # every exchange: the heads as the store keeps them, a batch at a time
            seen = _listing(line.of_part_batches(store.walk.head_part_batches(), not sessions_only), store_path, line.shown)
        else:
            if filters.empty:
                entries = line.of_parts(store.walk.head_parts(), not sessions_only)
            else:  # the records' heads suffice, except for filters that read more
                source = store.exchanges() if filters.q or filters.order else store.walk.heads()
                entries = line.of_heads(_wanted(source, filters, store), not sessions_only)
            seen = _listing(_one_each(islice(entries, limit)), store_path, line.shown)
        replayed = {name for name, (_, modes, _) in seen.items() if "replay" in _modes(modes)}
        if replayed:  # a second pass, over replay records only where the listing showed some
            _trajectories(store, replayed)


def _trajectories(store: Store, sessions: set[str]) -> None:
    """Which recorded session each listed replay session followed, and where it diverged."""
    from noisefloor.proxy.replay import trajectory

    def records() -> Iterator[tuple[str, Any, str | None]]:
        for ex in store.exchanges():
            if ex.mode == "replay" and ex.session in sessions:
                replay = ex.replay if isinstance(ex.replay, dict) else {}
                src = replay.get("from")
                if not isinstance(src, str) and isinstance(replay.get("source_id"), int):  # written before "from"
                    entry = store.index.entry(replay["source_id"])
                    src = entry.session if entry is not None else None
                yield ex.session, replay, src

    found = trajectory.from_records(records())
    lines = [line for name, t in found.items() for line in trajectory.describe(name, t)]
    sys.stdout.write("replay trajectories:\n" + "".join(f"{x}\n" for x in lines))
    sys.stdout.flush()


def _wanted(exchanges: Iterator[Any], filters: Filters, store: Store) -> Iterator[Any]:
    return exchanges if filters.empty else (ex for ex in exchanges if filters.wanted(ex, store))


_CHUNK = 1 << 16  # bytes of output gathered before one write


def _json_lines(records: Iterable[bytes]) -> None:
    """Streamed: one record in memory at a time; characters JSON leaves raw but a terminal obeys are escaped."""
    out, size = [], 0
    write = sys.stdout.buffer.write
    for record in records:
        line = json_line(record)
        out.append(line)
        size += len(line) + 1
        if size >= _CHUNK:
            out.append(b"")
            write(b"\n".join(out))
            out, size = [], 0
    if out:
        out.append(b"")
        write(b"\n".join(out))
    sys.stdout.flush()


def _json_chunks(chunks: Iterable[bytes]) -> None:
    """Lines already joined, each chunk written as it comes (what came before a damaged record is
    printed); `json_line` on a chunk is `json_line` on each of its lines (it leaves newlines alone)."""
    write = sys.stdout.buffer.write
    for chunk in chunks:
        write(json_line(chunk))
    sys.stdout.flush()


Entry = tuple[str, str, Any, str]  # an exchange's session, mode, condition and line ("": sessions only)
Group = tuple[str, str, Any]  # the session, mode and condition exchanges are counted by
Lines = tuple[str, list[tuple[Group, int]]]  # some exchanges' lines, and how many there are of each group


def _one_each(entries: Iterable[Entry]) -> Iterator[Lines]:
    for session, mode, condition, text in entries:
        yield text, [((session, mode, condition), 1)]


def _listing(batches: Iterable[Lines], store_path: Path, shown: Callable[[object], str]) -> dict[str, list[Any]]:
    """The sessions, then a line per exchange. One pass: lines go to a spool file while sessions are
    counted, so memory holds sessions, never exchanges."""
    per_session: dict[str, list[Any]] = {}  # name -> [exchanges, mode (a set once there are two), condition]
    with tempfile.TemporaryFile("w+b") as spool:
        lines: list[str] = []
        size = 0
        for text, groups in batches:
            for (session, mode, condition), n in groups:
                s = per_session.get(session)
                if s is None:
                    per_session[session] = [n, mode, condition]
                else:
                    s[0] += n
                    if s[1] != mode:
                        s[1] = {*_modes(s[1]), mode}
            if text:
                lines.append(text)
                size += len(text)
                if size >= _CHUNK:
                    spool.write(_encoded(lines))
                    lines.clear()
                    size = 0
        spool.write(_encoded(lines))
        out = sys.stdout.buffer
        out.write(_encoded(_summary(per_session, store_path, shown)))
        spool.seek(0)
        shutil.copyfileobj(spool, out, 1 << 20)
        out.flush()
    return per_session  # name -> [exchanges, mode (a set once there are two), condition]


def _modes(m: str | set[str]) -> set[str]:
    return m if isinstance(m, set) else {m}


def _summary(per_session: dict[str, list[Any]], store_path: Path, shown: Callable[[object], str]) -> Iterator[str]:
    yield f"{len(per_session)} sessions in {store_path}\n"
    for name, (n, modes, cond) in per_session.items():
        cond_text = f" condition={shown(cond)}" if cond else ""
        modes_text = shown(modes) if type(modes) is str else ', '.join(sorted(map(shown, modes)))
        yield f"  {shown(name)}: {n} exchanges ({modes_text}){cond_text}\n"


def _encoded(lines: Iterable[str]) -> bytes:
    """Lines as UTF-8; a lone surrogate (undecodable bytes a client sent) is written as its escape, never raw."""
    return "".join(lines).encode("utf-8", "backslashreplace")


class _Line:
    """One exchange's line. Labels and URLs came from clients: shown with control characters visible
    (`shown`: `visible`); the middle of a line (mode, session, route, status, result) repeats over
    a session's exchanges, so it is built once per distinct one (at most `_MIDDLES` remembered)."""

    def __init__(self, shown: Callable[[object], str]) -> None:
        self.shown = shown
        self._stamp = _Stamps()
        self._middles: dict[tuple[Any, ...], str] = {}  # a Head's middle by its parts
        self._by_parts: dict[Any, str] = {}  # a stored head's middle by its sets (numbers or tuples), status
        self._pieces: dict[Any, Any] = {}  # the shown route (mode, method, URL) and status (code, result)

    def of_heads(self, heads: Iterable[Head | Exchange], with_lines: bool) -> Iterator[Entry]:
        for ex in heads:
            yield ex.session, ex.mode, ex.condition, self(ex) if with_lines else ""

    def of_part_batches(self, batches: Iterable[tuple[Sequence[int], Sequence[Parts]]],
                        with_lines: bool) -> Iterator[Lines]:
        """Each batch of heads as the store keeps them (`Walk.head_part_batches`): its lines, and
        its exchanges counted by session, mode and condition (a Counter: one C call a batch)."""
        for ids, parts in batches:
            lines, keys = self._batch(ids, parts, with_lines)
            first = dict(zip(keys, parts))  # a head of each key: its labels and route give its group
            yield "".join(lines), [(_group(first[k]), n) for k, n in Counter(keys).items()]

    def of_parts(self, heads: Iterable[tuple[int, Parts]], with_lines: bool) -> Iterator[Entry]:
        """`of_part_batches` one head at a time (a listing with --limit reads no further than it shows)."""
        for exchange_id, p in heads:
            lines, _ = self._batch((exchange_id,), (p,), with_lines)
            yield (*_group(p), lines[0] if lines else "")

    def _batch(self, ids: Sequence[int], parts: Sequence[Parts], with_lines: bool) -> tuple[list[str], list[Any]]:
        """The lines of some heads (none without `with_lines`) and each one's key in `_by_parts`:
        the middle of a line is looked up by the numbers of the labels and route sets a session's
        heads share (their tuples, for a head read from its record), and the key is shown from its digest."""
        if len(self._by_parts) >= _MIDDLES:
            self._by_parts.clear()
        middles, shown, stamp = self._by_parts, self.shown, self._stamp
        second, when = stamp.second, stamp.text
        lines: list[str] = []
        keys: list[Any] = []
        for exchange_id, (s, labels, route) in zip(ids, parts):
            code, failed = s.status, s.error is not None
            key = (s.labels, s.route, code, failed) if s.labels else (labels, route, code, failed)
            keys.append(key)
            if not with_lines:
                continue
            middle = middles.get(key)
            if middle is None:
                middle = middles[key] = self._middle_of(labels, route, code, failed)
            if s.other_key is None:
                digest = s.key[:6].hex()
            else:
                digest = s.other_key[:12]
                digest = digest if digest.isalnum() else shown(digest)
            if int(s.time) != second:
                second = int(s.time)
                when = stamp(second)
            lines.append(f"{exchange_id:>6} {when} {middle} key={digest} occ={s.occurrence}\n")
        return lines, keys

    def _middle_of(self, labels: tuple[Any, ...], route: tuple[Any, ...], code: int | None, failed: bool) -> str:
        """A stored head's middle, from its labels and route sets."""
        return self._middle(route[0], labels[0], route[1], route[2], code, route[5] or ("error" if failed else ""))

    def _middle(self, mode: str, session: str, method: str, url: str, code: int | None, res: Any) -> str:
        """A line's middle. A session's exchanges differ in route or status now and then, so it is
        put together from the shown route (mode, method, URL: shared by most of a store) and the
        status, each remembered, around the session (`shown` remembers it)."""
        pieces, shown = self._pieces, self.shown
        if len(pieces) >= _MIDDLES:
            pieces.clear()
        around = pieces.get((mode, method, url))
        if around is None:
            around = pieces[(mode, method, url)] = (f"{shown(mode):<7} ", f" {shown(method)} {shown(url)} ")
        end = pieces.get((code, res))
        if end is None:
            end = pieces[(code, res)] = f"{'ERR' if code is None else code} {shown(res if type(res) is str else str(res))}"
        return f"{around[0]}{shown(session)}{around[1]}{end}"

    def __call__(self, ex: Head | Exchange) -> str:
        method, url, code = ex.method, ex.url, ex.status
        res = ex.replay_result or ("error" if ex.error else "")
        parts = (ex.mode, ex.session, method, url, code, res)
        middle = self._middles.get(parts)
        if middle is None:
            if len(self._middles) >= _MIDDLES:
                self._middles.clear()
            middle = self._middles[parts] = self._middle(*parts)
        key = ex.key[:12]  # a digest the proxy wrote; escaped should a damaged record hold anything else
        return (f"{ex.id:>6} {self._stamp(ex.time)} {middle} key={key if key.isalnum() else self.shown(key)} "
                f"occ={ex.occurrence}\n")


_MIDDLES = 1 << 16


def _group(p: Parts) -> Group:
    return p[1][0], p[2][0], p[1][3]


class _Stamps:
    """Local time to the second, formatted once per second rather than once per exchange."""

    def __init__(self) -> None:
        self.second: int | None = None  # the second last formatted, and its text (a batch reads them)
        self.text = ""

    def __call__(self, t: float) -> str:
        second = int(t)
        if second != self.second:
            self.second, self.text = second, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        return self.text


@click.command("show")
@store_words("[STORE] ID")
@max_body_option
def show_cmd(words: tuple[str, ...], store_opt: Path | None, max_body_mb: int) -> None:
    """Print exchange ID of STORE: its record and both bodies, decompressed (secrets were never stored)."""
    store_path, (given,) = split_store(words, store_opt, (1, 1), wanted="exchange ID")
    if not given.isdigit():
        raise click.BadParameter(f"{given!r} is not an exchange id (a whole number; `nfproxy log` lists them)",
                                 param_hint="ID")
    exchange_id = int(given)
    with Store.open(store_path, write=False, max_body=max_body_mb << 20) as store:
        ex = store.exchange(exchange_id)
        if ex is None:
            note = store.answered.note()
            raise click.ClickException(f"no exchange {exchange_id} in {store_path}; " + (
                f"{note}" if note else "list them with `nfproxy log`"))
        doc = ex.to_json()
        for part in ("request", "response"):
            if doc[part]:
                doc[part] = dict(doc[part])  # to_json is shallow: the exchange's own objects stay as read
                doc[part]["body_text"] = store.bodies.readable(doc[part], exchange_id, part)
        click.echo(json_text(json.dumps(doc, indent=2, ensure_ascii=False)))


def register(group: click.Group) -> None:
    group.add_command(log_cmd)
    group.add_command(show_cmd)
