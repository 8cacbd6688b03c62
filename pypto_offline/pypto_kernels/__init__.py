"""PyPTO kernels: a Tensor-mode module per fused region (``codegen``), tile candidates
(``tiling``) and their search (``search``), real compiles in fresh worker processes run by an
executor (``jobs/``, ``worker``), a content-addressed cache (``cache``, ``entries``).

PyPTO is imported only inside the worker processes: importing this package imports neither torch
nor pypto.
"""
from pypto_offline.pypto_kernels.cache import KernelCache, default_cache_dir
from pypto_offline.pypto_kernels.compiler import compile_kernels, compile_region, setup_for
from pypto_offline.pypto_kernels.records import Kernel, TileResult
from pypto_offline.pypto_kernels.region_data import region_model

__all__ = ["Kernel", "KernelCache", "TileResult", "compile_kernels", "compile_region",
           "default_cache_dir", "region_model", "setup_for"]
