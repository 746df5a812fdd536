"""Worker processes on one machine: the launcher, the worker, and the emulated network between them.

- :mod:`disco.runtime.multiprocess`: :func:`~disco.runtime.multiprocess.launch` starts ``P`` worker
  processes (``python -m disco.runtime.worker``) with ``D`` CPU devices each, over 127.0.0.1 or an
  emulated link, and :func:`~disco.runtime.multiprocess.combine` takes the slowest worker's time
  per round;
- :mod:`disco.runtime.worker`: one worker (its tasks: ``bench``, ``calibrate``, ``jit``);
- :mod:`disco.runtime.testbed`: network namespaces joined by a switch that shapes every worker's
  link (rate, delay, jitter, loss).

The measured pipelines reach the workers through runners (:class:`disco.optimizer.ProcessRunner`,
:class:`disco.calibrate.ProcessRunner`).
"""
