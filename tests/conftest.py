"""Hypothesis explores new random examples on every developer run; in CI (CI=true) it replays a
fixed sequence, so that a submission's CI result does not depend on the draw."""
import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI") == "true":
    settings.load_profile("ci")
