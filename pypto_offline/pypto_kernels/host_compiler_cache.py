"""PyPTO's host g++ step, cached by content inside the kernel cache (docs/kernel-cache.md,
section "The host g++ cache").

PyPTO 0.2.0 codegen compiles the kernel's control flow (``controlFlow_host_<hash>.cpp`` and
``control_flow_expr_table_*.cpp``) by calling ``g++`` through PATH, as
``g++ -fPIC -fno-stack-protector -O2 -mno-sse2 -mno-sse -I<pypto>/... -S <src>.cpp -o <src>.cpp.s``,
then assembles and links the ``.s`` (``g++ -c``, ``ld``), which is cheap. The ``-S`` step is the
one worth caching; it cannot be skipped (SIM segfaults without its output).

In the worker, ``install`` puts a ``g++`` of ours first on PATH: a shell script that hands
``-S`` compiles to this file, run as a script, and every other call straight to the real
compiler. Key = the real compiler (path and ``--version``), the arguments and working folder with
the job's folders replaced by fixed names, and the path and content of every file the compile
reads (the source and its headers, as ``g++ -M`` lists them). A hit writes the stored output
(with this job's folders put back) and exits 0; a miss runs the real compiler and stores its
output only when it exited 0. Entries go through ``KernelCache.read``/``put``: a manifest checks
what is read back, a damaged entry is a miss and is replaced, and a put is one rename.

A miss compiles with a precompiled header of the system and PyPTO headers the source opens with
(``precompiled_prologue``; 0.10 s → 0.02 s a compile, the same output), itself cached by content.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

# In the kernel cache, a cache of its own: its entries are no kernels (no kernel.json), and
# this keeps them apart from those, easy to measure or delete.
SUBFOLDER = "host-compiler"
WRAPPER_FOLDER = "host_compiler"  # in a compile's folder: the g++ wrapper and its configuration
LOG = "host_compiler_cache.log"  # in the job folder: one line per cached compile, hit or miss
RECORD = "host_compiler.json"
FORMAT = 2  # bump when the key or the entry changes: older entries are then never hits (2: the
# pypto package's folder as a fixed name: a platform's overlay is in its fork server's folder)
# Beside it, the precompiled headers (``precompiled_header``): entries of another kind, with a
# format of their own (a compile's output is the same through one, so its key does not say).
PCH_SUBFOLDER, PCH_FORMAT = "host-compiler-pch", 1
PCH_HEADER, PCH_RECORD = "prologue.h", "pch.json"
# The compiler's include search reads these: a header found through them is listed by -M and
# hashed anyway, but they also decide which one is found.
ENVIRONMENT = ("CPATH", "CPLUS_INCLUDE_PATH", "C_INCLUDE_PATH", "GCC_EXEC_PREFIX",
               "COMPILER_PATH")
# Options a cached compile may carry: none writes a second file, reads a file the key does not
# see, or records the folder it runs in (as -g would). Anything else runs uncached.
ALLOWED = ("-f", "-O", "-m", "-I", "-D", "-U", "-std=", "-W", "-w")
TAKES_NEXT = ("-I", "-D", "-U")  # written apart from their value: not worth parsing
REFUSED = ("-fdump", "-fprofile", "-fauto-profile", "-fplugin", "-fstack-usage",
           "-fcallgraph-info", "-fsave-optimization-record", "-fdebug-prefix-map", "-Wa,",
           "-Wl,", "-Wp,")
SOURCES = (".cpp", ".cc", ".cxx", ".c")
# A source reading the clock compiles differently each time: never replayed.
CLOCK_MACROS = (b"__DATE__", b"__TIME__", b"__TIMESTAMP__")
SOURCE_DIR, JOB_DIR = "@PYPTO_OFFLINE_SOURCE_DIR@", "@PYPTO_OFFLINE_JOB_DIR@"
# The pypto package the worker imported: the installed one, or a platform's overlay in the fork
# server's own folder (docs/platform.md), whose headers are the installed ones (hashed anyway).
PYPTO_DIR = "@PYPTO_OFFLINE_PYPTO_DIR@"


# --- in the worker ---------------------------------------------------------------------------

def install(folder: Path, cache_root: str | None, job: Path,
            cache_group: int | None = None) -> Path | None:
    """After ``import pypto``, in the worker, for a compile run in ``folder``: the folder to put
    first on PATH for PyPTO's ``g++`` calls to go through the cache in ``cache_root`` (the
    kernel cache, trusting the team's group ``cache_group`` if the build named one), logged in
    the job's folder ``job``. None without a cache or a host g++: nothing changes."""
    if not cache_root:
        return None
    return write_wrapper(folder, Path(cache_root), log=job, cache_group=cache_group)


