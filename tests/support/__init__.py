"""Helpers only the tests use (the incident timeline of the paging test)."""
