"""Pipeline orchestration and the blob format (blob issue)."""
