"""`nfview PATH`: look at a store or an nfladder / nfanalyze output folder in a browser."""

from __future__ import annotations

import ipaddress
import signal
import sys

import click

from noisefloor._cli import VERSION, Command, OneLineUsage
from noisefloor.display import visible
from noisefloor.proxy.cli.options import max_body_option


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise OneLineUsage(f"--listen {visible(text)!r} is not HOST:PORT with a port from 0 to 65535 (e.g. "
                           "127.0.0.1:8765)")
    host = host.strip("[]") or "127.0.0.1"
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise OneLineUsage(f"--listen {visible(host)} is not a loopback address: nfview shows recorded traffic, so "
                           "it listens on 127.0.0.1 (or ::1) only")
    return host, int(port)


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the server as Ctrl-C does


@click.command(cls=Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("path", type=click.Path(exists=True))
@click.option("--listen", default="127.0.0.1:8765", show_default=True, help="HOST:PORT, loopback only (port 0: any).")
@max_body_option
@click.version_option(**VERSION)
def main(path: str, listen: str, max_body_mb: int) -> None:
    """Show PATH, a store or an nfladder / nfanalyze output folder, as a local read-only web app:
    the report, sessions and exchanges with filters, one exchange decoded, misses beside their
    nearest recorded request."""
    from noisefloor.viewer.app import serve_path

    host, port = _listen(listen)
    signal.signal(signal.SIGTERM, _interrupt)

    def ready(url: str) -> None:
        click.echo(f"nfview: {url} (Ctrl-C to stop)")
        sys.stdout.flush()

    serve_path(path, host, port, ready, max_body_mb << 20)


if __name__ == "__main__":
    main()
