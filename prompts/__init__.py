"""Jinja2 prompt templates; rendered by llmcompile.agent.render (no prompt text lives in Python)."""
