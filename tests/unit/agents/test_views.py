"""ObjectView: read paths, iteration, copies, public fields, and granted mutators."""

from __future__ import annotations

import pytest

from kernos.errors import OpVetoed

HOST = """
class Box:
    kind = 'a class attribute'

    def __init__(self):
        self.count = 3
        self.items = [1, 2]
        self.inner = {'deep': 'value'}
        self._secret = 'hidden'
        self.callback = len

    def method(self):
        return 1

    @property
    def prop(self):
        return 5

box = Box()
data = {'k': [1, 2, {'z': 3}], 'name': 'ada', 'n': None, (1, 2): 'tuple key'}
items = [10, [20, 30], {'x': 40}]
tags = {'a', 'b'}
"""


@pytest.fixture
def env(env):  # type: ignore[no-untyped-def]
    env.cell(HOST)
    with env.op():
        env.agents.add("alice")
        for name in ("data", "box", "items", "tags"):
            env.agents.grant("alice", f"read:{name}")
    return env


def test_read_paths(env) -> None:  # type: ignore[no-untyped-def]
    out = env.run("alice", """
v = read('data')
print(v['k'][2]['z'], v['name'], v['n'], v[(1, 2)])
print(v['k'], v['k'][0], v.get('missing', 'fallback'), v['k'].get(7))
print(v.path, v['k'].path, v['k'][2].path, v.name, v.type, v['k'].type)
print(len(v), v.length(), 'k' in v, 'zz' in v, bool(v), 2 in v['k'])
""")
    assert out.splitlines() == [
        "3 ada None tuple key",
        "<view of data['k']> 1 fallback None",
        "data data['k'] data['k'][2] data dict list",
        "4 4 True False True True",
    ]


def test_missing_items_raise_plain_errors(env) -> None:  # type: ignore[no-untyped-def]
    out = env.run("alice", """
v = read('data')
for probe in ('missing', 'k'):
    try:
        v[probe][99]
    except KeyError as error:
        print('KeyError', error.args)
    except IndexError:
        print('IndexError')
""")
    assert out.splitlines() == ["KeyError ('missing',)", "IndexError"]


def test_iteration_keys_values_items(env) -> None:  # type: ignore[no-untyped-def]
    out = env.run("alice", """
v = read('data')
print(sorted(str(key) for key in v))
print([key for key in v.keys() if key == 'name'], v['k'].copy())
print([repr(item) for item in v['k']])
print([(key, value) for key, value in v.items() if key in ('name', 'k')])
print([value for value in v.values() if value == 'ada'])
print(sorted(read('tags')), [x for x in read('items')][0])
""")
    assert out.splitlines() == [
        "['(1, 2)', 'k', 'n', 'name']",
        "['name'] [1, 2, {'z': 3}]",
        "['1', '2', \"<view of data['k'][2]>\"]",
        "[('k', <view of data['k']>), ('name', 'ada')]",
        "['ada']",
        "['a', 'b'] 10",
    ]


def test_keys_need_a_dict(env) -> None:  # type: ignore[no-untyped-def]
    out = env.run("alice", """
try:
    read('items').keys()
except TypeError as error:
    print(error.args[0])
try:
    for x in read('box'):
        pass
except TypeError as error:
    print(error.args[0])
""")
    assert out.splitlines() == ["keys() needs a dict, not a list",
                                "a view of a Box is not iterable"]


def test_copy_is_plain_data_the_agent_owns(env) -> None:  # type: ignore[no-untyped-def]
    env.run("alice", """
mine = read('data')['k'].copy()
mine.append('added by the agent')
mine[2]['z'] = 'changed'
""")
    assert env.ns["data"]["k"] == [1, 2, {"z": 3}]
    assert env.ns_of("alice")["mine"] == [1, 2, {"z": "changed"}, "added by the agent"]
    out = env.run("alice", """
try:
    read('box').copy()
except BoundaryError as error:
    print('refused')
""")
    assert out == "refused\n"


def test_a_view_sees_the_current_value(env) -> None:  # type: ignore[no-untyped-def]
    env.run("alice", "v = read('data')['k']")
    env.cell("data['k'] = ['replaced']")
    assert env.run("alice", "print(v.copy())") == "['replaced']\n"


