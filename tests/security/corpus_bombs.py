"""The corpus, part three: bombs -- left behind (timebombs) or set off (resources).

A bomb that Kernos does not defuse carries the reason in ``bug`` (see ``payload``); a
bomb a limit stops names it in ``stops``: the breach must be raised inside the interpreter,
never left to the watchdog's kill of the process.
"""

from __future__ import annotations

from security.harness import MALLORY_LIMITS
from security.payload import PATH, P, Payload, code, tool_source

DEADLINE = (f"ran over its {MALLORY_LIMITS['seconds']} s deadline",)
DEPTH = (f"nested calls over {MALLORY_LIMITS['recursion']} deep",)
MEMORY = (f"its {MALLORY_LIMITS['memory_mb']} MB limit",)

SCHEMA = "{'type': 'object', 'properties': {}}"

DAG = code("""
    dag = []
    for level in range(24):
        dag = [dag, dag]
""")

TIMEBOMBS = [
    P("timebombs", "__eq__/__ne__ on an object handed to the host", code("""
        class Bomb:
            def __eq__(self, other):
                return True
            def __ne__(self, other):
                return False
        b = Bomb()
        write('scratch', {'bomb': b})
    """)),
    P("timebombs", "__hash__ on an object used as a key in the host", code("""
        class Bomb:
            def __hash__(self):
                return 0
        write('scratch', {Bomb(): 1})
    """)),
    P("timebombs", "__repr__/__str__ that run when the host shows the value", PATH + code("""
        class Bomb:
            def __repr__(self):
                return open(path).read()
            def __str__(self):
                return open(path).read()
        b = Bomb()
    """)),
    P("timebombs", "__del__ that runs when the namespace is dropped", PATH + code("""
        class Bomb:
            def __del__(self):
                open(target, 'w').write('pwned')
        b = Bomb()
    """)),
    P("timebombs", "__init_subclass__/__set_name__ hooks run at class creation", PATH + code("""
        class Base:
            def __init_subclass__(cls):
                leaks.append(open(path).read())
        class Hook:
            def __set_name__(self, owner, name):
                leaks.append(name)
    """)),
    P("timebombs", "a suspended generator whose finally runs when it is dropped", code("""
        def gen():
            try:
                yield 1
            finally:
                late.append('late')
        late = []
        bomb = gen()
        next(bomb)
    """), followup="bomb = None\n", naive=False),
    P("timebombs", "a suspended generator that catches its GeneratorExit (via NameError)",
      code("""
        def gen():
            try:
                try:
                    yield 1
                except BaseException:
                    pass
            except Exception:
                n = 0
                while n < 10 ** 6:
                    n += 1
                late.append(n)
        late = []
        bomb = gen()
        next(bomb)
    """), followup="bomb = None\n", naive=False),
    P("timebombs", "the same, hidden in an agent instance in a reference cycle", code("""
        class Holder:
            pass
        def gen():
            try:
                try:
                    yield 1
                except BaseException:
                    pass
            except Exception:
                late.append(whoami())
        late = []
        h = Holder()
        h.g = gen()
        next(h.g)
        h.me = h
    """), followup="h = None\n", naive=False),
    P("timebombs", "a generator handed to the human by a tool", tool_source("""
        def gift():
            def inner():
                try:
                    yield 1
                except Exception:
                    print('late')
            return inner()
    """) + f"define_tool('gift', src, {SCHEMA}, 'a present')\n",
      followup="x = 1\n", host="result = agents.call('gift')\nnext(result)\nresult = None"),
    P("timebombs", "a generator and a function written to the host", code("""
        def gen():
            yield 1
        for value in (gen(), gen, map(len, ['a'])):
            try:
                write('scratch', value)
            except Exception as e:
                print('blocked', e)
    """)),
    P("timebombs", "lazy map/filter objects left to run agent code later", PATH + code("""
        def steal(item):
            leaks.append(item)
            return item
        lazy = map(steal, [1, 2, 3])
        lazier = filter(steal, [1, 2, 3])
        zipped = zip(lazy, lazier)
    """)),
    P("timebombs", "a shared-list DAG whose repr is exponential, left in the namespace",
      DAG, followup="dag = None\n", naive=False),
    P("timebombs", "an exception carrying a shared-list DAG raised to the host",
      DAG + "raise ValueError(dag)\n", naive=False),
]

RESOURCES = [
    P("resources", "while True: pass", "while True:\n    pass\n", naive=False,
      stops=DEADLINE),
    P("resources", "unbounded recursion", code("""
        def deep(n):
            return deep(n + 1)
        deep(0)
    """), naive=False, stops=DEPTH),
    P("resources", "'x' * 10**10", "s = 'x' * 10 ** 10\n", naive=False),
    P("resources", "10**10**10", "n = 10 ** 10 ** 10\n", naive=False),
    P("resources", "[0] * 10**10", "l = [0] * 10 ** 10\n", naive=False),
    P("resources", "1 << 10**10 and pow(2, 10**10)", code("""
        n = 1 << 10 ** 10
        m = pow(2, 10 ** 10)
    """), naive=False),
    P("resources", "in-place growth: s *= and l += in a loop", code("""
        s = 'x' * 10 ** 6
        while True:
            s *= 2
        l = [0] * 10 ** 6
        while True:
            l += l
    """), naive=False),
    P("resources", "a huge list built in a python loop", code("""
        l = []
        while True:
            l.append('x' * 1000)
    """), naive=False, stops=MEMORY + DEADLINE),  # 64 MB in 1 KB lines: 1 s under load
    P("resources", "try/finally loops that try to outlive the deadline", code("""
        n = 0
        while True:
            try:
                while True:
                    n += 1
            finally:
                while True:
                    try:
                        n += 1
                    finally:
                        n -= 1
    """), naive=False),
    P("resources", "recursion through a host callback (sorted key=)", code("""
        def key(item):
            return sorted([item], key=key)
        key(1)
    """), naive=False, stops=DEPTH),
    P("resources", "an output flood", "while True:\n    print('x' * 10 ** 6)\n", naive=False,
      stops=DEADLINE),
    P("resources", "10 MB per line, between two memory samples", code("""
        hoard = []
        for i in range(200):
            hoard.append('x' * 10 ** 7)
    """), naive=False, stops=MEMORY),
    P("resources", "string doubling with + (not a guarded operator)", code("""
        s = 'x' * 10 ** 7
        for i in range(9):
            s = s + s
    """), naive=False, stops=MEMORY),
    P("resources", "str methods that allocate what they are told (ljust)",
      "s = 'x'.ljust(10 ** 9)\n", naive=False, stops=MEMORY),
    P("resources", "int.to_bytes and format widths allocate without a check", code("""
        b = (1).to_bytes(10 ** 9, 'big')
        s = f'{1:>{10 ** 9}}'
    """), naive=False, stops=MEMORY),
    P("resources", "catch a recursion breach, then run and allocate untraced", code("""
        def deep(n):
            return deep(n + 1)
        try:
            try:
                deep(0)
            except BaseException:
                pass
        except Exception:
            hoard = []
            while True:
                hoard.append('x' * 10 ** 6)
    """), naive=False),
    P("resources", "drop the trace function: a RecursionError raised inside it, then a loop",
      code("""
        class Leaf:
            pass
        def hook(leaf):
            return 0
        nested = Leaf()
        depth = 0
        while depth < 5000:
            nested = [nested]
            depth += 1
            try:
                json.dumps(nested, default=hook)
            except RuntimeError:
                break
        while True:
            pass
    """), naive=False, stops=DEADLINE),
]

BOMBS: list[Payload] = TIMEBOMBS + RESOURCES
