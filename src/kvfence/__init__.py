"""kvfence: KV must never be reused across a weight update.

Subpackages: ``kvfence.model`` (the spec), ``kvfence.adapters`` (systems under test),
``kvfence.conformance`` (the stateful checker, CLI and pytest plugin).
"""

__version__ = "0.1.0"
