"""One error hierarchy and one table of exit codes for every noisefloor command.

Every error a user can cause derives from `NoisefloorError`; its message names the problem and
the fix. The commands turn it into one line on stderr and `EXIT_ERROR` (5). Each class keeps the
built-in base it always had (ValueError for bad input, RuntimeError for a state that cannot go
on), so code that caught those still does.
"""

from __future__ import annotations

# Exit codes, the same for nfproxy, nfverify, nfanalyze and nfladder (exit_codes.py, README's table).
from noisefloor.exit_codes import DRIFT as EXIT_DRIFT  # noqa: E402
from noisefloor.exit_codes import INPUT as EXIT_ERROR  # noqa: E402
from noisefloor.exit_codes import OK as EXIT_OK  # noqa: E402
from noisefloor.exit_codes import REGRESSED as EXIT_REGRESSED  # noqa: E402
from noisefloor.exit_codes import REPLAY_FAILED as EXIT_REPLAY_FAILED  # noqa: E402
from noisefloor.exit_codes import STAMPS as EXIT_STAMPS  # noqa: E402
from noisefloor.exit_codes import USAGE as EXIT_USAGE  # noqa: E402

__all__ = ["EXIT_DRIFT", "EXIT_ERROR", "EXIT_OK", "EXIT_REGRESSED", "EXIT_REPLAY_FAILED", "EXIT_STAMPS", "EXIT_USAGE",
           "InputError", "NoisefloorError", "StateError"]


class NoisefloorError(Exception):
    """Base of every error a user can cause; the message says what to do."""


class InputError(NoisefloorError, ValueError):
    """Input that cannot be used as given (a file, a rule, a body)."""


class StateError(NoisefloorError, RuntimeError):
    """Something on disk or in the machine that stops the work (a store, a sandbox, a dataset)."""
