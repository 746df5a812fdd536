"""What the plan service accepts: the documented limits on a request, in one place.

The schemas (:mod:`service.schemas`), the HLO check (:mod:`service.hlo_check`) and the
cluster check (:mod:`service.inputs`) read these; docs/guides/plan-service.md and the OpenAPI
document quote them. A request past a limit is answered 400 naming the field (413 for a body
larger than ``MAX_CONTENT_LENGTH``), before any job is created.

The graph limits are about 3x the largest graph disco plans today (transformer, paper
preset: 15,297 nodes); the per-node limits are far above any real accelerator (an
exaflop and a pebibyte per instruction) and exist so that no number overflows or turns
infinite inside the simulator.
"""

from __future__ import annotations

MAX_CONTENT_LENGTH = 32 * 1024 * 1024  # bytes of a request body (default of the app config)
MAX_HLO_CHARS = 16 * 1024 * 1024       # characters of hlo_text
MAX_HLO_LINES = 200_000                # lines of hlo_text, counted before parsing (rejected early)
MAX_GRAPH_NODES = 50_000               # instructions of the step graph (HLO or graph JSON)
MAX_GRAPH_EDGES = 500_000              # data-dependency edges of the step graph
MAX_OPERANDS = 65_536                  # operands of one instruction
MAX_TEXT = 65_536                      # characters of one string field of a graph node (shape, names)
MAX_DIM = 2**40                        # one dimension of an array shape
MAX_ELEMENTS = 2**48                   # elements of one instruction's output
MAX_BYTES = 2**50                      # bytes of one instruction's output (1 PiB)
MAX_FLOPS = 1e18                       # floating-point operations of one instruction
MAX_CLUSTER_DEVICES = 65_536           # nodes * devices_per_node of a cluster
MIN_BANDWIDTH = 1e3                    # bytes/s of a cluster link (1 kB/s)
MAX_BANDWIDTH = 1e15                   # bytes/s of a cluster link (1 PB/s)
MAX_LATENCY_S = 10.0                   # seconds per message of a cluster link, and operand_latency
MIN_COMPUTE_SPEED = 1e-6               # a cluster's compute_speed (relative to the profiled device)
MAX_COMPUTE_SPEED = 1e6
MAX_CLUSTER_YAML = 65_536              # characters of a cluster's YAML
MAX_PROFILES = 10_000                  # samples per POST /v1/profiles
MAX_CANDIDATES = 8                     # plans a job may measure (POST /v1/plans candidates; a job stores this many)
MAX_TRIAL_SAMPLES = 10_000             # step times of one candidate in POST /v1/trials (all processes)
PARSE_TIMEOUT_S = 30.0                 # seconds the HLO check may take (app config PARSE_TIMEOUT_S)
PARSE_MEMORY_BYTES = 4 * 1024**3       # address space of the HLO check's process


def describe() -> dict[str, float | int]:
    """The limits as a JSON-able mapping (served in the OpenAPI document's ``x-limits``)."""
    return {k.lower(): v for k, v in globals().items() if k.isupper()}
