"""The platform PyPTO compiles a target's kernels under (docs/platform.md).

PyPTO 0.2.0 ships one platform file, ``lib/configs/A2A3.ini`` (the Ascend 910B1: 24 AI cores,
192 KiB of UB), and reads it from the library folder of the ``pypto`` package it was imported
from; no setting moves it. Its passes check every buffer against that file's sizes. Its cost
model's simulator takes its machine (how many cube and vector cores, its buffers' sizes) from
simulator arguments instead, whose defaults are the 910B's. So a target's platform is two
things, both generated from the target's descriptor:

- **the platform file**: the installed 0.2.0 file with the chip's memory sizes and core counts
  written in (its instruction set stays the 910B's: PyPTO generates DAV_2201 code whatever
  ``NpuArch`` says), read through an *overlay*: a folder in the fork server's own folder whose
  ``pypto`` package is the installed one, entry by entry (symlinks), but for that one file. The
  server puts the overlay first on its path; the installed package is never modified;
- **the cost model's machine**: ``Model.*MachineNumber*`` and ``Pipe.*SizeThreshold``.

A target whose chip PyPTO itself knows (``configs/<SoC_version>.ini``, or the stock file's own
``SoC_version``) compiles under PyPTO's own platform, natively: the ascend910b target on 0.2.0.

A platform's digest (of its file, its machine and cost tables) is in every cache key, in the
blob and in the report.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from functools import cached_property, lru_cache
from math import gcd
from pathlib import Path

from pypto_offline.errors import PyptoOfflineError
from pypto_offline.targets import Figure, Target

STOCK_FILE = "A2A3.ini"
# The platform file of the pypto 0.2.0 wheel: what an overlay starts from. Another file there is
# another PyPTO, whose figures an overlay would silently mix with ours.
STOCK_SHA256 = "3a94177b50be08cb03eaab04bfb8aaede4b6669e4afb7a83c7b31ee4f27c9544"
STOCK_SOC = "Ascend910B1"
ISA = "DAV_2201"  # the instruction set PyPTO 0.2.0 generates code for, whatever the file says
OVERLAY_FOLDER = "platform"  # in a fork server's folder
STOCK_PLATFORM = "910b"  # Target.pypto_platform of a build compiled as on the 910B

# The figures an overlay writes: the file's key, and the descriptor's figure it comes from.
# Cube cores: one per AI core, split (910B, 950) or coupled (Kirin) alike. The UB is the one the
# tiling plans with (the chip's less a margin): PyPTO 0.2.0 packs a kernel's leaves up to the
# file's ub_size, so under the chip's whole UB a kernel of many live tiles (a depthwise
# convolution's taps) filled 125-131 KB at every tile size and no candidate fitted the plan; under
# the plan it takes the same time within it (docs/platform.md, "The UB PyPTO plans with").
FILE_FIGURES = (("ai_core_cnt", "ai_cores"), ("cube_core_cnt", "ai_cores"),
                ("vector_core_cnt", "aiv_cores"), ("ub_size", "ub_plan_bytes"),
                ("l1_size", "l1_bytes"), ("l0_a_size", "l0a_bytes"),
                ("l0_b_size", "l0b_bytes"), ("l0_c_size", "l0c_bytes"),
                ("l2_size", "l2_bytes"))
# The simulator's buffer sizes, by the file's key.
PIPE_THRESHOLDS = (("ub_size", "ubSizeThreshold"), ("l1_size", "l1SizeThreshold"),
                   ("l0_a_size", "l0aSizeThreshold"), ("l0_b_size", "l0bSizeThreshold"),
                   ("l0_c_size", "l0cSizeThreshold"))
# ascend950: the cost model can use its A5 tables (docs/pypto-recipes.md); everything else is
# timed on the 910B's. (deviceArch, device_platform) as the simulator and PyPTO's config take it.
COST_TABLES = {"ascend950": ("A5", "ASCEND_950PR_9579")}
# Buffers a chip may lack (the file's key → the buffer's name): platform_figures.
MISSING_L0 = {"l0_a_size": "L0A", "l0_c_size": "L0C"}


class PlatformFigureMissing(PyptoOfflineError):
    """A target whose descriptor lacks a figure its platform needs: never a silent 910B value."""


class PlatformUnavailable(PyptoOfflineError):
    """The installed PyPTO has no platform file an overlay can start from."""


@dataclass(frozen=True)
class Platform:
    """What a target's kernels compile under: PyPTO's own platform (``native``), or an overlay
    of the 0.2.0 file with the chip's figures, and the cost model's machine."""

    target: str
    chip: str                               # the target's SoC_version
    native: bool
    file_name: str                          # the file PyPTO reads, in its configs folder
    file_text: str
    figures: tuple[tuple[str, Figure], ...]  # the file's key → the figure written there
    simulator: tuple[str, ...]              # the cost model's machine (simulator arguments)
    cost_tables: tuple[str, str] | None     # (deviceArch, device_platform), or the 910B's

    @cached_property
    def digest(self) -> str:
        """The sha256 of everything a compile reads of the platform: in every cache key (asked
        for each compile's key: hashed once)."""
        return hashlib.sha256(json.dumps(
            [self.file_name, self.file_text, list(self.simulator), self.cost_tables,
             self.native]).encode()).hexdigest()

    @property
    def device_platform(self) -> str | None:
        """What PyPTO's config names as its device platform: the chip, for a file of PyPTO's
        own that is not its default; the cost tables' for an overlay (0.2.0 reads the file
        whatever it says)."""
        if self.native and self.file_name != STOCK_FILE:
            return self.chip
        return self.cost_tables[1] if self.cost_tables else None

    def figure(self, key: str) -> int:
        return dict(self.figures)[key].value

    def description(self) -> str:
        """What the kernels are, for the report's notice and each kernel's record."""
        sizes = (f"UB {self.figure('ub_size')} B, L1 {self.figure('l1_size')} B, "
                 f"{self.figure('ai_core_cnt')} AI core(s), "
                 f"{self.figure('vector_core_cnt')} vector core(s)")
        if self.native:
            return (f"compiled under PyPTO's own {self.chip} platform ({self.file_name}: "
                    f"{sizes})")
        tables = f"; timed on PyPTO's {self.cost_tables[0]} cost tables" \
            if self.cost_tables else ""
        return (f"code for the 910B's instruction set ({ISA}), compiled under {self.chip}'s "
                f"memory sizes and core count ({sizes}{tables})")

    def server_settings(self) -> dict:
        """What a fork server needs to compile under it (``worker.start_pypto``)."""
        return {"native": self.native, "file_text": self.file_text, "digest": self.digest,
                "simulator": list(self.simulator),
                "cost_model_arch": self.cost_tables and self.cost_tables[0],
                "device_platform": self.device_platform}


def installed_configs() -> Path:
    """The installed PyPTO's configs folder (found without importing PyPTO)."""
    spec = importlib.util.find_spec("pypto")
    if spec is None or not spec.submodule_search_locations:
        raise PlatformUnavailable("PyPTO is not installed in this interpreter",
                                  fix="pip install pypto==0.2.0")
    return Path(list(spec.submodule_search_locations)[0]) / "lib" / "configs"


@lru_cache(maxsize=None)
def platform_of(target: Target) -> Platform:
    """The platform ``target``'s kernels compile under, with the installed PyPTO."""
    return platform_for(target, installed_configs())


def platform_for(target: Target, configs: Path) -> Platform:
    """``target``'s platform with the PyPTO whose configs folder is ``configs``: its own file
    for the chip when it has one, or its default file when that is the chip's or the target
    compiles as on the 910B (``Target.pypto_platform``), used as they are (native); else an
    overlay of its 0.2.0 file."""
    chip = target.soc_version.value
    figures = platform_figures(target)
    cost_tables = COST_TABLES.get(target.name)
    as_910b = target.pypto_platform == STOCK_PLATFORM
    own = configs / f"{chip}.ini"
    if own.is_file() and not as_910b:
        return _native(target, own, figures, cost_tables)
    stock = configs / STOCK_FILE
    if not stock.is_file():
        raise PlatformUnavailable(f"the installed PyPTO has no platform file {stock}",
                                  fix="reinstall pypto==0.2.0")
    text = stock.read_text()
    if as_910b or file_value(text, "SoC_version") == chip:  # PyPTO's default platform
        return _native(target, stock, figures, cost_tables)
    if hashlib.sha256(text.encode()).hexdigest() != STOCK_SHA256:
        raise PlatformUnavailable(
            f"{stock} is not the platform file of pypto 0.2.0, which {target.name}'s platform "
            "is written over", fix="reinstall pypto==0.2.0")
    return Platform(target.name, chip, False, STOCK_FILE, overlay_text(text, target, figures),
                    figures, machine(target, figures), cost_tables)


def _native(target: Target, file: Path, figures: tuple[tuple[str, Figure], ...],
            cost_tables: tuple[str, str] | None) -> Platform:
    """A platform file of PyPTO's own, used as it is: the chip it names, the figures it states
    (else the descriptor's), the simulator's own machine."""
    text = file.read_text()
    return Platform(target.name, file_value(text, "SoC_version") or target.soc_version.value,
                    True, file.name, text, native_figures(text, file.name, figures), (),
                    cost_tables)


def platform_figures(target: Target) -> tuple[tuple[str, Figure], ...]:
    """The figures a platform file holds for ``target``, by the file's key. A chip without L0A
    or L0C (Kirin 9050: its cube reads the left operand from L1 and accumulates in L1) gets its
    L0B's size for them, an estimate: the 910B code PyPTO generates stages both through L0,
    and a size of 0 makes PyPTO refuse every matmul (docs/platform.md, "Kirin 9050's L0")."""
    figures = []
    for key, name in (*FILE_FIGURES, ("ai_cpu_cnt", "ai_cpus")):
        figure = getattr(target, name)
        if figure is None:
            raise PlatformFigureMissing(
                f"target {target.name} has no {name} figure ({key} of its platform file)",
                where="pypto_offline/targets", fix="add the figure, with its source, to the "
                "target's descriptor")
        if key in MISSING_L0 and figure.value == 0:
            figure = Figure(target.l0b_bytes.value,
                            f"EST: {target.soc_version.value} has no {MISSING_L0[key]} "
                            f"({figure.source}); sized as its L0B", estimate=True)
        figures.append((key, figure))
    return tuple(figures)


def native_figures(text: str, file_name: str, figures: tuple[tuple[str, Figure], ...]
                   ) -> tuple[tuple[str, Figure], ...]:
    """The figures of a platform file of PyPTO's own, where it states them (else the
    descriptor's)."""
    def stated(key: str, figure: Figure) -> Figure:
        value = file_value(text, key)
        return Figure(int(value), f"PyPTO {file_name}") if value and value.isdigit() else figure
    return tuple((key, stated(key, figure)) for key, figure in figures)


def file_value(text: str, key: str) -> str | None:
    match = re.search(rf"(?m)^{re.escape(key)}=(.*)$", text)
    return match.group(1).strip() if match else None


def overlay_text(stock: str, target: Target, figures: tuple[tuple[str, Figure], ...]) -> str:
    """The 0.2.0 file with ``figures`` written in (each key is there exactly once)."""
    text = (f"# pypto-offline: {target.name} ({target.soc_version.value}) figures written "
            f"over PyPTO 0.2.0's {STOCK_SOC} file; the code stays {ISA}\n") + stock
    for key, figure in figures:
        if key == "ai_cpu_cnt":
            continue  # the chip's scheduler: the cost model's machine only
        text, count = re.subn(rf"(?m)^{re.escape(key)}=.*$", f"{key}={figure.value}", text)
        if count != 1:
            raise PlatformUnavailable(f"PyPTO's {STOCK_FILE} has {count} '{key}' lines, not one")
    return text


def machine(target: Target, figures: tuple[tuple[str, Figure], ...]) -> tuple[str, ...]:
    """The cost model's machine for ``target``: its cube and vector cores under as many AI CPUs
    (at least one: a Kirin schedules without one) as divide both evenly, and its buffer sizes.
    For the 910B (6 AI CPUs, 24 cube, 48 vector cores) this is the simulator's default."""
    values = {key: figure.value for key, figure in figures}
    cube, vector = values["cube_core_cnt"], values["vector_core_cnt"]
    schedulers = max(d for d in range(1, max(values["ai_cpu_cnt"], 1) + 1)
                     if gcd(cube, vector) % d == 0)
    return (f"Model.aicpuMachineNumber={schedulers}",
            f"Model.coreMachineNumberPerAICPU={(cube + vector) // schedulers}",
            f"Model.cubeMachineNumberPerAICPU={cube // schedulers}",
            f"Model.vecMachineNumberPerAICPU={vector // schedulers}",
            *(f"Pipe.{threshold}={values[key]}" for key, threshold in PIPE_THRESHOLDS))


def make_overlay(file_text: str, installed: Path, root: Path) -> Path:
    """``root/pypto``: the installed package ``installed`` entry by entry (symlinks), but for
    ``lib/configs/A2A3.ini``, which holds ``file_text``. Returns ``root``, the folder to put
    first on the path. In the fork server, before it imports PyPTO."""
    package = root / "pypto"
    levels = ((installed, package, "lib"), (installed / "lib", package / "lib", "configs"),
              (installed / "lib" / "configs", package / "lib" / "configs", STOCK_FILE))
    for source, copy, own in levels:
        copy.mkdir(parents=True)
        for entry in sorted(os.listdir(source)):
            if entry != own:
                os.symlink(source / entry, copy / entry)
    (package / "lib" / "configs" / STOCK_FILE).write_text(file_text)
    return root