def write_wrapper(folder: Path, cache_root: Path, path: str | None = None,
                  log: Path | None = None, cache_group: int | None = None) -> Path | None:
    """Write ``<folder>/host_compiler/g++`` for the real ``g++`` found on ``path`` (PATH by
    default) and return its folder; None without a g++. No wrapper's folder is searched, this
    job's or another's (a process forked from a worker inherits its PATH): a wrapper must call
    the compiler, not a wrapper. Its compiles are logged in ``log`` (default ``folder``); its
    cache trusts what the kernel cache's build trusts (``cache_group``: docs/kernel-cache.md,
    "The trust rule")."""
    tools = folder / WRAPPER_FOLDER
    search = [p for p in (path or os.environ.get("PATH", "")).split(os.pathsep)
              if p and Path(p).name != WRAPPER_FOLDER]
    real = shutil.which("g++", path=os.pathsep.join(search))
    if real is None:
        return None
    real = str(Path(real).absolute())
    tools.mkdir(parents=True, exist_ok=True)
    config = tools / "config.json"
    imported = sys.modules.get("pypto")
    pypto_dir = str(Path(imported.__file__).parent) if imported and imported.__file__ else None
    config.write_text(json.dumps({"compiler": real, "identity": compiler_identity(real),
                                  "pypto": pypto_dir,
                                  "cache": str(cache_root), "job": str(folder.absolute()),
                                  "log": str((log or folder).absolute() / LOG),
                                  "cache_group": cache_group},
                                 indent=1))
    # -I -S: no site-packages, no PYTHONPATH; the script finds this package by its own path
    runner = " ".join(shlex.quote(p) for p in (sys.executable, "-I", "-S", __file__, str(config)))
    wrapper = tools / "g++"
    wrapper.write_text(
        "#!/bin/sh\n"
        "# PyPTO's host g++, cached by content (pypto_kernels/host_compiler_cache.py)\n"
        f'case " $* " in *" -S "*) exec {runner} "$@" ;; esac\n'
        f'exec {shlex.quote(real)} "$@"\n')
    wrapper.chmod(0o755)
    return tools


def compiler_identity(real: str) -> str:
    """What the compiler is: its path (and where it leads) and what it says its version is."""
    version = subprocess.run([real, "--version"], capture_output=True, check=False).stdout
    return f"{real}\n{os.path.realpath(real)}\n{version.decode(errors='replace')}"


# --- in the wrapper, one process per g++ call ------------------------------------------------

def main(argv: list[str]) -> int:
    config = json.loads(Path(argv[0]).read_text())
    compiler, args = config["compiler"], argv[1:]
    request = cacheable(args)
    if request is None:
        os.execv(compiler, [compiler, *args])
    source, output = request
    folders = {str(source.parent): SOURCE_DIR, config["job"]: JOB_DIR,  # innermost first
               **({config["pypto"]: PYPTO_DIR} if config.get("pypto") else {})}
    # The cache only saves time: whatever goes wrong in it (a full disk, a cache folder that is
    # not one), the real compiler decides the outcome, never the cache. A failure here would
    # otherwise fail PyPTO's compile, and a compile error is stored in the kernel cache.
    key, header = None, None
    try:
        cache, key, inputs = _cache_and_key(config, args, output, folders)
        if key is not None and _replayed(cache, key, output, folders):
            _log(config, "hit", output, key)
            return 0
        if key is not None:
            header = precompiled_header(config, args, source, inputs)
    except Exception as error:  # noqa: BLE001 - see above
        _warn(error)
    started = time.perf_counter()
    done, precompiled = _compile(compiler, args, header)
    sys.stdout.buffer.write(done.stdout)
    sys.stderr.buffer.write(done.stderr)
    if key is not None and done.returncode == 0 and output.is_file():  # a failure: never stored
        try:
            _store(cache, key, output.read_bytes(), done, folders)
            _log(config, f"miss {time.perf_counter() - started:.3f}s"
                         f"{' precompiled' if precompiled else ''}", output, key)
        except Exception as error:  # noqa: BLE001 - the compile succeeded; only storing failed
            _warn(error)
    return done.returncode if done.returncode >= 0 else 128 - done.returncode  # as a shell says


