"""The Flax GNN cost models: features, models, training, evaluation and checkpoints.

Two models:

* the **per-kernel GNN** (``kernel_*`` modules): a kernel's seconds per launch from its fused
  computation's graph, trained per device kind on profiled kernels, plus the measured correction
  of each kernel its training data held (``kernel_corrections``). The shipped
  ``kernel_h100.msgpack`` was trained on ``../shared/data/h100_kernels/per_instruction.jsonl.gz`` and
  ``gnn/data/h100_*`` (the zoo's 11 models and 21 random networks; ``scripts/tools/train_gnn.py --kernels``
  has the command); ``scripts/tools/kernel_lomo.py`` measures it leave-one-model-out
  (docs/results.md, "Cost-model accuracy"), ``scripts/tools/kernel_judge.py`` on records it never saw. ``disco predict-kernels``
  and the cost-model registry (``gnn`` on ``h100``) use it.
* the older **step-level GNN** (``features``, ``model``, ``train``, ``evaluate``, ``cost_model``):
  trained on 1,042 measured plan samples of CPU steps; ``default_checkpoint.msgpack`` and
  ``default_metrics.json`` hold it and its held-out metrics, which are far from the targets. Its
  kernel head is what ``gnn`` names on ``cpu``. The default cost model of ``disco optimize`` and the
  plan service stays the analytic one.
"""
