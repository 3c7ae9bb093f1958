"""`nfproxy`'s command line: the group and its commands, one module per job."""

from noisefloor.proxy.cli._main import main

__all__ = ["main"]
