"""The source fingerprint: a digest of what a search's results depend on (the matrices'
report and the battery's cache are keyed by it)."""

from __future__ import annotations

from pathlib import Path


def source_fingerprint() -> str:
    """A digest of what a matrix run's results depend on: every Python file of the kvfence
    package (the model, the adapters, the checker) and the versions of Python and
    Hypothesis (whose draws the ci profile's derandomized searches are). Two runs with the
    same fingerprint and profile compute the same matrices."""
    import hashlib
    import platform

    import hypothesis

    from .. import adapters, conformance, model

    digest = hashlib.sha256(f"{platform.python_version()} {hypothesis.__version__}".encode())
    for package in (model, adapters, conformance):
        root = Path(package.__file__).parent
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root.parent)).encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()


__all__ = ["source_fingerprint"]
