"""The agent: from an op to a kernel through rounds of prompts, answers and verdicts.

loop.py       the loop itself (`run_agent`): prompt -> answers -> verdicts -> feedback, until the target
providers.py  where answers come from: an OpenAI-compatible endpoint, or the replay of a transcript
offline.py    the offline search: no LLM, the reference kernel's or a template's knob variants
prompting.py  the system, task and feedback prompts; the code pulled out of an answer
render.py     the jinja2 environment over prompts/ and the reference kernels' sources
patterns/     a KernelBench model's torch graph matched to a template, and the kernel rendered
runs.py       the run directory: written as it happens, resumable, best/ linked at the end
report.py     the closing table and best/report.md
ratelimit.py  a token bucket shared by the agents of one eval
"""
