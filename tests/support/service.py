"""Plan requests for the service's tests: the HLO text of mlp tiny and a request body around it."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def mlp_hlo() -> str:
    import disco
    import trax_models

    step, args = trax_models.make_train_step("mlp", "tiny", devices=4, optimizer="sgd")
    return disco.hlo_text(step, *args)


def plan_body(seed: int = 0, **options) -> dict:
    return {"hlo_text": mlp_hlo(), "cluster": "local", "devices": 4,
            "options": {"budget_s": 1.0, "strategy": "baselines", "seed": seed, **options}}
