"""disco.ir.opcodes names only opcodes XLA prints (catches "clz"-style drift).

``tests/data/xla_opcodes.json`` holds the opcodes XLA printed for the zoo (pre- and
post-optimisation HLO on XLA:CPU) and for the compiled H100 HLO of the h100_kernels records;
``scripts/tools/collect_xla_opcodes.py`` regenerates it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

from disco.ir import opcodes
from tests.support.paths import DATA as TEST_DATA, REPO

DATA = TEST_DATA / "xla_opcodes.json"

# Opcodes in the vocabulary that the corpus never printed. Each is in XLA's HLO_OPCODE_LIST
# (xla/hlo/ir/hlo_opcode.h, openxla/xla at 0725a3a9904e1c244c69f381bdd32df2fe1dac20), spelt as
# its HloOpcodeString there; checked by hand, name by name. XLA's enum name is in brackets where
# it differs from the printed name in a way that invites drift.
NOT_IN_CORPUS: frozenset[str] = frozenset({
    # collectives and their async halves (the zoo steps use synchronous all-reduces only)
    "all-gather", "all-gather-done", "all-gather-start", "all-reduce-done", "all-reduce-start", "all-to-all",
    "collective-broadcast", "collective-permute", "collective-permute-done", "collective-permute-start",
    "reduce-scatter", "ragged-all-to-all",
    # generic async wrappers (printed as "<op>-start"/"<op>-done" when they wrap a computation)
    "async-done", "async-start", "async-update",
    # elementwise ops the zoo models do not use
    "atan2", "bitcast-convert", "cbrt", "ceil", "clamp", "complex", "cosine", "erf",
    "exponential-minus-one",  # [kExpm1]
    "floor", "imag",
    "log-plus-one",  # [kLog1p]
    "logistic", "minimum",
    "count-leading-zeros",  # [kClz]: not "clz"
    "popcnt",  # [kPopulationCount]
    "real", "reduce-precision", "remainder", "round-nearest-afz", "round-nearest-even",
    "shift-left", "shift-right-arithmetic", "shift-right-logical", "sign",
    "sine",  # [kSin]
    "stochastic-convert", "tan",
    # control flow, barriers, tokens, host transfer
    "after-all", "conditional", "domain", "infeed", "outfeed", "recv", "recv-done", "send", "send-done",
    "opt-barrier",  # [kOptimizationBarrier]: not "optimization-barrier"
    # data movement and shapes
    "copy-done", "copy-start", "dynamic-reshape", "get-dimension-size", "set-dimension-size",
    # others
    "batch-norm-grad", "batch-norm-inference", "batch-norm-training", "cholesky", "fft", "map",
    "partition-id", "replica-id", "rng", "rng-bit-generator", "rng-get-and-update-state", "sort",
    "triangular-solve", "ragged-dot",
})


def vocabulary() -> dict[str, frozenset[str]]:
    """Every opcode set (or opcode-keyed mapping) that disco.ir.opcodes defines, by name."""
    out = {}
    for name, value in vars(opcodes).items():
        if not name.isupper() or name == "OPCODE_INDEX":
            continue
        if isinstance(value, (frozenset, tuple, Mapping)) and all(isinstance(v, str) for v in value):
            out[name] = frozenset(value)
    return out


@pytest.fixture(scope="module")
def corpus() -> dict:
    return json.loads(DATA.read_text())


@pytest.mark.fast
def test_vocabulary_holds_the_sets_it_documents():
    assert {"ELEMENTWISE", "XLA_ELEMENTWISE", "COLLECTIVES", "COLLECTIVE_KIND", "ZERO_COST_OPCODES",
            "FUSIBLE_OPCODES", "XLA_CPU_LOOP_OPCODES", "XLA_CPU_DUPLICATED_OPCODES", "OPCODES",
            "LAYOUT_SENSITIVE_PRODUCERS", "LITERAL_OPERAND_OPCODES", "ALL_REDUCE_OPCODES"} <= set(vocabulary())


@pytest.mark.fast
def test_every_vocabulary_name_is_an_opcode_xla_prints(corpus):
    printed = set(corpus["opcodes"])
    for set_name, names in vocabulary().items():
        unknown = sorted(names - printed - NOT_IN_CORPUS)
        assert not unknown, (f"disco.ir.opcodes.{set_name} names {unknown}, which XLA never printed in "
                             f"{DATA.name} and which are not in NOT_IN_CORPUS (check xla/hlo/ir/hlo_opcode.h)")


@pytest.mark.fast
def test_allow_list_holds_only_names_the_corpus_lacks(corpus):
    # A name the corpus prints needs no allow-list entry: keep the unchecked list as short as it can be.
    assert not NOT_IN_CORPUS & set(corpus["opcodes"])
    used = frozenset().union(*vocabulary().values())
    assert not NOT_IN_CORPUS - used, f"allow-listed but unused: {sorted(NOT_IN_CORPUS - used)}"


@pytest.mark.fast
@pytest.mark.parametrize("wrong", ["clz", "optimization-barrier", "top-k", "exp", "sin", "cos"])
def test_misspellings_are_absent(wrong):
    # "topk" (kTopK) is in the corpus since moe (its pre-optimisation HLO); the vocabulary had "top-k".
    assert all(wrong not in names for names in vocabulary().values())


@pytest.mark.fast
def test_every_opcode_of_a_pre_optimisation_graph_has_a_feature_id(corpus):
    # Plans and features are written against pre-optimisation HLO: none of its opcodes may fall to UNKNOWN.
    missing = sorted(set(corpus["by_source"]["zoo-cpu-pre"]) - set(opcodes.OPCODES))
    assert not missing


@pytest.mark.fast
def test_opcode_ids_are_stable():
    # Saved feature models index embeddings by these ids (the same as before opcodes.py existed).
    assert len(opcodes.OPCODES) == 122 and opcodes.UNKNOWN_OPCODE == 122
    assert [opcodes.opcode_id(op) for op in ("abs", "count-leading-zeros", "opt-barrier", "topk", "xor")] == [
        0, 41, 71, 116, 121]
    assert opcodes.opcode_id("clz") == opcodes.UNKNOWN_OPCODE


@pytest.mark.parametrize("model", ["mlp"])
def test_live_zoo_opcodes_match_the_committed_corpus(model, corpus):
    """Recompiles one tiny zoo model: the committed corpus still says what this jax prints."""
    import sys

    sys.path.insert(0, str(REPO / "scripts" / "tools"))
    try:
        import collect_xla_opcodes
    finally:
        sys.path.pop(0)
    for optimized, source in ((False, "zoo-cpu-pre"), (True, "zoo-cpu-post")):
        live = collect_xla_opcodes.zoo_opcodes([model], optimized=optimized)[model]
        assert live == corpus["by_model"][source][model], (
            f"{source} opcodes of {model} changed; rerun scripts/tools/collect_xla_opcodes.py")
