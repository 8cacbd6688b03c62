"""PyPTO kernels: a Tensor-mode module per fused region (``codegen``), tile candidates
(``tiling``), real compiles in fresh worker processes (``worker``, ``compiler``), a
content-addressed cache (``cache``).

PyPTO is imported only inside the worker processes: importing this package imports neither torch
nor pypto.
"""
from pypto_offline.pypto_kernels.cache import KernelCache, default_cache_dir
from pypto_offline.pypto_kernels.compiler import compile_kernels, compile_region, region_model
from pypto_offline.pypto_kernels.records import Kernel, TileResult

__all__ = ["Kernel", "KernelCache", "TileResult", "compile_kernels", "compile_region",
           "default_cache_dir", "region_model"]
