"""Record mode: keying on arrival, the answer kept before it is released, streams captured chunk by chunk."""

__all__ = [
    "answered_rows",
    "episodes",
    "interrupted",
    "recorder",
    "sse",
]
