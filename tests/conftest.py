import os; os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")  # noqa: E702, I001