def test_field_reads_public_data_attributes_only(env) -> None:  # type: ignore[no-untyped-def]
    out = env.run("alice", """
b = read('box')
print(b.field('count'), b.field('items'), b.field('items')[1], b.field('inner')['deep'])
print(b.field('items').path)
for name in ('method', 'callback', 'kind', 'prop', 'missing', '_secret', '__dict__',
             '__class__', 5):
    try:
        b.field(name)
        print('LEAKED', name)
    except AttributeError:
        pass
try:
    read('data').field('keys')
    print('LEAKED keys')
except AttributeError:
    pass
print('done')
""")
    assert out.splitlines() == ["3 <view of box.items> 2 value", "box.items", "done"]


def test_view_attributes_are_an_allowlist(env) -> None:  # type: ignore[no-untyped-def]
    out = env.run("alice", """
v = read('data')
for name in ('resolve', 'child', 'agent_attributes', 'reduce', 'mro'):
    try:
        getattr(v, name)
        print('LEAKED', name)
    except AttributeError:
        pass
print(hasattr(v, 'copy'), hasattr(v, '_name'), hasattr(v, '_path'))
""")
    assert out == "True False False\n"


# -- mutators --------------------------------------------------------------------------


MUTATIONS = [
    "v['new'] = 1",
    "v.set('new', 1)",
    "del v['name']",
    "v['k'].append(4)",
    "v['k'].extend([4])",
    "v['k'].pop()",
    "v.pop('name')",
    "v.update({'u': 1})",
]


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_mutators_need_a_write_grant(env, mutation: str) -> None:  # type: ignore[no-untyped-def]
    before = repr(env.ns["data"])
    op = env.image.begin(source="")
    out = env.runtime.run("alice", f"""
v = read('data')
try:
    {mutation}
    print('MUTATED')
except CapabilityDenied as error:
    print('denied', "'write:data'" in error.args[0])
""").output
    assert out == "denied True\n"
    assert repr(env.ns["data"]) == before
    with pytest.raises(OpVetoed):
        op.commit()
    assert repr(env.ns["data"]) == before


def test_setfield_needs_a_write_grant(env) -> None:  # type: ignore[no-untyped-def]
    op = env.image.begin(source="")
    out = env.runtime.run("alice", """
try:
    read('box').setfield('count', 99)
except CapabilityDenied:
    print('denied')
""").output
    assert out == "denied\n"
    assert env.ns["box"].count == 3
    with pytest.raises(OpVetoed):
        op.commit()


def test_mutators_with_a_write_grant(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.grant("alice", "write:data")
        env.agents.grant("alice", "write:box")
    env.run("alice", """
v = read('data')
mine = [1]
v['new'] = mine
mine.append(2)
v.set('also', {'a': 1})
del v['n']
v['k'].append(4)
v['k'].extend([5, 6])
popped = v['k'].pop()
v.update({'u': (1, 2)})
gone = v.pop('name')
v['k'][2]['z'] = 'changed'
b = read('box')
b.setfield('count', 10)
b.field('items').append(3)
for name in ('method', 'missing', '_secret', 'kind'):
    try:
        b.setfield(name, 0)
        print('SET', name)
    except AttributeError:
        pass
""")
    data = env.ns["data"]
    assert data == {"k": [1, 2, {"z": "changed"}, 4, 5], (1, 2): "tuple key", "new": [1],
                    "also": {"a": 1}, "u": (1, 2)}
    assert env.ns_of("alice")["popped"] == 6 and env.ns_of("alice")["gone"] == "ada"
    assert env.ns["box"].count == 10 and env.ns["box"].items == [1, 2, 3]
    assert env.ns["box"]._secret == "hidden" and env.ns["box"].method() == 1
    env.reopen()  # the op committed the host names the views changed
    assert env.ns["data"] == data
    assert env.ns["box"].count == 10 and env.ns["box"].items == [1, 2, 3]


def test_mutators_refuse_what_cannot_cross(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.grant("alice", "write:data")
    out = env.run("alice", """
class Mine:
    pass
v = read('data')
for value in (Mine(), [Mine()], read('items')):
    try:
        v['bad'] = value
        print('STORED')
    except BoundaryError:
        print('refused')
try:
    v['name'].append(1)
except AttributeError:
    print('a str has no view')
""")
    assert out.splitlines() == ["refused", "refused", "refused", "a str has no view"]
    assert "bad" not in env.ns["data"]


def test_views_are_checked_again_on_every_access(env) -> None:  # type: ignore[no-untyped-def]
    env.run("alice", "v = read('data')['k']")
    with env.op():
        env.agents.revoke("alice", "read:data")
    op = env.image.begin(source="")
    out = env.runtime.run("alice", """
try:
    v.copy()
except CapabilityDenied:
    print('denied')
""").output
    assert out == "denied\n"
    with pytest.raises(OpVetoed):
        op.commit()
