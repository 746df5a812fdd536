"""``python -m tests.support.mp_faults``: :mod:`disco.runtime.worker` with faults injected on some processes.

The processes named in ``DISCO_TEST_FAULT_PROCESSES`` (comma-separated indices) fail on plans
that ask for it by name, so one job can run faulty and healthy scenarios side by side:

- a plan named ``inject-apply-failure``: its compile raises (``xla_hooks.apply`` falls back locally);
- a plan named ``inject-corrupt-bytes``: the published plan reaches the process cut in half.
"""

from __future__ import annotations

import os
import sys

APPLY_FAILURE = "inject-apply-failure"
CORRUPT_BYTES = "inject-corrupt-bytes"


def _inject(process: int) -> None:
    from xla_hooks import agreement, apply_plan

    compile_plan = apply_plan.compile_plan

    def failing_compile(plan, *args, **kwargs):
        if plan.name == APPLY_FAILURE:
            raise RuntimeError(f"injected compile failure on process {process}")
        return compile_plan(plan, *args, **kwargs)

    get = agreement.JaxKeyValue.get

    def corrupting_get(self, key, timeout_s):
        raw = get(self, key, timeout_s)
        return raw[: len(raw) // 2] if CORRUPT_BYTES.encode() in raw else raw

    apply_plan.compile_plan = failing_compile
    agreement.JaxKeyValue.get = corrupting_get


def main() -> int:
    process = int(sys.argv[sys.argv.index("--process-id") + 1])
    faulty = {int(p) for p in os.environ.get("DISCO_TEST_FAULT_PROCESSES", "").split(",") if p}
    if process in faulty:
        _inject(process)
    from disco.runtime import worker

    return worker.main()


if __name__ == "__main__":
    sys.exit(main())
