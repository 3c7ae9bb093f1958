"""Recordings in and out of other tools' formats (HAR, JSON Lines, mitmproxy flows)."""

__all__ = [
    "formats",
]
