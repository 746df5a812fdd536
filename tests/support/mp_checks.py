"""What every process of a launch that ran ``check_steps`` must agree on (tests of real processes)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def assert_same_plans_and_xla_defaults_numbers(res, plans: Sequence[str], *, devices: int, local: int) -> None:
    """Every worker saw the same program, applied the same plans (none fell back), and after the
    check steps holds what XLA's default holds (f32, 1e-5 relative) under each plan of ``plans``."""
    assert res.ok, res.failures
    first = res.results[0]
    assert first["global_devices"] == devices and first["local_devices"] == local
    assert len({r["fingerprint"] for r in res.results}) == 1
    for rows in zip(*(r["results"] for r in res.results)):
        assert len({(x["plan"], x["plan_digest"]) for x in rows}) == 1, rows
        assert all(x["applied"] for x in rows), [x["fallback_reason"] for x in rows]
    for proc in res.results:
        ref = proc["checks"]["xla_default"]["leaves"]
        for name in plans:
            got = proc["checks"][name]["leaves"]
            assert len(got) == len(ref), name
            for x, y in zip(got, ref):
                np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-7)
