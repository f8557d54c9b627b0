"""stellafleet: run many AI coding-agent workers at once against one git repository."""

__version__ = "0.1.0"
