"""Which workspace a gateway kernel opens: ``$KERNOS_WORKSPACE_ROOT/<name>``.

The operator sets the root in the kernelspec; a client sends only a name
(``KERNEL_WORKSPACE``, which Enterprise Gateway forwards), checked against an
allowlist so that no client can choose a path outside the root.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernos.errors import WorkspaceError
from kernos.store.workspace import check_workspace_name, default_workspace


def test_the_root_and_the_clients_name_choose_the_workspace(tmp_path: Path) -> None:
    root = str(tmp_path / "roots")
    assert default_workspace({"KERNOS_WORKSPACE_ROOT": root, "KERNEL_WORKSPACE": "team-a.1"}) \
        == tmp_path / "roots" / "team-a.1"
    # The root confines even a kernel whose environment names a path the old way.
    assert default_workspace({"KERNOS_WORKSPACE_ROOT": root, "KERNEL_WORKSPACE": "b_2",
                              "KERNOS_WORKSPACE": "/elsewhere"}) == tmp_path / "roots" / "b_2"
    assert default_workspace({"KERNOS_WORKSPACE_ROOT": root}) == tmp_path / "roots" / "default"
    # Without a root, KERNEL_WORKSPACE means nothing: a client cannot steer a local kernel.
    assert default_workspace({"KERNOS_WORKSPACE": str(tmp_path / "w"),
                              "KERNEL_WORKSPACE": "x"}) == tmp_path / "w"


@pytest.mark.parametrize("name", ["", "..", ".", "../etc", "a/b", "/abs", ".hidden", "-x",
                                  "a\\b", "a b", "a\nb", "é", "x" * 65, "a\x00b"])
def test_a_name_that_is_not_on_the_allowlist_is_refused_clearly(name: str,
                                                                 tmp_path: Path) -> None:
    with pytest.raises(WorkspaceError) as refused:
        default_workspace({"KERNOS_WORKSPACE_ROOT": str(tmp_path), "KERNEL_WORKSPACE": name})
    assert repr(name) in str(refused.value)
    assert "no '/', no '..'" in str(refused.value)
    assert refused.value.path == name
    assert list(tmp_path.iterdir()) == []  # nothing was created


@pytest.mark.parametrize("name", ["a", "A9", "0", "w.x_y-z", "x" * 64, "a..b"])
def test_names_on_the_allowlist_pass_unchanged(name: str) -> None:
    assert check_workspace_name(name) == name
