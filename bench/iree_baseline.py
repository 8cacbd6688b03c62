"""IREE as a baseline: import the ONNX model, compile it for llvm-cpu, count what runs, check it.

Counted: ``stream.cmd.dispatch``, ``stream.cmd.fill`` and ``stream.cmd.copy`` in the IR at
``--compile-to=stream`` outside ``util.initializer`` blocks (those run once at load) — the commands
the runtime issues per call; the counts equal IREE's own scheduling statistics
(``stream-aggregate.execution``). Shapes are pinned first (every tensor's shape from onnxruntime,
the same probe our importer runs): IREE's importer leaves dims it cannot infer dynamic, and its
compile then fails on them. Nothing else is rewritten: where IREE 3.13 cannot compile an op (seen:
reflect and edge Pad, a Conv whose padding no output reads), the failure is the result.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx

FLAGS = ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu",
         "--iree-llvmcpu-target-cpu=host"]


def _tool(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def pin_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    from pypto_offline.importer import shape_probe

    probed = shape_probe.probe(model)
    pinned = onnx.ModelProto()
    pinned.CopyFrom(model)
    del pinned.graph.value_info[:]  # onnx's own STFT inference is wrong (512 bins, not 257)
    outputs = {o.name for o in pinned.graph.output}
    for name, (dtype, shape) in sorted(probed.items()):
        if shape is None:
            continue
        info = onnx.helper.make_tensor_value_info(
            name, onnx.helper.np_dtype_to_tensor_dtype(dtype), list(shape))
        if name in outputs:
            next(o for o in pinned.graph.output if o.name == name).CopyFrom(info)
        else:
            pinned.graph.value_info.append(info)
    return pinned


def count_commands(stream_ir: str) -> dict[str, int]:
    blocks = re.split(r"(?m)^(?=  (?:util\.initializer|util\.func|util\.global|"
                      r"stream\.executable|func\.func))", stream_ir)
    per_call = "".join(b for b in blocks if not b.startswith("  util.initializer"))
    count = lambda op: len(re.findall(rf"\bstream\.cmd\.{op}\b", per_call))  # noqa: E731
    return {"dispatches": count("dispatch"), "fills": count("fill"), "copies": count("copy")}


def _failure(step: str, done) -> dict:
    text = done["stderr"] if isinstance(done, dict) else done.stderr
    lines = [line for line in text.splitlines() if "error" in line.lower()] or \
        [line for line in text.splitlines() if line.strip()][-1:] or ["(no message)"]
    message = re.sub(r"^.*?iree\.mlir:", "iree.mlir:", lines[0].strip())  # no temp folder
    return {"error": f"{step}: {message[:200]}"}


def compile_and_check(source: Path, feeds: dict, reference: list, folder: Path) -> dict:
    from bench.compare import max_abs_diff, measured

    model = pin_shapes(onnx.load(source))
    pinned = folder / "iree.onnx"
    onnx.save(model, pinned)
    mlir, vmfb = folder / "iree.mlir", folder / "iree.vmfb"
    imported = measured([_tool("iree-import-onnx"), pinned, "-o", mlir])
    if imported["returncode"]:
        return _failure("import", imported)
    stream = subprocess.run([_tool("iree-compile"), mlir, *FLAGS, "--compile-to=stream", "-o",
                             folder / "iree.stream.mlir"], capture_output=True, text=True)
    if stream.returncode:
        return _failure("compile", stream)
    counts = count_commands((folder / "iree.stream.mlir").read_text())
    compiled = measured([_tool("iree-compile"), mlir, *FLAGS, "-o", vmfb])
    if compiled["returncode"]:
        return _failure("compile", compiled)
    row = {**counts, "kernels": sum(counts.values()),
           "seconds": round(imported["seconds"] + compiled["seconds"], 2),
           "peak_mb": round(max(imported["peak_mb"], compiled["peak_mb"]))}
    try:
        row["max_abs_diff"] = max_abs_diff(_run(vmfb, model, feeds), reference)
    except Exception as error:  # noqa: BLE001 - a module that cannot run is a result
        row["max_abs_diff"] = f"does not run: {str(error).splitlines()[0][:160]}"
    return row


def _run(vmfb: Path, model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import iree.runtime as rt

    module = rt.load_vm_flatbuffer_file(str(vmfb), driver="local-task")
    entry = next(f for f in module.vm_module.function_names
                 if not f.endswith("$async") and f != "__init")
    initialisers = {t.name for t in model.graph.initializer}
    args = [feeds[i.name] for i in model.graph.input if i.name not in initialisers]
    result = module[entry](*args)
    results = result if isinstance(result, (list, tuple)) else [result]
    return [np.asarray(r.to_host()) for r in results]
