"""Jinja2 prompt templates (data only; loaded with importlib.resources by llmcompile.prompting)."""
