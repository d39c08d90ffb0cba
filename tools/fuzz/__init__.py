"""A fuzz campaign for hostile GGUF files: seeded mutations of the test fixtures and of the default
model's header, each case run through `vkdflash inspect` and `vkdflash generate` in a worker process
with a time and memory cap, outcomes counted per mutation kind.

Run from the repository root: `python -m tools.fuzz --cases 20000` (see --help). Case i of seed s
is the same everywhere: `--seed s --only-index i --keep DIR` replays it and keeps its files.

Hypothesis and atheris drive a function in-process; what a campaign over this CLI needs is what
neither does: a case that hangs in a chat template or allocates gigabytes must be cut off and
counted without taking the run down, and a warm Vulkan worker must be reused across cases.
"""
