"""Pipeline orchestration (``build``, its ``options``) and the blob format (``ptom.proto``, ``blob``)."""
from pypto_offline.offline_compiler.blob import FORMAT_VERSION, from_bytes, read, to_bytes, write
from pypto_offline.offline_compiler.build import BuildResult, build, build_together
from pypto_offline.offline_compiler.options import BuildOptions

__all__ = ["BuildOptions", "BuildResult", "FORMAT_VERSION", "build", "build_together",
           "from_bytes", "read", "to_bytes", "write"]
