"""`nfproxy`: run the recording/replaying proxy, and read what it logged.

The group and its default command live here; the other commands live in one module per job
(listing_cli: log and show; store_cli: merge, compact, migrate; transfer_cli: export and import)
and are registered below, before `main` can run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from noisefloor._cli import WrapsAfterDashes, default_group
from noisefloor.proxy._serve import ca_environment, serve
from noisefloor.proxy.cli import _listing_cmds as listing_cli
from noisefloor.proxy.cli import _store_cmds as store_cli
from noisefloor.proxy.cli import _transfer_cmds as transfer_cli
from noisefloor.proxy.cli.options import (
    DEFAULT_STORE,
    default_confdir,
    from_cli,
    listen_of,
    listen_option,
    serve_options,
)


@default_group("run")
def main() -> None:
    """Record, replay and pass through LLM API traffic, content-addressed in an LMDB log.

    Without a subcommand, runs the proxy (`nfproxy run`).
    """


@main.command("run", cls=WrapsAfterDashes, context_settings={"ignore_unknown_options": False})
@serve_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(**params: Any) -> None:
    """Run the proxy in the foreground until SIGINT or SIGTERM (exit 130 or 143, after the summary).

    With a COMMAND after `--`, start the proxy on a free port, run the command with the proxy
    environment set (reverse mode: OPENAI_BASE_URL, ANTHROPIC_BASE_URL, GOOGLE_GEMINI_BASE_URL;
    regular mode: HTTPS_PROXY and the CA variables), and stop when it exits: exit 6 when the
    command failed (its own status printed), 127 when it could not start, else the run's own.
    The run's own status (also what SIGUSR1 stops it with): 0; 3 when a strict replay saw a miss,
    a call-order violation or an error; 5 when exchanges were not recorded.
    """
    sys.exit(serve(from_cli(**params)))


@main.command("ca")
@click.option("--confdir", type=click.Path(path_type=Path), default=default_confdir(DEFAULT_STORE),
              show_default=True, help="The folder nfproxy keeps its CA in (beside the store by default).")
@listen_option
def ca_cmd(confdir: Path, listen: str | None) -> None:
    """Print the CA certificate path and the environment a client needs to trust it (forward mode)."""
    from noisefloor.proxy.mitm.compat import ensure_ca

    listen = listen_of(listen, False)

    ca = ensure_ca(confdir.resolve())  # creates the CA on first use
    click.echo(f"# nfproxy CA certificate: {ca}")
    click.echo(f"# for a client using nfproxy (listening on {listen}) as its HTTPS proxy:")
    for k, v in {"HTTPS_PROXY": f"http://{listen}", **ca_environment(str(ca))}.items():
        click.echo(f"export {k}={v}")


for _module in (listing_cli, store_cli, transfer_cli):
    _module.register(main)

