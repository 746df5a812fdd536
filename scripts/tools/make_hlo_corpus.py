"""Regenerates tests/data/hlo_corpus/: real HLO for the parser's tests (issue 18).

Three sources, each file gzipped and listed in MANIFEST.json with where it came from:

- ``jax/``: ``XLA_FLAGS=--xla_dump_to=DIR`` dumps (before and after optimisation, XLA:CPU)
  of zoo training steps (``trax_models.make_train_step(name, "tiny", devices=2..4)``) and of
  jax programs that are not in the zoo (scan, cond, while, sort, custom_vjp, pmap, shard_map
  collectives: psum, all_gather, psum_scatter, ppermute, all_to_all), one subprocess each.
- ``gpu/``: a subset of the XLA:GPU modules in ``/work/shared/data/h100_kernels/
  per_instruction.jsonl.gz`` (``compiled_hlo`` and ``pre_optimization_hlo``; one H100, jax 0.11.2).
- ``snippets/``: hand-written modules, one per syntax form, modelled on XLA's own tests; they
  are written by hand in the repository (not by this script) and cite their source.

Usage (about 10 minutes on 2 loaded cores)::

    PYTHONPATH=. python scripts/tools/make_hlo_corpus.py [--only jax|gpu] [--keep-existing] [--out DIR]

``jax/`` holds jax 0.10.2's dumps. ``jax0.12/`` holds a few of jax 0.12.0.1's, whose printer writes
tuple elements as ``%x#1`` operands (no get-tuple-element instructions) and shardings in
HloShardingV3's form; made with a Python 3.12 environment holding that jax::

    PYTHONPATH=. python scripts/tools/make_hlo_corpus.py --only jax --jax-dir jax0.12 \
        --cases zoo_mlp_d2,shard_map_collectives,scan,cond_while
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GPU_DATA = Path("/work/shared/data/h100_kernels/per_instruction.jsonl.gz")
# (model, preset, variant) records taken from the GPU data: every model once, small preset
# (pre-optimisation and compiled), and one paper-preset compile for size.
GPU_PICK = [
    ("mlp", "small", "default"), ("rnnlm", "small", "default"), ("vgg19", "small", "default"),
    ("bert", "small", "default"), ("transformer_lm", "small", "no_multi_output_fusion"),
    ("resnet50", "small", "no_priority_fusion"), ("transformer", "small", "default"),
]

ZOO = [("mlp", 2), ("rnnlm", 3), ("transformer_lm", 4), ("bert", 2), ("resnet50", 3),
       ("vgg19", 4), ("transformer", 2)]

_ZOO_CODE = """
import jax, trax_models
step, args = trax_models.make_train_step({name!r}, "tiny", devices={devices}, abstract=True)
jax.jit(step).lower(*args).compile()
"""

# Non-zoo programs: each one runs under N virtual CPU devices and compiles `main`.
PROGRAMS: dict[str, tuple[int, str]] = {
    "scan": (1, """
        def main(x):
            def body(c, xs):
                c = jnp.tanh(c @ xs) + c
                return c, c.sum()
            return jax.lax.scan(body, x, jnp.ones((6, 8, 8)))
        ARGS = (jnp.ones((8, 8)),)
    """),
    "cond_while": (1, """
        def main(x, n):
            y = jax.lax.cond(x.sum() > 0, lambda v: v * 2, lambda v: -v, x)
            def cond(c):
                return c[0] < n
            def body(c):
                return c[0] + 1, c[1] * 1.5
            return jax.lax.while_loop(cond, body, (0, y))
        ARGS = (jnp.ones((4, 4)), 3)
    """),
    "sort_topk": (1, """
        def main(x, k):
            s = jnp.sort(x, axis=-1)
            i = jnp.argsort(x[:, 0])
            v, j = jax.lax.top_k(x, 3)
            return s, i, v, j, jax.lax.sort((x, k), num_keys=1)
        ARGS = (jnp.arange(32.0).reshape(4, 8)[:, ::-1], jnp.arange(32).reshape(4, 8))
    """),
    "custom_vjp": (1, """
        @jax.custom_vjp
        def clip_grad(x):
            return jnp.sin(x)
        def fwd(x):
            return jnp.sin(x), jnp.cos(x)
        def bwd(res, g):
            return (jnp.clip(g * res, -1, 1),)
        clip_grad.defvjp(fwd, bwd)
        def main(x):
            return jax.grad(lambda v: clip_grad(v).sum())(x)
        ARGS = (jnp.ones((16,)),)
    """),
    "pmap_psum": (4, """
        def main(x):
            return jax.pmap(lambda v: jax.lax.psum(v * 2, "i") + jax.lax.pmean(v, "i"), axis_name="i")(x)
        ARGS = (jnp.ones((4, 8)),)
        JIT = False
    """),
    "shard_map_collectives": (4, """
        mesh = jax.make_mesh((2, 2), ("a", "b"))
        def f(x):
            return (jax.lax.psum(x * 2, "b"), jax.lax.all_gather(x, "a"),
                    jax.lax.psum_scatter(x, "b", tiled=True),
                    jax.lax.ppermute(x, "a", [(0, 1), (1, 0)]),
                    jax.lax.all_to_all(x, "b", 0, 0, tiled=True),
                    jax.lax.pmax(x, ("a", "b")))
        main = jax.shard_map(f, mesh=mesh, in_specs=P("a", "b"),
                             out_specs=(P("a"), P(None, "b"), P("a", "b"), P("a", "b"), P("a", "b"), P("a", "b")),
                             check_vma=False)
        ARGS = (jax.device_put(jnp.ones((16, 8)), NamedSharding(mesh, P("a", "b"))),)
    """),
    "shard_map_grad_psum": (4, """
        mesh = jax.make_mesh((4,), ("dp",))
        def local(w, x):
            g = jax.grad(lambda w: jnp.tanh(x @ w).sum())(w)
            return jax.lax.psum(g, "dp"), jax.lax.pmean(jnp.tanh(x @ w).mean(), "dp")
        main = jax.shard_map(local, mesh=mesh, in_specs=(P(), P("dp")), out_specs=(P(), P()),
                             check_vma=False)
        ARGS = (jnp.ones((8, 8)), jax.device_put(jnp.ones((16, 8)), NamedSharding(mesh, P("dp"))))
    """),
    "jit_sharded_matmul": (4, """
        mesh = jax.make_mesh((2, 2), ("x", "y"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
        def main(a, b):
            return jnp.tanh(a @ b).sum(axis=0)
        ARGS = (jax.device_put(jnp.ones((16, 32)), NamedSharding(mesh, P("x", "y"))),
                jax.device_put(jnp.ones((32, 8)), NamedSharding(mesh, P("y", None))))
    """),
}

_PROGRAM_CODE = """
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
JIT = True
{body}
fn = jax.jit(main) if JIT else main
if JIT:
    fn.lower(*ARGS).compile()
else:
    fn(*ARGS)
"""


def _dump(code: str, devices: int, workdir: Path) -> list[Path]:
    """Runs ``code`` in a fresh interpreter with XLA dumping on; returns the dumped .txt files."""
    flags = (f"--xla_force_host_platform_device_count={devices} --xla_dump_to={workdir} "
             "--xla_dump_hlo_as_text")
    env = dict(os.environ, PYTHONPATH=str(REPO), XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=REPO, timeout=900)
    return sorted(workdir.glob("*.txt"))


def _main_pair(files: list[Path]) -> tuple[Path, Path]:
    """The largest module's before- and after-optimisation dumps (the program; not helpers)."""
    before = [p for p in files if p.name.endswith(".before_optimizations.txt")]
    if not before:
        raise RuntimeError(f"no before_optimizations dump among {[p.name for p in files]}")
    main = max(before, key=lambda p: p.stat().st_size)
    stem = main.name.removesuffix(".before_optimizations.txt")
    after = [p for p in files if p.name == f"{stem}.cpu_after_optimizations.txt"]
    if not after:
        raise RuntimeError(f"no cpu_after_optimizations dump for {stem}")
    return main, after[0]


def _write(out: Path, rel: str, text: str, manifest: dict, source: str) -> None:
    path = out / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=9) as f:
        f.write(text)
    manifest[rel] = source
    print(f"{rel}: {len(text):,} chars", flush=True)


def jax_dumps(out: Path, manifest: dict, keep_existing: bool, folder: str = "jax",
              only: frozenset[str] | None = None) -> None:
    import jax

    cases = [(f"zoo_{name}_d{dev}", dev, _ZOO_CODE.format(name=name, devices=dev),
              f"trax_models.make_train_step({name!r}, 'tiny', devices={dev}) compiled on XLA:CPU")
             for name, dev in ZOO]
    cases += [(name, dev, _PROGRAM_CODE.format(body=textwrap.dedent(body)),
               f"scripts/tools/make_hlo_corpus.py PROGRAMS[{name!r}] on {dev} CPU devices")
              for name, (dev, body) in PROGRAMS.items()]
    if only is not None:
        unknown = only - {label for label, *_ in cases}
        if unknown:
            raise SystemExit(f"--cases: unknown {sorted(unknown)}; expected some of "
                             f"{[label for label, *_ in cases]}")
        cases = [c for c in cases if c[0] in only]
    for label, dev, code, what in cases:
        stages = ("before_optimizations", "after_optimizations")
        rels = [f"{folder}/{label}.{stage}.hlo.gz" for stage in stages]
        sources = [f"{what}; XLA_FLAGS=--xla_dump_to, the module's {stage} dump (jax {jax.__version__})"
                   for stage in stages]
        if keep_existing and all((out / rel).exists() for rel in rels):
            manifest.update(zip(rels, sources))
            continue
        with tempfile.TemporaryDirectory() as tmp:
            dumped = _main_pair(_dump(code, dev, Path(tmp)))
            for path, rel, source in zip(dumped, rels, sources):
                _write(out, rel, path.read_text(), manifest, source)


def gpu_modules(out: Path, manifest: dict) -> None:
    wanted = set(GPU_PICK)
    with gzip.open(GPU_DATA, "rt") as f:
        for line in f:
            rec = json.loads(line)
            key = (rec["model"], rec["preset"], rec["variant"])
            if key not in wanted:
                continue
            where = (f"{GPU_DATA} record model={key[0]} preset={key[1]} variant={key[2]} "
                     f"(jax {rec.get('jax')}, {rec.get('device_kind')})")
            _write(out, f"gpu/{'_'.join(key)}.compiled.hlo.gz", rec["compiled_hlo"], manifest,
                   f"{where}: compiled_hlo")
            if rec.get("pre_optimization_hlo"):
                _write(out, f"gpu/{'_'.join(key)}.pre_optimization.hlo.gz", rec["pre_optimization_hlo"],
                       manifest, f"{where}: pre_optimization_hlo")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "tests" / "data" / "hlo_corpus"))
    parser.add_argument("--only", choices=("jax", "gpu"))
    parser.add_argument("--keep-existing", action="store_true",
                        help="do not recompile programs whose two dumps are already there")
    parser.add_argument("--jax-dir", default="jax", help="the corpus folder the jax dumps go to")
    parser.add_argument("--cases", help="comma-separated jax cases to dump (default: all)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    manifest_path = out / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    if args.only in (None, "gpu"):
        gpu_modules(out, manifest)
    if args.only in (None, "jax"):
        only = frozenset(c.strip() for c in args.cases.split(",") if c.strip()) if args.cases else None
        jax_dumps(out, manifest, args.keep_existing, args.jax_dir, only)
    manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
