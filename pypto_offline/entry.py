"""The ``pypto-offline`` command's entry point (setup.cfg, ``python -m pypto_offline``). It and
the package's ``__init__`` import only the standard library; the modules every command needs
are imported here with SIGINT held, so that a Ctrl-C while they load (a second or more) ends the
command as one during a build does: one line, exit 130, no traceback, no crash."""
from __future__ import annotations

import importlib
import signal
import sys
import threading
from contextlib import contextmanager

# What every command loads first. A KeyboardInterrupt raised inside the initialisation of a
# compiled module killed the interpreter (onnx's: SIGSEGV or SIGABRT) or failed numpy's import
# (an internal error); raised anywhere else in them it left a traceback.
STARTUP_MODULES = ("numpy", "onnx", "pypto_offline.cli")


def main(argv: list[str] | None = None) -> int:
    with _interrupts_held() as interrupts:
        for module in STARTUP_MODULES:
            importlib.import_module(module)
    if interrupts:
        return interrupted(signal.SIGINT)
    try:
        from pypto_offline.cli import main as run_command  # loaded above: at once

        return run_command(argv)
    except KeyboardInterrupt:  # before the CLI's own handling begins, or after it ends
        return interrupted(signal.SIGINT)


@contextmanager
def _interrupts_held():
    """SIGINT recorded, not raised, for the block; the list it yields holds what came. A SIGINT
    ignored by whoever started the command stays ignored."""
    received: list[int] = []
    held = threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if held:
        signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield received
    finally:
        if held:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def interrupted(signum: int) -> int:
    """What a command ended by SIGINT or SIGTERM says, and its exit code: 128 + the signal."""
    print("pypto-offline: interrupted", file=sys.stderr)
    return 128 + signum
