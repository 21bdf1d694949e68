"""Tasks as plug-ins: ``task.kind = "package.module:ClassName"`` or an entry point, resolved from
packages written here (outside fedpriv), with one-line errors for every way it can go wrong."""

import os
import sys
import textwrap

import pytest

from fedpriv.config import validate_config
from fedpriv.data.corpus import FederatedCorpus
from fedpriv.data.examples import TextExample
from fedpriv.errors import ConfigError
from fedpriv.tasks.plugins import plugin_class
from fedpriv.tasks.registry import build_task, check_task

TASK = '''
import jax.numpy as jnp
import numpy as np

from fedpriv.tasks.base import Task


class ScaleTask(Task):
    name = "scale"

    def __init__(self, scale: float = 1.0):
        self.scale = scale

    def init_params(self, rng):
        return {"w": jnp.zeros(1)}

    def encode(self, examples):
        return {"n": np.array([len(e.words()) for e in examples], np.float32), "mask": np.ones(len(examples), np.float32)}

    def losses(self, params, batch, rng, train):
        return (params["w"][0] - self.scale * batch["n"]) ** 2

    def metric_sums(self, params, batch):
        return {"loss_sum": (self.losses(params, batch, None, False) * batch["mask"]).sum()}

    def summarize(self, sums):
        return {"loss": sums["loss_sum"]}


class NotATask:
    pass
'''


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """A package ``myplug`` in tmp_path/src (not yet on sys.path); sys.path and PYTHONPATH restored after."""
    pkg = tmp_path / "src" / "myplug"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "tasks.py").write_text(TASK)
    (pkg / "broken.py").write_text("x = 1 / 0\n")
    (pkg / "needs.py").write_text("import torchvision_not_installed_here\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    yield tmp_path / "src"
    for name in [m for m in sys.modules if m == "myplug" or m.startswith("myplug.")]:
        del sys.modules[name]


def config(kind: str, **options):
    return validate_config({"name": "p", "task": {"kind": kind, "options": options}})


def corpus() -> FederatedCorpus:
    return FederatedCorpus.from_dict({"u1": [TextExample("a b c")], "u2": [TextExample("d e")]})


def test_config_takes_import_paths_and_refuses_unknown_kinds():
    assert config("myplug.tasks:ScaleTask").task.kind == "myplug.tasks:ScaleTask"
    assert config("nwp").task.kind == "nwp"
    with pytest.raises(ConfigError, match=r"task.kind: unknown task 'bogus'; expected nwp, ner, mlm or bert-ner, a plug-in 'package.module:ClassName', or the name of a 'fedpriv.tasks' entry point \(none installed\)"):
        config("bogus")
    with pytest.raises(ConfigError, match="unknown task 'my plug:X'"):
        config("my plug:X")


def test_a_plugged_task_is_built_from_the_config(plugin_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(plugin_dir))
    cfg = config("myplug.tasks:ScaleTask", scale=2.0)
    check_task(cfg)
    task = build_task(cfg, corpus())
    assert type(task).__name__ == "ScaleTask" and task.scale == 2.0 and task.name == "scale"
    with pytest.raises(ConfigError, match=r"task.options for 'myplug.tasks:ScaleTask': .*unexpected keyword argument 'size'"):
        build_task(config("myplug.tasks:ScaleTask", size=3), corpus())


@pytest.mark.parametrize(
    "kind, message",
    [
        ("nosuchplug.tasks:ScaleTask", r"no module named 'nosuchplug.tasks' on the Python path or in the working directory .*; put its directory on PYTHONPATH"),
        ("myplug.tasks:Missing", r"module 'myplug.tasks' has no 'Missing'"),
        ("myplug.tasks:NotATask", r"NotATask is not a subclass of fedpriv.tasks.base.Task"),
        ("myplug.broken:Task", r"importing myplug.broken failed: ZeroDivisionError: division by zero"),
        ("myplug.needs:Task", r"importing myplug.needs failed: No module named 'torchvision_not_installed_here'"),
    ],
)
def test_plugin_errors_are_one_line_config_errors(plugin_dir, monkeypatch, kind, message):
    monkeypatch.syspath_prepend(str(plugin_dir))
    with pytest.raises(ConfigError, match=rf"task.kind = '{kind}': {message}"):
        plugin_class(kind)


def test_a_module_in_the_working_directory_is_found_and_exported(plugin_dir, monkeypatch):
    """Run from the directory holding the package (the console script does not put it on sys.path):
    the resolver finds it there and puts that directory on PYTHONPATH for child processes."""
    monkeypatch.chdir(plugin_dir)
    sys.path[:] = [p for p in sys.path if p not in ("", str(plugin_dir))]
    cls = plugin_class("myplug.tasks:ScaleTask")
    assert cls.__name__ == "ScaleTask"
    assert str(plugin_dir.resolve()) in os.environ["PYTHONPATH"].split(os.pathsep)


def test_entry_points_name_tasks(plugin_dir, monkeypatch):
    """An installed package's ``fedpriv.tasks`` entry point (a real dist-info on sys.path)."""
    dist = plugin_dir / "myplug-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: myplug\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(textwrap.dedent("""\
        [fedpriv.tasks]
        scale = myplug.tasks:ScaleTask
        """))
    monkeypatch.syspath_prepend(str(plugin_dir))
    cfg = config("scale", scale=3.0)
    assert build_task(cfg, corpus()).scale == 3.0
    with pytest.raises(ConfigError, match=r"unknown task 'scales'.*\(installed: scale\)"):
        config("scales")
