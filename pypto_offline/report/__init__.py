"""The HTML fusion report (report issue)."""
