"""Let the stand-in kernel packages claim the CPU in transformers' table of devices each package runs on.

transformers >= 5.25 calls a kernel package only for inputs on the devices it lists for it (fla: cuda, xpu, ...)
and its torch code for any other, so on a CPU host an importable stand-in would never be called. A stand-in
represents a host where the package runs on the build device, so it adds "cpu" to its entry when transformers
imports it. HSSTORE_STANDIN_RUNS_ON_CPU=0 leaves the table alone (a host where the package is importable but
does not run on the device).
"""

import os
import sys


def claim_cpu(package: str) -> None:
    if os.environ.get("HSSTORE_STANDIN_RUNS_ON_CPU", "1") != "1":
        return
    hub = sys.modules.get("transformers.integrations.hub_kernels")
    table = getattr(hub, "_PACKAGE_SUPPORTED_DEVICES", None)
    if table is not None and "cpu" not in table.get(package, ("cpu",)):
        table[package] = (*table[package], "cpu")
