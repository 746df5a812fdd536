"""Collects the opcode names XLA prints, for tests/disco/ir/test_opcodes.py (writes tests/data/xla_opcodes.json).

Sources (every instruction of every computation, fused computations included):

* ``zoo-cpu-pre``: the pre-optimisation HLO of every zoo model (``trax_models.make_train_step(name,
  "tiny", devices=2)``, lowered by the jax in this venv): the HLO that plans are written against.
* ``zoo-cpu-post``: the same steps as XLA:CPU compiled them.
* ``h100-gpu-post``: the compiled GPU HLO (field ``compiled_hlo``) of every record in
  ``/work/shared/data/h100_kernels/per_instruction.jsonl.gz`` (XLA:GPU, jax 0.11.2, one H100).

Usage:
  PYTHONPATH=. python scripts/tools/collect_xla_opcodes.py [--gpu-jsonl PATH] [--out tests/data/xla_opcodes.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path

GPU_JSONL = "/work/shared/data/h100_kernels/per_instruction.jsonl.gz"
OUT = Path(__file__).resolve().parents[2] / "tests" / "data" / "xla_opcodes.json"


def module_opcodes(text: str) -> set[str]:
    """The opcodes of every instruction in an HLO module text."""
    from disco.ir.hlo_parse import parse_module

    return {ins.opcode for comp in parse_module(text).computations for ins in comp.instructions}


def zoo_opcodes(models: Iterable[str], *, optimized: bool) -> dict[str, list[str]]:
    """Per zoo model at preset "tiny" on 2 devices: the opcodes of its pre- or post-optimisation HLO."""
    import trax_models
    from disco.ir.extractor import hlo_text

    out = {}
    for name in models:
        step, args = trax_models.make_train_step(name, "tiny", devices=2)
        out[name] = sorted(module_opcodes(hlo_text(step, *args, optimized=optimized)))
    return out


def gpu_opcodes(path: str) -> dict[str, list[str]]:
    """Per record of an h100_kernels JSONL file: the opcodes of its compiled GPU HLO."""
    out: dict[str, set[str]] = {}
    with gzip.open(path, "rt") as f:
        for line in f:
            rec = json.loads(line)
            key = f"{rec['model']}/{rec['preset']}/{rec['variant']}"
            out.setdefault(key, set()).update(module_opcodes(rec["compiled_hlo"]))
    return {k: sorted(v) for k, v in sorted(out.items())}


def collect(gpu_jsonl: str) -> dict:
    import jax
    import trax_models

    models = trax_models.names()
    sources = {"zoo-cpu-pre": zoo_opcodes(models, optimized=False),
               "zoo-cpu-post": zoo_opcodes(models, optimized=True),
               "h100-gpu-post": gpu_opcodes(gpu_jsonl)}
    per_source = {src: sorted({op for ops in per.values() for op in ops}) for src, per in sources.items()}
    return {
        "about": "Opcode names XLA printed; regenerate with scripts/tools/collect_xla_opcodes.py",
        "jax_cpu": jax.__version__,
        "gpu_jsonl": os.path.basename(gpu_jsonl),
        "opcodes": sorted({op for ops in per_source.values() for op in ops}),
        "by_source": per_source,
        "by_model": sources,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu-jsonl", default=GPU_JSONL)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    data = collect(args.gpu_jsonl)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.out}: {len(data['opcodes'])} opcodes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
