"""The ground floor: what every other room needs and that needs nothing of hasten itself.

Environment variables (``HASTEN_*`` and Accelerate's ``ACCELERATE_*`` aliases), which optional libraries are
installed and their versions, the hardware (devices, NUMA nodes, the CPU allocator's policy), free ports, device
memory helpers, nested-structure walking, lazy re-exports, Accelerate's named constants and the error for
features not built yet. Nothing here imports another hasten package: ``tests/test_code_structure.py`` checks it.
"""
