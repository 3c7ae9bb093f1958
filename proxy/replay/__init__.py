"""Replay mode: answers from the recording, misses and their diagnosis, the replay log."""

__all__ = [
    "diagnosis",
    "log",
    "replayer",
    "replies",
]
