"""Exit statuses: one meaning each, the same for nfproxy, nfverify, nfanalyze, nfladder and nfview,
so a CI job can tell a regression from a crash. `TABLE` is the one list: every command's --help
prints it and docs/exit-codes.md holds it (a test keeps the page equal to it).

Seed 004's gate script already used 1 for "a case regressed" and 2 for "the runs' stamps
differ"; those two keep their numbers, so errors and usage mistakes get their own.
"""

from __future__ import annotations

OK = 0
REGRESSED = 1  # gate: at least one case regressed
STAMPS = 2  # gate: runs unstamped or with different stamps (model, sampling, grader, cases): refused
REPLAY_FAILED = 3  # a strict replay saw a miss, a call-order violation or an error of its own
DRIFT = 4  # the served model changed within a study (drift guard)
INPUT = 5  # bad input or a state that cannot go on (a file, a store, a dataset, a sandbox)
WRAPPED_FAILED = 6  # a command nfproxy wrapped (`nfproxy ... -- CMD`) failed; its own status is printed
USAGE = 64  # the command line is wrong (sysexits' EX_USAGE)
NOT_STARTED = 127  # a wrapped command or an agent that could not be started (the shell's convention)
INTERRUPTED = 130  # Ctrl-C (SIGINT)
TERMINATED = 143  # SIGTERM

TABLE = (
    (OK, "success"),
    (REGRESSED, "gate: a case regressed"),
    (STAMPS, "gate: unstamped runs, or runs whose stamps differ, refused"),
    (REPLAY_FAILED, "strict replay failed: a miss, a call-order violation or a replay error"),
    (DRIFT, "drift: the served model changed within a study (per requested model)"),
    (INPUT, "input or state error: the one-line message names the problem and the fix"),
    (WRAPPED_FAILED, "the wrapped command (nfproxy ... -- CMD) failed: nfproxy prints its own status"),
    (USAGE, "usage error: the command line is wrong"),
    (NOT_STARTED, "a wrapped command (or an nfladder agent) could not be started"),
    (INTERRUPTED, "interrupted (SIGINT, Ctrl-C)"),
    (TERMINATED, "terminated (SIGTERM)"),
)


def markdown_table() -> str:
    return "\n".join(["| exit | meaning |", "| --- | --- |", *(f"| {c} | {m} |" for c, m in TABLE)])


def help_rows() -> list[tuple[str, str]]:
    """The table as --help's definition list."""
    return [(str(c), m) for c, m in TABLE]
