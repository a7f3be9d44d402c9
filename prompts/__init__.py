"""Jinja2 prompt templates; rendered by llmcompile.prompting (no prompt text lives in Python)."""
