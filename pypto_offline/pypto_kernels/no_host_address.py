"""A host with no network address, as PyPTO sees it: the same kernel bytes on every machine
(docs/determinism.md, "The host's address").

At each compile PyPTO 0.2.0 names its run folder ``output_<time>_<pid>_<address>``, the address
being the host's first IPv4 address not on ``lo``, in 8 hex digits, or nothing on a host without
one (``GetIpContext`` in its config manager, through ``getifaddrs``). The strings it builds from
that name, and the stream it formats the address with, decide where malloc puts its objects,
and so its op numbers (protocol.WORKSPACE_CHARS): measured on the example model, a build on this
machine and one in a network namespace with only ``lo`` (as a Ray node in a test cluster) gave
blobs that differed in every kernel's op numbers. Padding the folder does not help: the
intermediate strings still differ in length.

So the fork server runs with this library preloaded: its ``getifaddrs`` reports no interface,
and every host names its run folders alike. Nothing in a worker needs the network (it talks to
its build through pipes and files); the library is built from the source below by the host
g++ PyPTO needs anyway, into the server's own folder."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from pypto_offline.errors import WorkerCannotStart

SOURCE = r"""
#include <ifaddrs.h>
/* No interface: PyPTO's run folders end with an empty address on every host. */
extern "C" int getifaddrs(struct ifaddrs **interfaces) {
    *interfaces = 0;
    return 0;
}
"""
LIBRARY = "libno_host_address.so"


def build(folder: Path) -> Path:
    """The library, compiled into ``folder``; a clear error when there is no g++ to do it."""
    compiler = shutil.which("g++")
    if compiler is None:
        raise WorkerCannotStart("no g++ on PATH: PyPTO compiles its host code with it",
                                fix="install g++ (e.g. apt install g++)")
    source, library = folder / "no_host_address.cpp", folder / LIBRARY
    source.write_text(SOURCE)
    done = subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(library), str(source)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise WorkerCannotStart(f"g++ could not build {LIBRARY}: "
                                f"{(done.stderr.strip().splitlines() or ['no message'])[-1]}",
                                fix="check that g++ can build a shared library")
    return library


def preloaded(environment: dict[str, str], library: Path) -> dict[str, str]:
    """``environment`` with ``library`` first in LD_PRELOAD."""
    others = environment.get("LD_PRELOAD", "")
    return {**environment, "LD_PRELOAD": os.pathsep.join(filter(None, [str(library), others]))}
