"""Helpers shared by the tests: real git repositories, stella as a process, fakes, fixtures' parts."""
