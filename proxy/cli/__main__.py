"""`python -m noisefloor.proxy.cli`: the launcher's form when no `nfproxy` script is installed."""

from noisefloor.proxy.cli._main import main

main()
