"""bench/compile_time.py's table logic (no build, no PyPTO: rows as the bench records them)."""
from bench import compile_time

COLD = {"seconds": 50.0, "peak_mb": 900, "kernels_compiled": 3, "cache_hits": 0,
        "pypto_compiles": None, "pypto_cache_hits": None, "timings": None,
        "verification": "passed", "shipped_kernels": 3, "fell_back": 1, "kernels_after": 9,
        "shipped_digest": "0123456789ab"}


def test_ratio_is_cold_over_iree_and_bold_past_the_goal():
    assert compile_time.ratio_cell(COLD, {"seconds": 10.0}) == "5.0x"
    assert compile_time.ratio_cell(COLD, {"seconds": 2.0}) == "**25.0x**"


def test_a_model_iree_cannot_compile_says_so_instead_of_a_ratio():
    assert compile_time.ratio_cell(COLD, {"error": "compile: iree.mlir: error"}) == \
        "IREE cannot compile"
    assert compile_time.ratio_cell({"error": "boom"}, {"seconds": 2.0}) == "—"
    assert compile_time.ratio_cell(None, None) == "—"


def test_figures_the_build_does_not_report_show_as_n_a():
    assert compile_time.counts_cell(COLD) == "3 / 0 / n/a / n/a"
    assert compile_time.timings_cell(COLD) == " / ".join(["n/a"] * 6)
    partial = {**COLD, "timings": {"import_s": 1.25, "kernels_s": 40.0}}
    assert compile_time.timings_cell(partial) == "1.2 / n/a / 40.0 / n/a / n/a / n/a"


def test_pypto_compile_counts_are_found_where_the_summary_puts_them():
    keys = compile_time.COUNT_KEYS["pypto_compiles"]
    assert compile_time.found_count({"pypto_compiles": 7}, keys) == 7
    assert compile_time.found_count({"timings": {"pypto_compiles": 4}}, keys) == 4
    assert compile_time.found_count({"pypto": {"compiled": 2}}, keys) is None


def test_the_table_has_one_row_per_model_with_what_ships():
    results = {"target": "kirin9050", "command": "python -m bench.compile_time", "commit": "abc",
               "machine": "nproc 2", "date": "today",
               "job_overhead": {"runs": 3, "empty_job_s": 4.5, "one_candidate_job_s": 5.25},
               "models": [{"model": "m", "cold": COLD, "warm": {**COLD, "seconds": 0.5},
                           "iree": {"seconds": 4.0}}]}
    table = compile_time.markdown(results)
    row = next(line for line in table.splitlines() if line.startswith("| m |"))
    assert row.split(" | ")[1:5] == ["50.0", "0.5", "4.0", "**12.5x**"]
    assert "passed; 3 kernels (1 fell back) `0123456789ab`" in row
    timed_out = {**COLD, "fell_back_reasons": ["PyPTO compile did not finish within 300 s"]}
    assert compile_time.shipped_cell(timed_out) == (
        "passed; 3 kernels (1 fell back: PyPTO compile did not finish within 300 s) "
        "`0123456789ab`")
    assert "empty job 4.50 s" in table and "job of a tiny region" in table
