"""The built-in engine: a plain step loop with file, search, git and commit tools.

See docs/engine.md. The pieces: settings (the `[engine]` config), clients (OpenAI and Anthropic wire
formats over one transport), workspace and tools (what the model may do), transcript (the record of an
attempt) and loop (the step loop itself, pricing each call with core.pricing into core.spend's tally).
"""
