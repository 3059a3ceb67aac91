"""lxml documents come back whole: nodes inside their tree, as their own class."""

from __future__ import annotations

import pytest

from kernos.replay.digest import digest

pytest.importorskip("lxml.objectify")

XML = """<?xml version="1.0" encoding="UTF-8"?>
<PERFORMANCE>
  <INDICATOR>
    <NAME>On-Time Performance</NAME>
    <YTD_ACTUAL>96.9</YTD_ACTUAL>
    <MONTHLY_ACTUAL></MONTHLY_ACTUAL>
  </INDICATOR>
  <!-- a comment -->
  <INDICATOR><NAME>Second</NAME><COUNT>7</COUNT></INDICATOR>
</PERFORMANCE>
"""


def test_an_objectify_leaf_keeps_its_class_its_tree_and_its_siblings(notebook, tmp_path):
    (tmp_path / "perf.xml").write_text(XML)
    notebook.run(f"""
        from lxml import objectify
        with open({str(tmp_path / "perf.xml")!r}) as f:
            parsed = objectify.parse(f)
        root = parsed.getroot()
        child = root.INDICATOR[0].getchildren()[-1]
        count = root.INDICATOR[1].COUNT
    """)
    assert type(notebook["child"]).__name__ == "StringElement"
    restored = notebook.restore("parsed", "root", "child", "count")
    assert type(restored["child"]) is type(notebook["child"])
    assert restored["child"].pyval == ""
    assert restored["count"] + 1 == 8  # an IntElement still
    # one document again: the names are nodes of one tree
    assert restored["child"].getparent().getparent() is restored["root"]
    assert restored["parsed"].getroot() is restored["root"]
    for name in ("parsed", "root", "child", "count"):
        assert digest(restored[name]) == digest(notebook[name]), name


def test_etree_nodes_and_comments_keep_their_place(notebook):
    notebook.run("""
        from lxml import etree
        doc = etree.fromstring(b"<a>  <b x='1'>text</b>tail <!--note--><?pi data?></a>")
        b, comment, pi = doc[0], doc[1], doc[2]
        loose = etree.Element("loose")
    """)
    restored = notebook.restore("doc", "b", "comment", "pi", "loose")
    assert restored["b"].getparent() is restored["doc"]
    assert restored["comment"].text == "note" and restored["pi"].target == "pi"
    assert restored["b"].tail == "tail " and restored["doc"].text == "  "  # whitespace kept
    assert restored["loose"].tag == "loose" and restored["loose"].getparent() is None
    restored["b"].set("x", "2")
    assert restored["doc"][0].get("x") == "2"  # an edit through one name shows in the other
    assert notebook["b"].get("x") == "1"
