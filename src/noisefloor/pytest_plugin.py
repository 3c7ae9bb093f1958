"""pytest plugin (stub)."""
