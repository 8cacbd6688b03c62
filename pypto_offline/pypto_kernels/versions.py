"""What the kernels are compiled with: the PyPTO release, the format of a cached kernel, and a
job's default time limit. Part of every cache key, with the target's platform (``platform.py``)."""

PYPTO_VERSION = "0.2.0"
KERNEL_FORMAT = 25  # bump when the generator changes what a cached entry means (25: an fp16
# region's reference is its ops evaluated one by one where onnxruntime's result is apart from
# that, region_data._per_op_where_apart; 24: the
# functional check's bound scales with the reference's magnitude, runtime.within_tolerance; 23: the
# functional check is bounded by the least precise float type the region computes in; 22: an entry
# keeps every tile candidate tried, the report's tile table; 21: one OpenMP
# thread in the workers; 20: PyPTO sees no host address, no_host_address.py: artifacts alike on
# every host; 19: a checked compile's artifacts come from a heap of its own, before they followed the build's history,
# docs/determinism.md; 18: a matmul's L0C and L1 tensors were counted as UB; 17: compiles after
# a failed one in the same process were cached as failed, docs/workers.md)
DEFAULT_TIMEOUT_S = 300