def _compile(compiler: str, args: list[str], header: Path | None
             ) -> tuple[subprocess.CompletedProcess, bool]:
    """The real compile, and whether it went through the precompiled header. Should that one
    fail (a header g++ would not take), the plain one decides: a precompiled header only saves
    time, it never changes the outcome."""
    if header is not None:
        done = subprocess.run([compiler, "-include", str(header), *args], capture_output=True,
                              check=False)
        if done.returncode == 0:
            return done, True
    return subprocess.run([compiler, *args], capture_output=True, check=False), False


def _cache_and_key(config: dict, args: list[str], output: Path, folders: dict[str, str]):
    """The cache, this compile's key and the files it reads; no key when the compile cannot be
    cached (its files cannot be listed, or it reads the clock)."""
    from pypto_offline.pypto_kernels.cache import cache_key, nested_cache, sha256
    from pypto_offline.pypto_kernels.cache_trust import Trust

    inputs = files_read(config["compiler"], args, output)
    if inputs is None or any(m in data for data in inputs.values() for m in CLOCK_MACROS):
        return None, None, None
    key = cache_key(
        tool="host-compiler", format=FORMAT, compiler=config["identity"],
        args=[portable(a, folders) for a in args], cwd=portable(os.getcwd(), folders),
        environment={name: os.environ.get(name) for name in ENVIRONMENT},
        # a source naming the pypto folder (an #include of its absolute path) is the same
        # source in every fork server: the folder as its fixed name (its output too, _store)
        inputs=[[portable(path, folders), sha256(portable_bytes(data, folders))]
                for path, data in inputs.items()])
    return nested_cache(Path(config["cache"]), SUBFOLDER, Trust(config.get("cache_group"))), \
        key, inputs


# --- the precompiled header -------------------------------------------------------------------

def precompiled_prologue(text: str, local: Path) -> str | None:
    """The header to precompile for a source: the ``#define`` lines and the ``#include`` lines of
    headers outside the source's folder (``local``) with which it opens, in its order; None when
    it includes none. PyPTO 0.2.0's control-flow sources open with ``#define __TILE_FWK_AICPU__
    1``, ``<stdint.h>``, their own ``expression_0.h`` (macros only), then ``tilefwk/*.h`` and
    their ``control_flow_expr_table.h``: the precompiled header reads the system and PyPTO
    headers first, and the source's own lines then find them already included (guarded
    headers; the identical ``#define`` is no redefinition). The compiled output is the same byte
    for byte (tests/test_host_compiler_cache.py checks PyPTO's sources). The prologue ends at
    the first line that is none of these (a conditional, a pragma, code)."""
    kept = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("//"):
            continue
        if stripped.startswith("#define "):
            kept.append(stripped)
            continue
        if not stripped.startswith("#include "):
            break
        name = stripped[len("#include "):].strip()
        if name.startswith('"') and (local / name.strip('"')).exists():
            continue  # a header of the source's own: read where the source reads it
        kept.append(stripped)
    if not any(line.startswith("#include") for line in kept):
        return None
    return "\n".join(kept) + "\n"


