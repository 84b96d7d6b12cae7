"""NVML source: GPUs, their NVLinks, XID events, ECC, PCIe replays and throttle reasons.

Split by what changes each part:

* ``backend`` -- the ``NvmlBackend`` Protocol, its plain reading dataclasses and
  backend-neutral errors, so the source cannot tell a real GPU from the fake
  file, and a fake lost GPU fails exactly like a real one.
* ``backend_pynvml`` -- ``PynvmlBackend``: libnvidia-ml through ``nvidia-ml-py``
  (``import pynvml``), field ids and NVML return codes.
* ``backend_fake`` -- ``FakeNvmlBackend``: the fake NVML file of DESIGN.md
  "Contract" (JSON or YAML) that the fixture tool and the simulator write.
* ``worker`` -- the one private daemon thread every NVML call runs on: NVML
  calls can hang (a GPU falling off the bus), and a hung call on that thread
  neither blocks the poller's pool, nor ``close()``, nor interpreter exit, and is
  never called a second time while it is still stuck.
* ``source`` -- ``NvmlSource`` turns ``GpuReading``s into ``Reading``s, with
  deadlines on the worker's calls; ``make_nvml_source`` builds it from config.
"""
