"""`fabricmon topology import` and the topology loader against hostile inputs (issue 35 items 5, 10, 12).

- A NodeDescription holding U+202E became a node name check-config accepted: the importer and the
  version-2 loader now hold every node, leaf, spine, device and interface name to the node name rule
  (textcheck.node_name_problem) that generated and version-1 topologies already met.
- A deeply nested lldpctl JSON ended the import with a traceback: one error line, exit 2.
- A long line in an ibnetdiscover file made its prompt patterns backtrack quadratically: lines are
  capped, the patterns linear.

Inputs are the real ibnetdiscover output of ibsim's fat tree and lldpd's captures
(tests/fixtures/topology_import/README.md), changed where the attack is."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from fabricmon.cli import main
from support.paths import FIXTURES

IBSIM = FIXTURES / "topology_import" / "ibsim"
LLDP = FIXTURES / "topology_import" / "lldp"
RLO = "\u202e"


def test_an_imported_bidi_name_is_skipped_and_a_bidi_topology_refused(tmp_path, capsys):
    fabric = (IBSIM / "fat-tree.out").read_text()
    assert '"node04 mlx5_0"' in fabric and "MF0;leaf-1:MQM8700" in fabric
    src = tmp_path / "fabric.out"
    src.write_text(fabric.replace('"node04 mlx5_', f'"node04{RLO} mlx5_').replace("MF0;leaf-1:", f"MF0;leaf{RLO}-1:"))
    out = tmp_path / "t.yaml"
    assert main(["topology", "import", "--ibnetdiscover", str(src), "-o", str(out)]) == 0
    text = out.read_text()
    assert RLO not in text and "\\u202E" not in text.upper(), text
    doc = yaml.safe_load(text)
    assert "node04" not in {n["name"] for n in doc["nodes"]} and len(doc["nodes"]) == 7
    assert "switch-" in " ".join(doc["leaves"])  # the switch keeps its place under its GUID's name
    capsys.readouterr()
    # a version-2 file written by hand (or by an older import) with such a name: check-config refuses it
    doc["nodes"][0]["name"] = f"node00{RLO}"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc, allow_unicode=True))
    assert main(["check-config", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "nodes[0].name: holds the invisible control U+202E" in err, err
    doc["nodes"][0]["name"] = "node00"
    doc["nodes"][0]["nics"][0]["leaf"] = f"leaf{RLO}"
    bad.write_text(yaml.safe_dump(doc, allow_unicode=True))
    assert main(["check-config", str(bad)]) == 2
    assert "nics[0].leaf: holds the invisible control U+202E" in capsys.readouterr().err


def test_a_deeply_nested_lldp_file_is_one_error_line(tmp_path, capsys):
    d = tmp_path / "lldp"
    d.mkdir()
    real = sorted(LLDP.glob("*.json"))[0]
    (d / real.name).write_text(real.read_text())
    (d / "node-x.json").write_text('{"lldp": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert main(["topology", "import", "--lldp", str(d), "-o", str(tmp_path / "t.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "node-x.json: JSON nested too deep" in err[0], err


@pytest.mark.parametrize("length", [1 << 20, 4000])
def test_a_long_line_in_an_ibnetdiscover_file_ends_at_once(tmp_path, length):
    # ':' repeated is what the prompt pattern \\S*[@:]\\S*... backtracked over quadratically: 1 MiB of it held
    # the import for hours at 64bf867; under the cap (4000) the patterns are linear.  In a child process
    # with a timeout, so a regression fails instead of holding CI.
    src = tmp_path / "fabric.out"
    src.write_text((IBSIM / "fat-tree.out").read_text() + "\n" + ":" * length + "\n")
    try:
        res = subprocess.run([sys.executable, "-m", "fabricmon", "topology", "import", "--ibnetdiscover", str(src),
                              "-o", str(tmp_path / "t.yaml")], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"importing a {length}-character line took over 30 s") from None
    err = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(err) == 1 and f"{src}: line " in err[0], res.stderr
    assert ("at most 4096" in err[0]) == (length > 4096), err[0]
