"""What a process started from a terminal has, for the tests' children that need it."""
from __future__ import annotations

import signal


def sigint_as_from_a_terminal() -> None:
    """A ``preexec_fn``: SIGINT back to its default. A runner that starts the suite in the
    background (CI, ``nohup make test &``) hands it SIGINT ignored, which every child inherits
    and Python keeps: a build would then never see the Ctrl-C a test sends it (the Ray
    interrupt test's builds exited 0 so, twice, in suites started in the background)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
