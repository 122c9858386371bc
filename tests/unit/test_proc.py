"""labctl/core/proc.py's last_json_line: the report a script in a node or on a host prints last, found
among what pip, Python's warnings or a shell printed before it."""

import pytest

from labctl.core.proc import last_json_line


def test_the_last_json_line_is_the_report_whatever_came_before():
    assert last_json_line('WARNING: pip is old\n{"a": 1}\n{"b": 2}\n\n') == {"b": 2}
    assert last_json_line("  {\"packages\": {}}  ") == {"packages": {}}


def test_no_report_is_none_and_a_broken_one_raises():
    assert last_json_line("") is None and last_json_line("Traceback ...\nError: no") is None
    with pytest.raises(ValueError):
        last_json_line('{"cut short')
