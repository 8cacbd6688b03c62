"""The package's JSON Schema (pypto_offline/offline_compiler/summary.schema.json) as a
validator of one kind of ``--json`` output, for every test that checks an output against it."""
from __future__ import annotations

import json
from importlib.resources import files


def schema_validator(definition: str):
    """A validator of the outputs of kind ``definition`` (a key of the schema's ``$defs``)."""
    import jsonschema

    schema = json.loads(files("pypto_offline.offline_compiler").joinpath(
        "summary.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator({**schema, "$ref": f"#/$defs/{definition}"})
