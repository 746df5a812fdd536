"""``python -m tests.support.mp_faults``: :mod:`disco.runtime.worker` with faults injected on some processes.

The processes named in ``DISCO_TEST_FAULT_PROCESSES`` (comma-separated indices) fail on plans
that ask for it by name, so one job can run faulty and healthy scenarios side by side:

- a plan named ``inject-apply-failure``: its compile raises (``xla_hooks.apply`` falls back locally);
- a plan named ``inject-corrupt-bytes``: the published plan reaches the process cut in half.

``DISCO_TEST_KILL_SERVICE`` (JSON ``{url: [pid, when]}``) makes process 0 kill a real plan service
(the process group ``pid``, SIGKILL) mid-job: ``"accepted"`` right after the service accepted the
plan request (202: a job plans it, the client polls), ``"answered"`` right after process 0 read
the plan (before the trials are measured and reported). ``DISCO_TEST_RELAY`` (JSON ``{"port",
"socket"}``) makes process 0 forward 127.0.0.1:port in its namespace to a Unix socket
(:mod:`tests.support.relay`): the testbed's way to a service on the host.
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


def _kill(pid: int) -> None:
    import signal
    import time

    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    time.sleep(0.2)  # the kernel closes its sockets as it dies


def _kill_services(plan: dict[str, list]) -> None:
    from xla_hooks import hook, service_client

    request, service_plan = service_client.ServiceClient.request, hook.PlannedStep._service_plan

    def killing_request(self, method, path, body, deadline):
        status, data = request(self, method, path, body, deadline)
        pid, when = plan.get(self.base, (None, None))
        if when == "accepted" and method == "POST" and path == "/v1/plans" and status == 202:
            _kill(pid)
        return status, data

    def killing_service_plan(self, *args, **kwargs):
        out = service_plan(self, *args, **kwargs)
        pid, when = plan.get(self.service, (None, None))
        if when == "answered":
            _kill(pid)
        return out

    service_client.ServiceClient.request = killing_request
    hook.PlannedStep._service_plan = killing_service_plan


def main() -> int:
    import json

    process = int(sys.argv[sys.argv.index("--process-id") + 1])
    faulty = {int(p) for p in os.environ.get("DISCO_TEST_FAULT_PROCESSES", "").split(",") if p}
    if process in faulty:
        _inject(process)
    if process == 0 and os.environ.get("DISCO_TEST_KILL_SERVICE"):
        _kill_services(json.loads(os.environ["DISCO_TEST_KILL_SERVICE"]))
    if process == 0 and os.environ.get("DISCO_TEST_RELAY"):
        from tests.support.relay import tcp_to_unix

        relay = json.loads(os.environ["DISCO_TEST_RELAY"])
        tcp_to_unix(relay["port"], relay["socket"])
    from disco.runtime import worker

    return worker.main()


if __name__ == "__main__":
    sys.exit(main())
