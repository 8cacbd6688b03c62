"""Checks against onnxruntime (fusion issue)."""
