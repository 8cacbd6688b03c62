"""The build's options spelled once (issue 55): ``BuildOptions``' table gives the API's keywords
and defaults, the compile command's flags and the provenance the blob records; the records
are the ones blobs have always had (a blob built again stays byte-identical)."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

from pypto_offline import api, cli
from pypto_offline.cli.flags import option_keywords
from pypto_offline.errors import UsageError
from pypto_offline.importer import precision
from pypto_offline.offline_compiler.options import KEYWORDS, BuildOptions
from pypto_offline.pypto_kernels.versions import DEFAULT_TIMEOUT_S

FLAGGED = [keyword for keyword in KEYWORDS.values() if keyword.flags]


def test_every_option_keyword_is_a_keyword_of_compile_with_its_default():
    parameters = inspect.signature(api.compile).parameters
    for name, keyword in KEYWORDS.items():
        assert name in parameters and (name == "input_shapes" or
                                       parameters[name].default == keyword.default)
    assert parameters["jobs"].default == 2
    assert parameters["precision_mode"].default == precision.MUST_KEEP
    assert "--kernel-timeout" in api.compile.__doc__


def test_an_unknown_keyword_of_compile_is_a_type_error_before_any_work(tmp_path):
    with pytest.raises(TypeError, match="unexpected keyword argument 'tile'"):
        api.compile(tmp_path / "missing.onnx", tile=False)


def test_every_flag_of_the_table_is_a_flag_of_the_compile_command():
    parser = cli.compile_parser()
    spelled = {flag: action.dest for action in parser._actions for flag in action.option_strings}
    assert {flag: spelled.get(flag) for k in FLAGGED for flag in k.flags} == \
        {flag: k.name for k in FLAGGED for flag in k.flags}


def test_the_flags_given_are_the_api_keywords_and_the_others_keep_the_api_defaults():
    args = cli.compile_parser().parse_args(["m.onnx", "--target", "kirin9050"])
    assert option_keywords(args) == {"tile_search": True, "measure_baseline": False,
                                     "compare_platform": False, "verify": True}
    args = cli.compile_parser().parse_args([
        "m.onnx", "--target", "kirin9050", "--no-tile-search", "--no-verify", "--jobs", "3",
        "--kernel-timeout", "60", "--precision-mode", "force_fp16", "--output_type", "FP16",
        "--input_fp16_nodes", "a;b", "--keep_dtype", "keep.txt", "--cache-dir", "c",
        "--cache-trust-group", "team", "--measure-baseline", "--compare-platform",
        "--input-format", "ND"])
    assert option_keywords(args) == {
        "tile_search": False, "verify": False, "jobs": 3, "kernel_timeout": 60.0,
        "precision_mode": "force_fp16", "output_type": "FP16", "input_fp16_nodes": "a;b",
        "keep_dtype": "keep.txt", "cache_dir": "c", "cache_trust_group": "team",
        "measure_baseline": True, "compare_platform": True, "input_format": "ND"}


def test_keywords_become_the_fields_as_the_api_always_made_them(tmp_path):
    default = BuildOptions.from_keywords(cache_dir=str(tmp_path))
    assert default == BuildOptions(cache_dir=tmp_path, cache_trust=default.cache_trust)
    assert default.kernel_timeout_s == DEFAULT_TIMEOUT_S and default.jobs == 2
    given = BuildOptions.from_keywords(
        input_shapes={"x": [1, 2]}, dims={"b": 1}, cache_dir=str(tmp_path / "cache"),
        kernel_timeout=5, input_format="nd", precision_mode="force_fp16",
        input_fp16_nodes="x", output_type="FP16")
    assert (given.input_shapes, given.dims, given.cache_dir, given.kernel_timeout_s,
            given.input_format) == ({"x": [1, 2]}, {"b": 1}, tmp_path / "cache", 5, "ND")
    assert given.half_io == precision.half_io("x", "FP16")


@pytest.mark.parametrize("keywords,said", [
    ({"jobs": 0}, "--jobs must be positive"),
    ({"kernel_timeout": -1}, "--kernel-timeout must be positive"),
    ({"precision_mode": "fp8"}, "unknown precision mode 'fp8'"),
    ({"output_type": "FP8"}, "--output_type 'FP8' is not supported"),
])
def test_a_bad_keyword_is_a_usage_error(keywords, said, tmp_path):
    with pytest.raises(UsageError, match=said):
        BuildOptions.from_keywords(cache_dir=str(tmp_path), **keywords)


def test_the_provenance_records_what_blobs_have_always_recorded():
    assert BuildOptions().provenance() == {
        "input_shapes": "", "tile_search": "true", "baseline": "estimated"}
    given = BuildOptions(
        input_shapes={"x": [1, 3], "a": [2]}, dims={"b": 1, "a": 2}, tile_search=False,
        measure_baseline=True, compare_platform=True, input_format="ND",
        inputs={"x": np.arange(6, dtype=np.float32), "a": np.ones(2)})
    assert list(given.provenance().items()) == [
        ("input_shapes", "a=2;x=1,3"), ("tile_search", "false"), ("baseline", "measured"),
        ("compare_platform", "910b"), ("input_format", "ND"), ("dims", "a=2;b=1"),
        ("inputs", "a=5f07eef034c5a21f;x=e2c0a71510b5394d")]


def test_the_precision_options_are_recorded_under_a_converting_mode_only():
    keep = precision.KeepDtype(nodes=frozenset({"n1"}), op_types=frozenset({"Add"}))
    half = precision.half_io("a;b", "FP16")
    converted = BuildOptions(precision_mode="force_fp16", keep_dtype=keep, half_io=half)
    assert list(converted.provenance().items())[3:] == [
        ("precision_mode", "force_fp16"), ("keep_dtype", "n1;OpType::Add"),
        ("input_fp16_nodes", "a;b"), ("output_type", "FP16")]
    kept = BuildOptions(keep_dtype=keep, half_io=half)
    assert kept.provenance() == BuildOptions().provenance()


def test_the_cache_commands_take_the_cache_flags_of_the_table(capsys):
    with pytest.raises(SystemExit):
        cli.main(["cache", "clean", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in ("cache_dir", "cache_trust_group"):
        assert " ".join(KEYWORDS[name].help.split()) in text
