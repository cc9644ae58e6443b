"""The checkout's root stands for the ``kvfence`` package: ``model/``, ``adapters/`` and
``conformance/`` are installed as ``kvfence.model``, ``kvfence.adapters`` and
``kvfence.conformance`` (``package-dir`` in pyproject.toml; the installed package's own
``__init__`` is ``src/kvfence/__init__.py``).

Nothing imports this file. It is here so that tools which map a module to its folder (an
import graph drawn from the tree, a type checker run without installing) see the three
folders as siblings in one package and follow the relative imports between them
(``from ..model.state import Config`` in ``adapters/``): model <- adapters <- conformance.
"""
