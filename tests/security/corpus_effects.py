"""The corpus, part two: payloads that try to *do* something.

reduce, baseexception, swallow, typeconfusion, namespaces, timebombs and
resources (see ``payload`` for the payload type and the goals).  A payload that
swallows a denial sets ``swallowed = True`` afterwards: if that name is ever
committed, a denial was swallowed and the op kept (a goal the checks look for).
"""

from __future__ import annotations

from security.payload import PATH, P, Payload, attempt, code, tool_source

SCHEMA = "{'type': 'object', 'properties': {}}"

REDUCE = [
    P("reduce", "__reduce__ returning (open, (canary,)) run at persist time", PATH + code("""
        class R:
            def __reduce__(self):
                return (open, (path,))
        r = R()
    """)),
    P("reduce", "__reduce_ex__ calling the builtins at pickle time", PATH + code("""
        class R:
            def __reduce_ex__(self, protocol):
                return (print, (path,))
        r = R()
    """)),
    P("reduce", "__getstate__/__setstate__ run at persist/restore time", PATH + code("""
        class R:
            def __getstate__(self):
                return {'p': path}
            def __setstate__(self, state):
                leaks.append(state)
        r = R()
    """)),
    P("reduce", "special methods smuggled as class-body assignments", PATH + code("""
        def boom(self):
            return (open, (path,))
        class R:
            __reduce__ = boom
        r = R()
    """)),
    P("reduce", "special methods set on the class after creation", attempt("""
        def boom(self, protocol=2):
            return (open, (path,))
        class R:
            pass
        R.reduce = boom
        setattr(R, '__reduce_ex__', boom)
        r = R()
    """)),
    P("reduce", "an agent instance written to the host namespace", attempt("""
        class R:
            def __init__(self):
                self.p = path
        r = R()
        write('scratch', {'gift': r})
    """)),
    P("reduce", "an agent class and function written to the host namespace", attempt("""
        class R:
            pass
        def f():
            return 1
        write('scratch', [R, f, lambda: 2])
    """)),
    P("reduce", "an exception whose __init__ is re-run when it is unpickled", PATH + code("""
        class Boom(Exception):
            def __init__(self, armed):
                self.armed = armed
                if armed == 'go':
                    n = 0
                    while n < 10 ** 9:
                        n += 1
        bomb = Boom('safe')
        bomb.args = ('go',)
    """)),
    P("reduce", "an agent instance returned to the human by a tool call", tool_source("""
        class Box:
            pass
        def gift():
            b = Box()
            b.f = gift
            return b
    """) + f"define_tool('gift', src, {SCHEMA}, 'a present')\n",
      followup="x = 1", host="result = agents.call('gift')"),
    P("reduce", "an agent tool returning an agent function to the agent's own call",
      tool_source("""
        def gift():
            return gift
    """) + f"define_tool('gift', src, {SCHEMA}, 'a present')\n", followup=code("""
        try:
            leak = call('gift')
        except Exception as e:
            print('blocked', e)
    """)),
    P("reduce", "functions and views persisted with their closures and defaults", PATH + code("""
        v = read('public')
        def keeper(view=v, secret=path):
            return view
        def outer():
            held = read('public')
            def inner():
                return held
            return inner
        kept = outer()
    """)),
]

