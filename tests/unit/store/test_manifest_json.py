"""A manifest spliced from names encoded one by one is byte for byte the whole encoding."""

from __future__ import annotations

import json
import random

import pytest

from kernos.store.encoding import encode_json, manifest_json, manifest_member


def entry(rng: random.Random) -> dict[str, object]:
    return {"group": rng.choice(["a", "b%2F", "ä"]), "hash": f"{rng.getrandbits(64):x}",
            "size": rng.randrange(10**9), "summary": rng.choice(['"quoted"', "é\n", "{}"]),
            "version": rng.randrange(5), "type": "dict"}


@pytest.mark.parametrize("seed", range(20))
def test_spliced_names_encode_as_the_whole_manifest(seed: int) -> None:
    rng = random.Random(seed)
    names = {rng.choice(["x", "y_1", "ñame", "Z", "_", "a" * 40, "日本"]) + str(i): entry(rng)
             for i in range(rng.randrange(0, 30))}
    manifest: dict[str, object] = {
        "format": 1, "op": seed, "principal": "human", "kind": "cell",
        "note": rng.choice([None, '"names":{}', "x"]),
        "changes": {"added": sorted(names)[:2], "changed": [], "deleted": []},
    }
    if seed % 2:
        manifest["facts"] = {"names": {}, "n": seed}  # an inner "names" comes before
    if seed % 3 == 0:
        manifest["sealed_for"] = ['"names":{}']
    whole = encode_json({**manifest, "names": names})
    members = [manifest_member(name, names[name]) for name in sorted(names)]
    spliced = manifest_json(manifest, members)
    assert spliced == whole
    assert json.loads(spliced)["names"] == names
