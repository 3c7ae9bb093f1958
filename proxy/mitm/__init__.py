"""The mitmproxy side: the addon's hooks (thin over plain code) and the one module that touches mitmproxy's internals."""

__all__ = [
    "addon",
    "compat",
    "record_hook",
    "replay_hook",
]
