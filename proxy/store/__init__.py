"""The log: one LMDB file of exchanges, bodies, the replay index and outcome rows, and its maintenance."""

__all__ = [
    "compact",
    "env",
    "exchange",
    "heads",
    "log",
    "replay_index",
    "merge",
]
