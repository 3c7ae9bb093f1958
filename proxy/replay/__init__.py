"""Replay mode: answers from the recording, misses and their diagnosis, the replay log, which recorded
run each replay followed (trajectory) and recorded runs taken in turn (turns)."""

__all__ = [
    "diagnosis",
    "log",
    "replayer",
    "replies",
    "trajectory",
    "turns",
]
