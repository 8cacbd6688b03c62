"""The op registry: what each ONNX op the compiler takes is (its kind, the inputs it reads, what
it may be fused with), on the ground floor, where every stage (importer, fusion, kernels,
report) reads it and none is imported by it. ``registry/ops.py`` holds the entries
(docs/architecture.md, "Adding an op")."""
