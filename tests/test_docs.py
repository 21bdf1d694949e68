"""The code blocks of the docs run as written."""

import os
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).parent.parent / "docs"


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_custom_task_example_runs(tmp_path, capsys):
    (block,) = python_blocks(DOCS / "custom_tasks.md")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        namespace: dict = {}
        exec(compile(block, "docs/custom_tasks.md", "exec"), namespace)
    finally:
        os.chdir(cwd)
    result = namespace["result"]
    # A unigram model fit to Shakespeare: far better than uniform over 2,004 ids.
    assert result.final_eval["perplexity"] < 600
    assert "held-out perplexity of the unigram task" in capsys.readouterr().out
    assert (tmp_path / "runs" / "unigram-example" / "metrics.jsonl").is_file()
