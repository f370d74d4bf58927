"""Packages whose public names load on first use (PEP 562), so that a light submodule (a config) can be
imported without the package's heavy ones (torch).

One subtlety makes this more than a module ``__getattr__``: a public function may share its name with the
submodule that defines it (``cadenza.optim.newton_schulz``, ``cadenza.parallel.parallelize``), and the
import system binds every submodule it imports onto its package under that name. The package's class
ignores exactly that binding, so the name stays the function, as it was with eager imports.
"""

from __future__ import annotations

import importlib
import sys
import types


def lazy_package(name: str, home: dict[str, str]) -> None:
    """Make package ``name`` resolve each public name in ``home`` (name -> submodule) when first read."""

    class LazyPackage(types.ModuleType):
        def __getattr__(self, attr: str):
            if attr not in home:
                raise AttributeError(f"module {name!r} has no attribute {attr!r}")
            value = getattr(importlib.import_module(f"{name}.{home[attr]}"), attr)
            types.ModuleType.__setattr__(self, attr, value)
            return value

        def __setattr__(self, attr: str, value) -> None:
            if attr in home and isinstance(value, types.ModuleType) and value.__name__ == f"{name}.{attr}":
                return  # the import system binding the submodule over the function of the same name
            types.ModuleType.__setattr__(self, attr, value)

    sys.modules[name].__class__ = LazyPackage
