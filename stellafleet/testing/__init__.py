"""Fakes shipped with the package so tests (ours and users') can stand in for outside tools."""