def precompiled_header(config: dict, args: list[str], source: Path,
                       inputs: dict[str, bytes]) -> Path | None:
    """The header for ``-include`` whose precompiled form (``.gch`` beside it) serves this
    compile, built on first use and cached by content: the compiler's identity, the options
    (less the source and the output), the header's text and every header outside the source's
    folder that the compile reads (``inputs``, as ``g++ -M`` listed them; a superset of what the
    header reads). g++ checks a ``.gch`` against the options itself and, when it would not fit,
    reads the header as text: slower, the same output."""
    from pypto_offline.pypto_kernels.cache import cache_key, nested_cache, sha256
    from pypto_offline.pypto_kernels.cache_trust import Trust

    header = precompiled_prologue(source.read_text(errors="replace"), source.parent)
    options = _options(args, source=False)
    if header is None or any(o.startswith("-I") and not o[2:].startswith("/") for o in options):
        return None  # an include folder relative to the job's folder: not the same header
    local = str(source.parent.resolve())
    key = cache_key(
        tool="host-compiler-pch", format=PCH_FORMAT, compiler=config["identity"],
        options=options, header=header,
        environment={name: os.environ.get(name) for name in ENVIRONMENT},
        inputs=sorted([path, sha256(data)] for path, data in inputs.items()
                      if not str(Path(path).resolve()).startswith(local + os.sep)))
    cache = nested_cache(Path(config["cache"]), PCH_SUBFOLDER, Trust(config.get("cache_group")))
    if cache.read(key, lambda files: _precompiled(files, key, header)) is None and \
            not _build_precompiled(cache, key, config["compiler"], options, header):
        return None
    return cache.entry(key) / PCH_HEADER


def _build_precompiled(cache, key: str, compiler: str, options: list[str], header: str) -> bool:
    """Compile the header to its ``.gch`` and store both under ``key``; False when g++ fails."""
    staged = cache.staging()
    try:
        (staged / PCH_HEADER).write_text(header)
        built = subprocess.run([compiler, *options, "-x", "c++-header", str(staged / PCH_HEADER),
                                "-o", str(staged / f"{PCH_HEADER}.gch")],
                               capture_output=True, check=False)
        if built.returncode != 0:
            return False
        (staged / PCH_RECORD).write_text(json.dumps({"key": key, "format": PCH_FORMAT}))
        cache.put(key, staged)  # another worker's identical entry may be kept instead
        return True
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def _precompiled(files: dict[str, bytes], key: str, header: str) -> bool:
    from pypto_offline.pypto_kernels.cache import DamagedEntry

    if set(files) != {PCH_RECORD, PCH_HEADER, f"{PCH_HEADER}.gch"}:
        raise DamagedEntry("not a precompiled header entry")
    if json.loads(files[PCH_RECORD]) != {"key": key, "format": PCH_FORMAT} or \
            files[PCH_HEADER] != header.encode():
        raise DamagedEntry(f"{PCH_RECORD} names another header")
    return True


def _options(args: list[str], source: bool = True) -> list[str]:
    """A compile's arguments without ``-S``, ``-o <file>`` and, unless ``source``, its source
    (the one word that is no option: ``cacheable`` takes no option written apart from its
    value)."""
    options, skip = [], False
    for arg in args:
        if skip or arg == "-S":
            skip = False
            continue
        if arg == "-o":
            skip = True
            continue
        if source or arg.startswith("-"):
            options.append(arg)
    return options


def _replayed(cache, key: str, output: Path, folders: dict[str, str]) -> bool:
    """Write a stored compile's output and messages, as the compiler would have here."""
    stored = cache.read(key, lambda files: _replay(files, key))
    if stored is None:
        return False
    write_output(output, restore(stored["output"], folders))
    sys.stdout.buffer.write(restore(stored["stdout"], folders))
    sys.stderr.buffer.write(restore(stored["stderr"], folders))
    return True


def _warn(error: Exception) -> None:
    print(f"pypto-offline: warning: the host compiler cache is not used for this compile "
          f"({type(error).__name__}: {error})", file=sys.stderr)


