"""One error hierarchy and one table of exit codes for every noisefloor command.

Every error a user can cause derives from `NoisefloorError`; its message names the problem and
the fix. The commands turn it into one line on stderr and `EXIT_ERROR`. Each class keeps the
built-in base it always had (ValueError for bad input, RuntimeError for a state that cannot go
on), so code that caught those still does.
"""

from __future__ import annotations

# Exit codes, the same for nfproxy, nfverify, nfanalyze and nfladder (README has the table).
EXIT_OK = 0
EXIT_ERROR = 1  # bad input or a state that cannot go on; gate: a case regressed
EXIT_USAGE = 2  # the command line is wrong; gate: runs are unstamped or their stamps differ
EXIT_REPLAY_FAILED = 3  # a strict replay saw a miss, a call-order violation or an error of its own
EXIT_DRIFT = 4  # the served model changed within a study (drift guard)


class NoisefloorError(Exception):
    """Base of every error a user can cause; the message says what to do."""


class InputError(NoisefloorError, ValueError):
    """Input that cannot be used as given (a file, a rule, a body)."""


class StateError(NoisefloorError, RuntimeError):
    """Something on disk or in the machine that stops the work (a store, a sandbox, a dataset)."""
