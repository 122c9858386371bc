"""doctor's compiler check (labctl/diagnose/compiler.py) on what nodes report of themselves, and
that report read from this machine's own Python by labctl/remote/node_info.py."""

import json
import subprocess
import sys

from labctl import remote
from labctl.diagnose.compiler import HOST_FIX, check_compiler


def node(path="/usr/bin/g++", version="12.2.0", python_h=True):
    return {"compiler": {"cxx": "g++", "path": path, "version": version, "python_h": python_h}}


def test_nodes_that_can_build_inductors_kernels_pass_with_the_compiler_named():
    (finding,) = check_compiler({"node0": node(), "node1": node()})
    assert finding.ok and finding.node == "all" and "g++ 12.2.0" in finding.message


def test_a_node_without_a_compiler_or_headers_is_named_with_what_it_lacks():
    found = check_compiler({"node0": node(), "node1": node(path=None, version=None), "node2": node(python_h=False)})
    assert [(f.node, f.ok, f.warn) for f in found] == [("node1", False, True), ("node2", False, True)]
    assert "no C++ compiler (g++ is not on its PATH)" in found[0].message and "Python.h" not in found[0].message
    assert "no headers for its Python (Python.h)" in found[1].message
    assert "InvalidCxxCompiler" in found[0].message and "labctl build" in found[0].fix


def test_compilers_that_differ_are_a_warning_on_the_odd_one_and_hosts_get_their_own_fix():
    found = check_compiler({"a": node(), "b": node(), "c": node(path=None, version=None, python_h=False)},
                           fix=HOST_FIX)
    assert [f.node for f in found] == ["c"] and "apt-get install g++ python3-dev" in found[0].fix
    (odd,) = check_compiler({"a": node(), "b": node(), "c": node(version="13.1.0")})
    assert odd.node == "c" and not odd.ok and "g++ 12.2.0 on the other nodes" in odd.message


def test_the_node_report_says_what_this_machines_python_has():
    out = subprocess.run([sys.executable, "-c", remote.load("node_info.py")], capture_output=True, text=True,
                         check=True).stdout
    report = json.loads(out.strip().splitlines()[-1])["compiler"]
    assert report["cxx"] == "g++" and isinstance(report["python_h"], bool)
    assert (report["path"] is None) == (report["version"] is None)
