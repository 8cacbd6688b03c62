"""Blob reader fuzzing (hypothesis): flipped bytes, truncation, random bytes, wrong versions, and
payloads that are damaged but carry a valid digest (a buggy writer, a hand edit). The reader either
refuses with the one clear error or returns a model whose summary and report can be made."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pypto_offline import cli
from pypto_offline.errors import ModelError
from pypto_offline.offline_compiler import blob
from pypto_offline.offline_compiler.summary import summarise
from pypto_offline.report import render_report
from tests.cache_entries import warm_cache
from tests.malformed import EXAMPLE

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])


class Blob(bytes):
    def __repr__(self) -> str:  # hypothesis prints its arguments: not 300 KB of them
        return f"<blob of {len(self)} bytes>"


@pytest.fixture(scope="module")
def valid_blob(tmp_path_factory, example_cache) -> bytes:
    folder = tmp_path_factory.mktemp("fuzz")
    out = folder / "example.ptom"
    assert cli.main([str(EXAMPLE), "--target", "kirin9050", "--input-shape", "x=1,3,64,64",
                     "-o", str(out), "--no-report", "--quiet",
                     "--cache-dir", str(warm_cache(example_cache, folder))]) == 0
    return Blob(out.read_bytes())


def signed(payload: bytes, version: int = blob.FORMAT_VERSION) -> bytes:
    return blob.HEADER.pack(blob.MAGIC, version, hashlib.sha256(payload).digest()) + payload


def read_or_refuse(data: bytes) -> None:
    """The property: a clear ModelError, or a model every reader of the blob can use."""
    try:
        message = blob.from_bytes(data)
    except ModelError as error:
        assert str(error) and "\n" not in str(error)
        return
    summarise(message)
    render_report(message)


@pytest.mark.pypto
@FUZZ
@given(data=st.data())
def test_flipped_bytes_anywhere(valid_blob, data):
    damaged = bytearray(valid_blob)
    positions = data.draw(st.sets(st.integers(0, len(damaged) - 1), min_size=1, max_size=8))
    for position in positions:
        damaged[position] ^= data.draw(st.integers(1, 255))
    with pytest.raises(ModelError):
        blob.from_bytes(bytes(damaged))


@pytest.mark.pypto
@FUZZ
@given(data=st.data())
def test_truncation_at_any_length(valid_blob, data):
    length = data.draw(st.integers(0, len(valid_blob) - 1))
    with pytest.raises(ModelError):
        blob.from_bytes(valid_blob[:length])


@FUZZ
@given(raw=st.binary(max_size=4096))
def test_random_bytes(raw):
    read_or_refuse(raw)
    read_or_refuse(blob.MAGIC + raw)
    read_or_refuse(signed(raw))


@pytest.mark.pypto
@FUZZ
@given(version=st.integers(0, 2**32 - 1).filter(lambda v: v != blob.FORMAT_VERSION))
def test_wrong_versions(valid_blob, version):
    payload = valid_blob[blob.HEADER.size:]
    with pytest.raises(ModelError, match="format version"):
        blob.from_bytes(signed(payload, version))


@pytest.mark.pypto
@FUZZ
@given(data=st.data())
def test_damaged_payload_with_a_valid_digest(valid_blob, data):
    payload = bytearray(valid_blob[blob.HEADER.size:])
    for _ in range(data.draw(st.integers(1, 6))):
        position = data.draw(st.integers(0, len(payload) - 1))
        payload[position] ^= data.draw(st.integers(1, 255))
    cut = data.draw(st.integers(0, len(payload)))
    read_or_refuse(signed(bytes(payload[:cut] if data.draw(st.booleans()) else payload)))


@pytest.mark.pypto
@pytest.mark.parametrize("field", ["onnx_model", "source_onnx_model"])
def test_a_graph_name_that_is_not_utf8_is_refused(valid_blob, field):
    """Found by test_damaged_payload_with_a_valid_digest: protobuf does not check ONNX's proto2
    strings, so a flipped byte in a tensor name read back as bytes and the report failed on
    it (TypeError, exit 3)."""
    message = blob.from_bytes(valid_blob)
    model = getattr(message, field)
    name = message_graph_input(model)
    setattr(message, field, model.replace(name.encode(), b"\xff" * len(name.encode())))
    with pytest.raises(ModelError, match=f"blob's {field} holds a name that is not UTF-8 text"):
        blob.from_bytes(signed(message.SerializeToString(deterministic=True)))


@pytest.mark.pypto
@pytest.mark.parametrize("field", ["onnx_model", "source_onnx_model"])
def test_an_element_type_onnx_does_not_define_is_read_or_refused(valid_blob, field):
    """Found by test_damaged_payload_with_a_valid_digest: a flipped byte made a tensor's element
    type 31, and naming it for the report raised ValueError from ONNX's enum (exit 3)."""
    import onnx

    message = blob.from_bytes(valid_blob)
    model = onnx.load_from_string(getattr(message, field))
    for value in (*model.graph.input, *model.graph.value_info, *model.graph.output):
        value.type.tensor_type.elem_type = 31
    setattr(message, field, model.SerializeToString(deterministic=True))
    read_or_refuse(signed(message.SerializeToString(deterministic=True)))


def test_an_undefined_element_type_has_a_name():
    from pypto_offline.importer.input_shapes import dtype_name

    assert (dtype_name(1), dtype_name(16), dtype_name(31), dtype_name(0)) == (
        "float32", "bfloat16", "type 31", "?")


def message_graph_input(serialized: bytes) -> str:
    import onnx

    return onnx.load_from_string(serialized).graph.input[0].name
