"""PyPTO kernel generation, tiling, compile and cache (kernels issue)."""
