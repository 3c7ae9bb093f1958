"""`nfproxy export` and `nfproxy import`: the commands over transfer.py, registered on nfproxy's
group. mitmproxy's flow files are read here (the CLI edge), into plain data."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import click

from noisefloor import outputs
from noisefloor.proxy.cli.options import max_body_option, split_store, store_words
from noisefloor.proxy.request.keys import RuleError, Rules
from noisefloor.proxy.store.log import Store
from noisefloor.proxy.transfer.formats import (
    Incoming,
    TransferError,
    checked,
    export_har,
    export_jsonl,
    har_items,
    import_into,
)


@click.command("export")
@store_words("STORE")
@click.option("--format", "fmt", type=click.Choice(["har", "jsonl"]), default="har", show_default=True,
              help="HAR 1.2 (other tools read it; `nfproxy import` restores it exactly), or JSON Lines with the "
                   "bodies decoded and no times (a reviewable diff of a recording).")
@click.option("-o", "--output", default="-", show_default=True, help="File to write ('-': stdout).")
@click.option("--session", help="Only this session's exchanges.")
@click.option("--all-modes", is_flag=True, help="Replay and passthrough exchanges too (default: recorded ones).")
@max_body_option
def export_cmd(words: tuple[str, ...], store_opt: Path | None, fmt: str, output: str, session: str | None,
               all_modes: bool, max_body_mb: int) -> None:
    """Write STORE's exchanges as HAR or JSON Lines (secrets were never stored). A file is written
    whole or not at all: a failed export leaves no partial -o file."""
    store_path, _ = split_store(words, store_opt, (0, 0), default=False)
    write = export_har if fmt == "har" else export_jsonl
    outputs.check_writable(None if output == "-" else output, "-o")
    with Store.open(store_path, write=False, max_body=max_body_mb << 20) as store:
        if note := store.answered.note():
            click.echo(f"nfproxy export: {note}", err=True)
        if output == "-":
            n = write(store, sys.stdout, session=session, mode=None if all_modes else "record")
        else:
            with outputs.atomic_path(output) as tmp, open(tmp, "w", encoding="utf-8") as fh:
                n = write(store, fh, session=session, mode=None if all_modes else "record")
    click.echo(f"nfproxy export: {n} exchanges from {store_path} as {fmt}", err=True)


def flow_items(path: Path) -> Iterator[Incoming]:
    """HTTP flows of a mitmproxy file (`mitmdump -w`), bodies as on the wire."""
    from noisefloor.proxy.mitm import compat as mitm_compat

    with path.open("rb") as fh:
        try:
            for flow in mitm_compat.read_http_flows(fh):
                req, resp = flow.request, flow.response

                def pairs(h: mitm_compat.http.Headers) -> tuple[tuple[str, str], ...]:
                    return tuple((k.decode("latin-1"), v.decode("utf-8", "surrogateescape")) for k, v in h.fields)

                started = req.timestamp_start
                ended = resp.timestamp_end if resp is not None and resp.timestamp_end else None
                yield Incoming(
                    method=req.method, url=req.pretty_url, headers=pairs(req.headers), body=req.raw_content or b"",
                    started=started, status=resp.status_code if resp is not None else None,
                    response_headers=pairs(resp.headers) if resp is not None else (),
                    response_body=(resp.raw_content or b"") if resp is not None else b"",
                    ended=ended, latency_ms=(ended - started) * 1000 if ended else None,
                    error=flow.error.msg if flow.error else None)
        except (mitm_compat.FlowFileError, ValueError, TypeError, KeyError, IndexError, AttributeError,
                RecursionError) as exc:
            why = "nested too deeply" if isinstance(exc, RecursionError) else f"{exc.__class__.__name__}: {exc}"
            raise TransferError(f"{path} is not a readable mitmproxy flow file ({why[:300]}); write one with "
                                "mitmdump -w") from None


@click.command("import")
@store_words("STORE FILE...")
@click.option("--format", "fmt", type=click.Choice(["auto", "har", "flows"]), default="auto", show_default=True,
              help="auto: .har is HAR, anything else a mitmproxy flow file.")
@click.option("--session", help="Session of entries without labels (default: import-FILENAME).")
@click.option("--ignore-field", "ignore_fields", multiple=True, metavar="POINTER",
              help="As for recording: a JSON pointer dropped from the key; repeatable.")
def import_cmd(words: tuple[str, ...], store_opt: Path | None, fmt: str, session: str | None,
               ignore_fields: tuple[str, ...]) -> None:
    """Import HAR or mitmproxy flow files into STORE (created if new), keyed as recorded traffic is,
    with secrets erased on the way in."""
    store_path, given = split_store(words, store_opt, (1, None), default=False, wanted="HAR or flow files to import")
    files = [click.Path(exists=True, dir_okay=False, path_type=Path).convert(f, None, None) for f in given]
    try:
        rules = Rules(ignore_fields=ignore_fields)
    except RuleError as exc:
        raise click.BadParameter(str(exc)) from None
    batches = []
    for f in files:  # every file read and checked first: a bad one imports nothing at all
        har = fmt == "har" or (fmt == "auto" and f.suffix.lower() == ".har")
        batches.append((f, [checked(item, n, f"{f} entry") for n, item in enumerate(har_items(f) if har else flow_items(f), 1)]))
    for f, items in batches:
        r = import_into(store_path, items, session or f"import-{f.stem}", rules)
        click.echo(f"nfproxy import: {r.exchanges} exchanges from {f} into {store_path} "
                   f"({len(r.sessions)} sessions)" + (f"; replay answers for {r.upstream} (remembered as a "
                   "recording's --upstream is)" if r.upstream else ""), err=True)


def register(group: click.Group) -> None:
    group.add_command(export_cmd)
    group.add_command(import_cmd)
