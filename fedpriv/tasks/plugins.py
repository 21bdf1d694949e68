"""Tasks as plug-ins: ``task.kind = "package.module:ClassName"``, or the name of an entry point in
the ``fedpriv.tasks`` group (``[project.entry-points."fedpriv.tasks"] mytask = "pkg.mod:MyTask"``).

The class must subclass :class:`fedpriv.tasks.base.Task`; it is built by its
:meth:`~fedpriv.tasks.base.Task.from_config`. A module is imported from ``sys.path`` as usual;
one not found there is looked for in the working directory too (as ``python -m`` would). The
directory a plug-in was imported from is added to ``PYTHONPATH`` in this process's environment, so
the processes it starts (the Flower simulation's Ray actors, which build the task again) import
it the same way. See docs/custom_tasks.md.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

from fedpriv.config import BUILTIN_TASKS, TASK_ENTRY_POINTS, task_entry_points
from fedpriv.errors import ConfigError
from fedpriv.tasks.base import Task


def _import(module: str, kind: str):
    """Import ``module`` (from sys.path, else from the working directory)."""
    def attempt():
        try:
            return importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name is not None and (module == e.name or module.startswith(e.name + ".")):
                return None  # the plug-in itself is missing, not one of its imports
            raise ConfigError(f"task.kind = {kind!r}: importing {module} failed: {e}") from None
        except Exception as e:  # noqa: BLE001 - a plug-in's own import error, in one line
            raise ConfigError(f"task.kind = {kind!r}: importing {module} failed: {type(e).__name__}: {e}") from None

    mod = attempt()
    cwd = os.getcwd()
    if mod is None and cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
        mod = attempt()
    if mod is None:
        raise ConfigError(
            f"task.kind = {kind!r}: no module named {module!r} on the Python path or in the working directory {cwd}; "
            "put its directory on PYTHONPATH or install its package"
        )
    _export_path(mod, module)
    return mod


def _export_path(mod, module: str) -> None:
    """Add the directory ``module`` was imported from to ``PYTHONPATH`` (for child processes)."""
    origin = getattr(mod, "__file__", None)
    if origin is None:
        return
    root = Path(origin).resolve().parent
    for _ in range(module.count(".") + (1 if Path(origin).name == "__init__.py" else 0)):
        root = root.parent
    entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(root) not in entries and not str(root).startswith(sys.prefix):
        os.environ["PYTHONPATH"] = os.pathsep.join([*entries, str(root)])


def import_path(kind: str) -> str:
    """``module:Class`` of a plug-in task kind (an import path itself, or an entry point's value)."""
    if ":" in kind:
        return kind
    installed = task_entry_points()
    if kind not in installed:
        raise ConfigError(f"task.kind = {kind!r}: no {TASK_ENTRY_POINTS!r} entry point of that name is installed")
    return installed[kind]


def plugin_class(kind: str) -> type[Task]:
    """The Task class a plug-in ``task.kind`` names (see the module docstring)."""
    if kind in BUILTIN_TASKS:
        raise ConfigError(f"task.kind = {kind!r} is a built-in task, not a plug-in")
    module, _, attr = import_path(kind).partition(":")
    obj = _import(module.strip(), kind)
    for part in attr.strip().split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"task.kind = {kind!r}: module {module!r} has no {attr!r}") from None
    if not (isinstance(obj, type) and issubclass(obj, Task)):
        raise ConfigError(f"task.kind = {kind!r}: {attr} is not a subclass of fedpriv.tasks.base.Task")
    return obj
