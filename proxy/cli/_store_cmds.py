"""`nfproxy merge`, `compact`, `migrate` and `repair`: whole-store maintenance, registered on nfproxy's group."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from noisefloor.proxy.cli.options import max_body_option, split_store, store_words


@click.command("merge")
@click.argument("out", type=click.Path(path_type=Path))
@click.argument("shards", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Worker processes that check a large shard and prepare its batches while this one writes "
                   "(default: 2 where two CPUs or more are available, else 1: one process).")
def merge_cmd(out: Path, shards: tuple[Path, ...], jobs: int | None) -> None:
    """Combine stores recorded by different processes or machines into OUT (created if new).

    Bodies are deduplicated by content hash; sessions, replay order and outcome rows are kept. A
    damaged shard, a session name in two shards with different exchanges, or shards recorded
    under different normalization rules are refused before anything is written. Merging again
    adds only what OUT lacks, so an interrupted merge is finished by running it again.
    """
    from noisefloor.proxy.store.merge.run import merge

    r = merge(out, list(shards), lambda s: click.echo(f"nfproxy merge: {s}", err=True), jobs)
    click.echo(f"merged {r.shards} shards into {out}: {r.sessions_added} sessions and {r.exchanges_added} exchanges "
               f"added, {r.sessions_present} sessions already there; {r.bodies_added} bodies added, "
               f"{r.bodies_shared} shared; {r.outcome_rows_added} outcome rows added")


@click.command("compact")
@store_words("[STORE]")
@max_body_option
def compact_cmd(words: tuple[str, ...], store_opt: Path | None, max_body_mb: int) -> None:
    """Rewrite a store in place: every value verified, compression dictionaries trained on all of it,
    the data file cut to the pages it uses. Run it on a finished recording (not while a proxy records)."""
    from noisefloor.proxy.store.compact import rewrite

    _rewrite(split_store(words, store_opt, (0, 0))[0], "compacted", rewrite, max_body_mb)


@click.command("migrate")
@store_words("[STORE]")
@max_body_option
def migrate_cmd(words: tuple[str, ...], store_opt: Path | None, max_body_mb: int) -> None:
    """Rewrite a store made by an older nfproxy in today's format (nothing else reads an older one)."""
    from noisefloor.proxy.store.migrate import migrate

    _rewrite(split_store(words, store_opt, (0, 0))[0], "migrated", migrate, max_body_mb)


@click.command("repair")
@store_words("[STORE]")
@click.option("--drop-damaged", is_flag=True,
              help="Drop answered rows that are damaged (their exchanges are lost) and write the others.")
def repair_cmd(words: tuple[str, ...], store_opt: Path | None, drop_damaged: bool) -> None:
    """Finish what a killed nfproxy left: write the exchanges it had answered but not yet written in
    full (kept as answered rows), and the replay lookups of a merge killed before them."""
    store_path, _ = split_store(words, store_opt, (0, 0))
    from noisefloor.display import counted
    from noisefloor.proxy.record import interrupted
    from noisefloor.proxy.store.log import Store

    with Store.open(store_path, write=True) as store:
        store.lock_for_recording()  # not while a proxy records into it
        written, dropped, lookups = interrupted.finish(store, drop_damaged=drop_damaged)
    click.echo(f"repaired {store_path}: {counted(written, 'answered exchange')} written"
               + (f", {counted(dropped, 'damaged answered row')} dropped" if dropped else "")
               + ("; the replay lookups of an interrupted merge written" if lookups else ""))


def _rewrite(store_path: Path, verb: str, rewrite: Callable[..., Any], max_body_mb: int) -> None:
    from noisefloor.proxy.store.env import FORMAT

    r = rewrite(store_path, lambda s: click.echo(f"nfproxy: {s}", err=True), max_body_mb << 20)
    was = f" from {r.from_format}" if r.from_format and r.from_format != FORMAT else ""
    click.echo(f"{verb} {store_path}{was} to {FORMAT}: {r.exchanges} exchanges, {r.bodies} bodies; data file "
               f"{r.before_bytes / 1e6:.1f} MB -> {r.after_bytes / 1e6:.1f} MB")


def register(group: click.Group) -> None:
    for command in (merge_cmd, compact_cmd, migrate_cmd, repair_cmd):
        group.add_command(command)
