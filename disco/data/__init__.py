"""Training data for the cost models: the collectors and the one reader and writer of their files.

- :mod:`disco.data.collect`: per-plan step times and per-op profiles (``samples.jsonl``);
- :mod:`disco.data.kernel_collect`: per-kernel device times (``kernels.jsonl``);
- :mod:`disco.data.runs`: the plans a ``disco optimize`` run measured (``samples.jsonl``);
- :mod:`disco.data.dataset`: the dataset directory's format, its lock, reading and repair.
"""
