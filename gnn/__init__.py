"""The Flax GNN cost model: features of a planned graph, the model, training and evaluation.

The shipped checkpoint (``default_checkpoint.msgpack``) was trained on the few real samples that
existed when it was made; ``default_metrics.json`` says how little that is. The default cost
model of ``disco optimize`` and the plan service is the analytic one until a checkpoint trained on
the full collector dataset meets the accuracy targets.
"""
