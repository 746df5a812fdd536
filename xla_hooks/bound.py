"""The measured communication-free bound: the step with every all-reduce replaced by a copy.

Every device then keeps its own gradient: the same kernels run, and the communication (on
in-process virtual devices: the rendezvous of all device threads and the reduction) is gone. Its
measured time is what the step would take if communication were free, so ``xla_default / bound``
is a ceiling on what any gradient bucketing can gain on this machine. An optimistic one: without
the all-reduce in between, XLA may also fuse a gradient's last op into its optimizer update, which
no plan can get. It is a bound, not a plan: it changes the numbers the step computes, and nothing
in disco ever runs it as a training step.

Example::

    fast = xla_hooks.bound.compile_comm_free(step, state, batch)
    jax.block_until_ready(fast(state, batch))   # time it next to the plans
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from disco.ir.hlo_parse import split_top_level

_ALL_REDUCE = re.compile(r"^(?P<head>\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*.+?)\s+all-reduce\((?P<operand>[^()]*)\)(?P<rest>.*)$")
_METADATA = re.compile(r",\s*metadata=\{[^{}]*\}")


_SCALAR = re.compile(r"=\s*[a-z0-9]+\[\]")


def strip_all_reduces(text: str, keep_scalars: bool = False) -> str:
    """HLO text with each single-operand ``all-reduce`` replaced by a ``copy`` of its operand.

    Args:
      text: pre-optimisation HLO text.
      keep_scalars: keep the all-reduces of scalars (a training step's loss): the step then still
        synchronises its devices once but moves no gradient data (the "sync floor").

    Raises:
      ValueError: when the text has no all-reduce to replace, or an all-reduce with several
        operands (a variadic one has a tuple shape that a copy cannot stand in for).
    """
    out, n = [], 0
    for line in text.splitlines():
        m = _ALL_REDUCE.match(line)
        if m is None or (keep_scalars and _SCALAR.search(m["head"])):
            out.append(line)
            continue
        operand = m["operand"].strip()
        if len(split_top_level(operand)) != 1:
            raise ValueError(f"expected single-operand all-reduces, got: {line.strip()[:200]}")
        metadata = _METADATA.search(m["rest"])
        out.append(f"{m['head']} copy({operand}){metadata.group(0) if metadata else ''}")
        n += 1
    if n == 0:
        raise ValueError("the HLO text has no all-reduce to replace: there is no communication to remove")
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def compile_comm_free(step_fn: Callable[..., Any], *args: Any, keep_scalars: bool = False,
                      kwargs: Mapping[str, Any] | None = None) -> Any:
    """Compiles ``step_fn`` for ``args`` with its all-reduces replaced by copies (see the module doc).

    Args:
      step_fn, args: the step and its example arguments, as for ``jax.jit(step_fn).lower(*args)``.
      keep_scalars: keep the all-reduces of scalars (the loss), as :func:`strip_all_reduces`.

    Returns:
      A callable taking and returning what the step does (:class:`disco.ir.step_form.BoundStep`;
      ``.compiled`` is the jax ``Compiled``).

    Raises:
      ValueError: as :func:`strip_all_reduces`.
      PrivateApiError: the private jax API used to compile rewritten HLO changed.
    """
    from disco.ir.extractor import check_step, plan_text
    from xla_hooks import _jax_private

    _jax_private.check_version()
    form = check_step(step_fn)
    lowering = form.lower_stage(args, kwargs)
    text = strip_all_reduces(plan_text(lowering.lowered, debug_info=False), keep_scalars=keep_scalars)
    return form.bind(_jax_private.compile_rewritten(lowering.lowered, text), lowering)