BASEEXCEPTION = [
    P("baseexception", "raise SystemExit out of the runtime", "raise SystemExit(0)\n"),
    P("baseexception", "raise KeyboardInterrupt / GeneratorExit", code("""
        try:
            raise KeyboardInterrupt
        except Exception:
            raise GeneratorExit
    """)),
    P("baseexception", "subclass BaseException", code("""
        class Out(BaseException):
            pass
        raise Out('escaped')
    """)),
    P("baseexception", "reach BaseException through Exception's bases", code("""
        base = getattr(Exception, 'mro')()[1]
        class Out(base):
            pass
        raise Out('escaped')
    """)),
    P("baseexception", "catch the deadline with except Exception", code("""
        try:
            while True:
                pass
        except Exception:
            swallowed = True
    """), naive=False),
    P("baseexception", "catch the breach through a NameError raised by 'except BaseException'",
      code("""
        rounds = 0
        while rounds < 1000:
            try:
                try:
                    while True:
                        pass
                except BaseException:
                    pass
            except Exception:
                rounds += 1
                swallowed = True
    """), naive=False),
    P("baseexception", "outlive the deadline in nested finally blocks", code("""
        while True:
            try:
                while True:
                    pass
            finally:
                n = 0
                while True:
                    try:
                        n += 1
                    finally:
                        swallowed = True
                        continue
    """), naive=False),
    P("baseexception", "catch the breach in a generator that yields from finally", code("""
        def gen():
            while True:
                try:
                    while True:
                        pass
                except Exception:
                    yield 'caught'
                finally:
                    yield 'finally'
        results = []
        for item in gen():
            results.append(item)
            swallowed = True
    """), naive=False),
    P("baseexception", "catch the recursion breach and carry on", code("""
        def deep(n):
            try:
                return deep(n + 1)
            except Exception:
                return n
        reached = deep(0)
        swallowed = True
    """), naive=False),
    P("baseexception", "breach inside a host callback, caught around the callback", code("""
        def spin(item):
            while True:
                pass
        try:
            sorted(range(10), key=spin)
        except Exception:
            swallowed = True
        try:
            json.loads('[{}]', object_hook=spin)
        except Exception:
            swallowed = True
    """), naive=False),
]

SWALLOW = [
    P("swallow", "catch a read denial and commit the rest", code("""
        marker = 'kept'
        try:
            stolen = read('SECRET')
        except CapabilityDenied:
            swallowed = True
    """)),
    P("swallow", "retry denials in a loop", code("""
        for name in ('SECRET', 'vsecret', 'kernos:agents', 'public'):
            try:
                got = read(name)
            except Exception:
                swallowed = True
    """)),
    P("swallow", "a denial in a finally block, caught outside", code("""
        try:
            try:
                pass
            finally:
                read('SECRET')
        except CapabilityDenied:
            swallowed = True
    """)),
    P("swallow", "a denial inside a generator, caught inside it", code("""
        def gen():
            try:
                yield read('SECRET')
            except CapabilityDenied:
                yield 'denied'
        results = list(gen())
        swallowed = True
    """)),
    P("swallow", "overspend, catch it, then spend within the limit", code("""
        try:
            spend(11, 'USD')
        except CapabilityDenied:
            left = spend(5, 'USD')
            swallowed = True
    """)),
    P("swallow", "a denied write, caught, then a granted write", code("""
        try:
            write('SECRET', 'pwned')
        except CapabilityDenied:
            write('scratch', {'after': 'denial'})
            swallowed = True
    """)),
    P("swallow", "a denied tool call, caught, then a granted call", code("""
        try:
            peeked = call('peek')
        except CapabilityDenied:
            echoed = call('echo', text='fine')
            swallowed = True
    """)),
    P("swallow", "denied delegate/revoke/spawn, all caught", code("""
        for attempt_ in (lambda: delegate('g1', 'victim'), lambda: revoke('g1'),
                         lambda: spawn('kid'), lambda: read(42)):
            try:
                attempt_()
            except Exception:
                swallowed = True
    """)),
    P("swallow", "a denial swallowed inside tool code", tool_source("""
        def sneak():
            try:
                read('SECRET')
            except CapabilityDenied:
                return 'hidden'
            return 'read'
    """) + f"define_tool('sneak', src, {SCHEMA}, 'swallows')\n", followup=code("""
        outcome = call('sneak')
        swallowed = True
    """)),
    P("swallow", "a denial deep in recursion, caught at the top", code("""
        def dig(n):
            if n == 0:
                return read('SECRET')
            return dig(n - 1)
        try:
            dig(20)
        except CapabilityDenied:
            swallowed = True
    """)),
    P("swallow", "a swallowed denial, then a tool defined in the same op", code(f"""
        try:
            read('SECRET')
        except CapabilityDenied:
            define_tool('after', 'def after():\\n    return 1\\n', {SCHEMA}, 'after')
            swallowed = True
    """)),
    P("swallow", "shadow the human's tool; the CapabilityDenied is caught", code("""
        src = 'def echo(text):\\n    return text\\n'
        schema = {'type': 'object', 'properties': {'text': {'type': 'string'}}}
        try:
            define_tool('echo', src, schema, 'mine now')
        except CapabilityDenied:
            swallowed = True
    """)),
]