def cacheable(args: list[str]) -> tuple[Path, Path] | None:
    """(source, output) of a plain ``-S`` compile of one source, or None: any other call (the
    assembling ``-c``, an option outside ``ALLOWED``) runs uncached."""
    sources, outputs, rest = [], [], iter(args)
    for arg in rest:
        if arg == "-o":
            outputs.append(next(rest, ""))
        elif arg == "-S":
            continue
        elif arg.startswith("-"):
            if not arg.startswith(ALLOWED) or arg.startswith(REFUSED) or arg in TAKES_NEXT:
                return None
        else:
            sources.append(arg)
    if args.count("-S") != 1 or len(outputs) != 1 or not outputs[0] or len(sources) != 1:
        return None
    if not sources[0].endswith(SOURCES):
        return None
    return Path(sources[0]).absolute(), Path(outputs[0]).absolute()


def files_read(compiler: str, args: list[str], output: Path) -> dict[str, bytes] | None:
    """Every file the compile reads (its source, then its headers), by path as the compiler
    names it, with its content: ``g++ -M`` on the same options, which only preprocesses
    (measured ~0.03 s against ~0.16 s for the compile). None when that fails."""
    listed = subprocess.run([compiler, *_options(args), "-M"], capture_output=True, check=False)
    if listed.returncode != 0:
        return None
    text = listed.stdout.decode().replace("\\\n", " ")
    paths = text.partition(": ")[2].replace("\\ ", "\0").split()
    try:
        return {p.replace("\0", " "): Path(p.replace("\0", " ")).read_bytes() for p in paths}
    except OSError:
        return None


def portable(text: str, folders: dict[str, str]) -> str:
    """``text`` with the job's folders (they change from build to build) as fixed names."""
    return portable_bytes(text.encode(), folders).decode()


def portable_bytes(data: bytes, folders: dict[str, str]) -> bytes:
    """An output (or message) as stored: the job's folders reach the compiled output only
    through ``__FILE__``, and the compiler's messages through the file names they quote."""
    for folder, name in folders.items():
        data = data.replace(folder.encode(), name.encode())
    return data


def restore(data: bytes, folders: dict[str, str]) -> bytes:
    """A stored output with this job's folders put back, as the compiler would write it here."""
    for folder, name in folders.items():
        data = data.replace(name.encode(), folder.encode())
    return data


def write_output(output: Path, data: bytes) -> None:
    staged = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    staged.write_bytes(data)
    os.replace(staged, output)


def _store(cache, key: str, output: bytes, done: subprocess.CompletedProcess,
           folders: dict[str, str]) -> None:
    staged = cache.staging()
    try:
        (staged / RECORD).write_text(json.dumps({"key": key, "format": FORMAT}))
        for name, data in (("output", output), ("stdout", done.stdout), ("stderr", done.stderr)):
            (staged / name).write_bytes(portable_bytes(data, folders))
        cache.put(key, staged)
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def _replay(files: dict[str, bytes], key: str) -> dict[str, bytes]:
    """A stored compile, if it is one stored under ``key`` (its files already match the
    manifest): the compiler's output, stdout and stderr."""
    from pypto_offline.pypto_kernels.cache import DamagedEntry

    if set(files) != {RECORD, "output", "stdout", "stderr"}:
        raise DamagedEntry("not a host compiler entry")
    record = json.loads(files[RECORD])
    if record != {"key": key, "format": FORMAT}:
        raise DamagedEntry(f"{RECORD} names another compile")
    return files


def _log(config: dict, outcome: str, output: Path, key: str) -> None:
    """One line in the job folder (kept in the kernel's entry): what each compile did."""
    line = f"{outcome} {output.name} {key[:16]}\n".encode()
    fd = os.open(config["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)  # one write: parallel compiles of one job do not interleave
    finally:
        os.close(fd)


def _import_without_package_init() -> None:
    """Run as a script for every g++ call: importing ``pypto_offline`` itself would load the ONNX
    importer (onnx, numpy: 1.5 s). Its subpackages are registered as bare packages, so that only
    ``cache`` (and ``errors``) are loaded."""
    import types

    package = Path(__file__).resolve().parent.parent
    for name, path in (("pypto_offline", package), ("pypto_offline.pypto_kernels",
                                                    package / "pypto_kernels")):
        module = types.ModuleType(name)
        module.__path__ = [str(path)]
        sys.modules[name] = module


if __name__ == "__main__":
    _import_without_package_init()
    sys.exit(main(sys.argv[1:]))
