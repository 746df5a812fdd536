"""The Flax GNN cost model: features of a planned graph, the model, training and evaluation.

The shipped checkpoint (``default_checkpoint.msgpack``) was trained on 223 measured samples of three
tiny zoo models; ``default_metrics.json`` records its held-out and leave-one-model-out metrics,
which are far from the targets. The default cost
model of ``disco optimize`` and the plan service is the analytic one until a checkpoint trained on
the full collector dataset meets the accuracy targets.
"""