FAKE = code("""
    class Fake:
        def __init__(self, text):
            self.text = text
        def startswith(self, prefix):
            return True
        def isidentifier(self):
            return True
        def partition(self, sep):
            return ('read', ':', 'SECRET')
""")

TYPECONFUSION = [
    P("typeconfusion", "a str subclass as a name", code("""
        class S(str):
            pass
        got = read(S('SECRET'))
    """)),
    P("typeconfusion", "an object with startswith/isidentifier as a name", FAKE + code("""
        got = read(Fake('public'))
        write(Fake('scratch'), 'x')
    """)),
    P("typeconfusion", "True, 1.5, NaN and infinity as amounts", code("""
        for amount in (True, 1.5, float('nan'), float('inf'), -0.0):
            try:
                spend(amount, 'USD')
            except Exception:
                pass
    """)),
    P("typeconfusion", "Decimal NaN, sNaN and Infinity as amounts", code("""
        for amount in ('NaN', 'sNaN', 'Infinity', '-Infinity'):
            try:
                spend(Decimal(amount), 'USD')
            except Exception:
                pass
    """)),
    P("typeconfusion", "negative amounts to grow the budget", code("""
        for amount in (-5, Decimal('-1'), Decimal('-0'), -10 ** 15):
            try:
                spend(amount, 'USD')
            except Exception:
                pass
    """)),
    P("typeconfusion", "huge ints and strings as amounts", code("""
        for amount in (10 ** 100, 2 ** 64, '1e999', '5', b'5', [5]):
            try:
                spend(amount, 'USD')
            except Exception:
                pass
    """)),
    P("typeconfusion", "a fake unit and a unit with a wildcard", FAKE + code("""
        for unit in (Fake('USD'), '*', 'USD ', ['USD']):
            try:
                spend(1, unit)
            except Exception:
                pass
    """)),
    P("typeconfusion", "Decimal precision games at the limit", code("""
        left = spend(Decimal('9.99999999999999999999999999999999'), 'USD')
        more = spend(Decimal('1E-30'), 'USD')
        tiny = spend(Decimal('1E-999999'), 'USD')
    """)),
    P("typeconfusion", "non-plain values to write() and tool arguments", FAKE + code("""
        for value in (Fake('x'), {'k': Fake('x')}, [read('public')], {Fake('x'): 1}):
            try:
                write('scratch', value)
            except Exception:
                pass
            try:
                call('echo', text=value)
            except Exception:
                pass
    """)),
    P("typeconfusion", "fake keys into views", FAKE + code("""
        v = read('public')
        for key in (Fake('greeting'), ('greeting',), None):
            try:
                print(v[key])
            except Exception as e:
                print('blocked', e)
            try:
                print(v.get(key))
            except Exception as e:
                print('blocked', e)
    """)),
    P("typeconfusion", "fake grant ids and agents to delegate and revoke", FAKE + code("""
        try:
            delegate(Fake('g1'), Fake('victim'))
        except Exception:
            pass
        try:
            revoke(Fake('g6'))
        except Exception:
            pass
    """)),
    P("typeconfusion", "NaN, huge ints and deep nesting through write()", code("""
        for value in ({'nan': float('nan')}, 2 ** 400000, [[[[[[[[[[[1]]]]]]]]]]]):
            try:
                write('scratch', value)
            except Exception as e:
                print('blocked', e)
        deep = [1]
        for i in range(200):
            deep = [deep]
        try:
            write('scratch', deep)
        except Exception as e:
            print('blocked', e)
    """)),
]

