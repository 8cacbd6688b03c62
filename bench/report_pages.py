"""The report's pages on real builds (issue 21): bytes, time to open in headless Chromium, and
screenshots of the headline, the graph and the kernel table.

    python -m bench.report_pages [--models a,b] [--target kirin9050] [--blobs DIR] [--out DIR]

A model's blob is taken from ``--blobs`` (``MODEL.TARGET.ptom``, e.g. a farm bench's outputs)
when it is there, else built (with the default kernel cache). The page must stay under
``PAGE_LIMIT_BYTES`` and open in under ``OPEN_LIMIT_MS`` (the issue's bounds); the results say
whether each did, they are not asserted here (tests/test_report.py does, on a page of each kind).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from bench import browser, corpus

PAGE_LIMIT_BYTES = 5_000_000
OPEN_LIMIT_MS = 2000
SHOTS = (("headline", "h1"), ("graph", "#graph-title"), ("kernels", "#kernels-table-title"))


def blob_of(name: str, target: str, blobs: Path | None, folder: Path) -> Path:
    if blobs and (blobs / f"{name}.{target}.ptom").exists():
        return blobs / f"{name}.{target}.ptom"
    from pypto_offline import api

    compiled = api.compile(corpus.model_path(name), target, corpus.MODELS[name].input_shapes)
    return compiled.save(folder / f"{name}.{target}.ptom")


def measure(name: str, target: str, blob_path: Path, folder: Path, shots: Path) -> dict:
    from pypto_offline.offline_compiler import blob
    from pypto_offline.report import write_report

    message = blob.read(blob_path)
    page_path = write_report(folder / f"{name}.{target}.report.html", message)
    with browser.page(1400, 1000) as page:
        page.goto(page_path.as_uri())
        first_ms = page.evaluate(browser.LOAD_MS)
        for shot, anchor in SHOTS:
            page.evaluate(f"() => document.querySelector('{anchor}').scrollIntoView()")
            page.screenshot(path=str(shots / f"{name}.{target}.{shot}.png"))
        rows = page.locator("#kernel-table tr.kernel-row").count()
        problems = page.errors + [r for r in page.requests if r != page_path.as_uri()]
    load_ms = min(first_ms, browser.fastest_open_ms(page_path.as_uri(), opens=2))
    size = page_path.stat().st_size
    return {"model": name, "target": target, "kernels": len(message.kernels), "table_rows": rows,
            "ops": _op_count(message), "page_bytes": size,
            "load_ms": round(load_ms, 1), "problems": problems,
            "within_limits": size < PAGE_LIMIT_BYTES and load_ms < OPEN_LIMIT_MS}


def _op_count(message) -> int:
    import onnx

    return len(onnx.load_from_string(message.source_onnx_model).graph.node)


def table(rows: list[dict]) -> str:
    lines = ["| model | target | ops | kernels | table rows | page MB | opens in ms | within "
             "5 MB and 2 s |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['target']} | {r['ops']} | {r['kernels']} | {r['table_rows']} "
              f"| {r['page_bytes'] / 1e6:.2f} | {r['load_ms']} | "
              f"{'yes' if r['within_limits'] else 'NO'} |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(corpus.MODELS))
    parser.add_argument("--target", default="kirin9050")
    parser.add_argument("--blobs", type=Path, help="take MODEL.TARGET.ptom from here if there")
    parser.add_argument("--out", type=Path, default=Path("bench/results/report"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-report-") as scratch:
        for name in args.models.split(","):
            blob_path = blob_of(name, args.target, args.blobs, Path(scratch))
            rows.append(measure(name, args.target, blob_path, Path(scratch), args.out))
            print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    (args.out / "pages.json").write_text(json.dumps(rows, indent=1) + "\n")
    (args.out / "pages.md").write_text(table(rows) + "\n")
    print(table(rows))
    return 0 if all(r["within_limits"] and not r["problems"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
