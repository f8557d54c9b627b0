"""The built-in engine: a plain step loop with file, search, git and commit tools (docs/engine.md)."""