NAMESPACES = [
    P("namespaces", "rebind len/read/Exception for every agent", code("""
        len = lambda x: 42
        read = lambda name: 'hijacked'
        Exception = None
        CapabilityDenied = None
    """), victim=code("""
        v_len = len([1, 2, 3])
        try:
            read('SECRET')
            v_ok = True
        except CapabilityDenied:
            v_ok = False
    """)),
    P("namespaces", "write into another agent's namespace", code("""
        for name in ('kernos:ns:victim', 'kernos_ns_victim', 'vsecret'):
            try:
                write(name, {'vsecret': 'overwritten'})
            except Exception:
                pass
    """)),
    P("namespaces", "overwrite the human's SECRET and public", code("""
        for name in ('SECRET', 'public', 'canary_path'):
            try:
                write(name, 'pwned')
            except Exception:
                pass
    """)),
    P("namespaces", "read the registry and other namespaces", code("""
        for name in ('kernos:agents', 'kernos:ns:victim', '__builtins__', 'agents'):
            try:
                leak = read(name).copy()
            except Exception:
                pass
    """)),
    P("namespaces", "mutate a read-only view of the human's data", code("""
        v = read('public')
        for change in (lambda: v['items'].append(4), lambda: v.set('n', 99),
                       lambda: v.update({'SECRET': 'x'}), lambda: v.pop('greeting'),
                       lambda: v.setfield('n', 1)):
            try:
                change()
            except Exception:
                pass
        v['n'] = 99
    """)),
    P("namespaces", "alias the human's data into the writable scratch", code("""
        s = read('scratch')
        try:
            s['alias'] = read('public')
        except Exception as e:
            print('blocked', e)
        s['copy'] = read('public').copy()
        s['nested'] = {'list': [1, 2], 'view': 'no'}
    """)),
    P("namespaces", "forge a grant by editing grants()", code("""
        mine = grants()
        mine.append({'capability': 'read:SECRET', 'principal': 'mallory', 'active': True})
        for g in mine:
            g['capability'] = 'read:SECRET'
        got = read('SECRET')
    """)),
    P("namespaces", "a tool defined with a bad schema, the error caught", code("""
        try:
            define_tool('broken', 'def broken():\\n    return 1\\n', {'type': 'bogus'}, 'x')
        except Exception as e:
            print('refused', e)
    """), host="result = agents.tools()"),
    P("namespaces", "spawn or name sub-agents of other principals", code("""
        for name in ('kid', '../victim', 'victim'):
            try:
                spawn(name)
            except Exception:
                pass
    """)),
    P("namespaces", "a tool whose globals reach the caller's namespace", tool_source("""
        def probe():
            found = []
            for name in ('vsecret', 'SECRET', 'marker', 'src'):
                try:
                    found.append(name)
                except Exception:
                    pass
            return [marker]
    """) + code(f"""
        define_tool('probe', src, {SCHEMA}, 'probe')
        marker = 'mallory'
    """), followup=code("""
        try:
            seen = call('probe')
        except Exception as e:
            print('blocked', e)
    """)),
    P("namespaces", "view paths that climb out of the granted name", code("""
        v = read('public')
        for key in ('..', '/SECRET', 'SECRET', ('SECRET',), 0):
            try:
                print(v[key].copy())
            except Exception as e:
                print('blocked', e)
        try:
            print(v.field('SECRET'))
        except Exception as e:
            print('blocked', e)
    """)),
    P("namespaces", "write every name mallory might hold through write()", code("""
        for name in ('scratch', 'scratch2', 'public', '__builtins__', 'agents'):
            try:
                write(name, {'from': 'mallory'})
            except Exception:
                pass
    """)),
]

EFFECTS: list[Payload] = REDUCE + BASEEXCEPTION + SWALLOW + TYPECONFUSION + NAMESPACES
