"""The corpus, part one: payloads that try to *reach* a host object or a secret.

frames, format, dunder and imports (see ``payload`` for the type and the goals).
"""

from __future__ import annotations

from security.payload import PATH, P, Payload, attempt, code

FRAMES = [
    P("frames", "a generator's frame, by attribute, then its globals' builtins",
      attempt("""
        def gen():
            yield 1
        g = gen()
        frame = g.gi_frame
        leak = frame
        use(frame.f_back.f_globals['__builtins__'])
      """)),
    P("frames", "gi_frame through getattr with a computed name", attempt("""
        def gen():
            yield 1
        g = gen()
        next(g)
        frame = getattr(g, 'gi_' + 'frame')
        leak = frame
        use(getattr(getattr(frame, 'f_' + 'globals'), 'get')('__builtins__'))
      """)),
    P("frames", "the running generator's own frame, and its caller's", attempt("""
        def gen():
            frame = getattr(me, 'gi_' + 'frame')
            yield getattr(frame, 'f_' + 'back')
        me = gen()
        caller = next(me)
        leak = caller
        use(getattr(caller, 'f_' + 'builtins'))
      """)),
    P("frames", "a traceback frame from a caught exception", attempt("""
        try:
            1 / 0
        except ZeroDivisionError as e:
            caught = e
        tb = getattr(caught, '__trace' + 'back__')
        frame = getattr(tb, 'tb_' + 'frame')
        leak = frame
        use(getattr(frame, 'f_' + 'builtins'))
      """)),
    P("frames", "the frames of a host error raised inside the runtime", attempt("""
        try:
            call('echo', text=1)
        except Exception as e:
            kept = e
            print(e.args)
        tb = getattr(kept, 'with_' + 'traceback')
        leak = tb
        use(getattr(getattr(getattr(kept, '__trace' + 'back__'), 'tb_frame'), 'f_globals'))
      """)),
    P("frames", "tb_next walk from an exception raised through a host callback",
      attempt("""
        def key(item):
            raise ValueError(item)
        try:
            sorted([3, 1, 2], key=key)
        except ValueError as e:
            kept = e
        walk = getattr(kept, 'with_traceback')(None)
        leak = walk
        use(getattr(getattr(walk, 'tb_next'), 'tb_frame'))
      """)),
    P("frames", "exception context/cause chains back to a host exception", attempt("""
        try:
            try:
                read('public')['missing']
            except KeyError:
                raise ValueError('wrapped')
        except ValueError as e:
            kept = e
        inner = getattr(kept, '__con' + 'text__')
        leak = inner
        use(getattr(getattr(inner, '__traceback__'), 'tb_frame'))
      """)),
    P("frames", "e.args of runtime errors carry host objects", attempt("""
        found = []
        for attempt_ in (lambda: read('public')['nope'], lambda: call('nope'),
                         lambda: read('public').field('x'), lambda: json.loads('{'),
                         lambda: re.compile('('), lambda: Decimal('x'), lambda: int('x')):
            try:
                attempt_()
            except Exception as e:
                leaks.append(e)
                try:
                    found.append(e.args)
                except AttributeError:
                    found.append(repr(e))
        leak = found
        print(found)
      """)),
    P("frames", "a generator's code object and gi_yieldfrom", attempt("""
        def inner():
            yield 1
        def outer():
            yield from inner()
        g = outer()
        next(g)
        leak = [getattr(g, 'gi_yieldfrom'), getattr(g, 'gi_code')]
      """)),
    P("frames", "hasattr probing for frame attributes on everything in reach", attempt("""
        def gen():
            yield 1
        names = ['gi_frame', 'gi_code', 'f_back', 'f_globals', 'tb_frame', 'cr_frame',
                 'func_globals', 'im_func', 'ag_frame', 'f_builtins', 'f_locals']
        things = [gen(), gen, lambda: 0, read('public'), ValueError('x'), json.loads]
        found = [n for n in names for t in things if hasattr(t, n)]
        leak = [getattr(t, n) for n in found for t in things if hasattr(t, n)]
        print('found', found)
      """)),
]

FORMAT = [
    P("format", "str.format walking to __globals__", attempt("""
        def f():
            return 1
        leak = '{0.__globals__[__builtins__]}'.format(f)
        print(leak)
      """)),
    P("format", "format_map with a view", attempt("""
        leak = '{v.__class__.__init__.__globals__}'.format_map({'v': read('public')})
        print(leak)
      """)),
    P("format", "str.format reached through getattr(str, 'format')", attempt("""
        fmt = getattr(str, 'format')
        leak = fmt('{0.__class__.__mro__[1].__subclasses__}', 'x')
        print(leak)
      """)),
    P("format", "str.format reached through getattr on an instance", attempt("""
        fmt = getattr('{0.__init__.__globals__[SECRET]}', 'for' + 'mat')
        print(fmt(read))
      """)),
    P("format", "the format builtin and string.Formatter", attempt("""
        leak = format(read('public'), '')
        formatter = string.Formatter()
        print(formatter.format('{0.__globals__}', read))
      """)),
    P("format", "f-string conversions and nested format specs on host objects", attempt("""
        v = read('public')
        leak = [f'{v!r}', f'{v!s}', f'{v!a}', f'{read!r}', f'{json!r}', f'{v=}']
        print(leak)
        leak.append(f'{v:{"x"}}')
      """)),
    P("format", "%-formatting with a view as the mapping", attempt("""
        v = read('public')
        leak = '%(SECRET)s %(greeting)s' % v
        print(leak)
      """)),
    P("format", "%-formatting the canary path into the file's content", attempt("""
        print('%s %r %a' % (path, read('canary_path'), read('public')))
        leak = '%(greeting)s' % {'greeting': read('SECRET')}
        print(leak)
      """)),
    P("format", "datetime/Decimal __format__ specs as an attribute walk", attempt("""
        d = datetime.datetime(2020, 1, 2)
        spec = '%Y {0.__class__} {0.__init__.__globals__}'
        leak = [f'{d:{spec}}', d.strftime(spec), f'{d!r:>20}']
        print(leak)
        leak.append(f'{Decimal(1):{spec}}')
        print(leak)
        getattr(d, '__format__')('{0.__class__}')
      """)),
    P("format", "json.dumps default= and re templates as formatters", attempt("""
        leak = [json.dumps(read('public'), default=repr), re.sub('(x)', r'\\g<1>', 'xx'),
                json.dumps({'f': read}, default=lambda o: repr(o))]
        print(leak)
        leak.append(re.compile('a').sub(lambda m: getattr(m, 're'), 'a'))
      """)),
]

DUNDER = [
    P("dunder", "object.__subclasses__() via ().__class__.__base__", attempt("""
        for cls in ().__class__.__base__.__subclasses__():
            if cls.__name__ == 'catch_warnings':
                use(cls()._module.__builtins__)
      """)),
    P("dunder", "__subclasses__ via getattr with computed names", attempt("""
        u = '_' * 2
        base = getattr(getattr((), u + 'class' + u), u + 'base' + u)
        leak = getattr(base, u + 'subclasses' + u)()
      """)),
    P("dunder", "a function's __globals__ and __builtins__", attempt("""
        def f():
            return 1
        u = '_' * 2
        g = getattr(f, u + 'globals' + u)
        leak = g
        use(g[u + 'builtins' + u])
      """)),
    P("dunder", "the agent builtins' own functions' globals (read, json.loads)", attempt("""
        u = '_' * 2
        leak = [getattr(read, u + 'globals' + u), getattr(json.loads, u + 'globals' + u),
                getattr(len, u + 'self' + u)]
        use(leak[0][u + 'builtins' + u])
      """)),
    P("dunder", "vars/dir/type/globals/locals/object/open if present", attempt("""
        for getter in (lambda: vars, lambda: dir, lambda: type, lambda: globals,
                       lambda: locals, lambda: object, lambda: super, lambda: open,
                       lambda: memoryview, lambda: classmethod, lambda: property):
            try:
                leaks.append(getter())
            except Exception:
                print('missing')
        use(vars(json)['__builtins__'])
      """)),
    P("dunder", "views expose their host object (read('public'))", attempt("""
        v = read('public')
        leak = [getattr(v, '_name'), getattr(v, '_path'), getattr(v, '_resolve')]
        print(leak)
        leak.append(v.field('__dict__'))
      """)),
    P("dunder", "view attributes that look like data: type, get, copy, field", attempt("""
        v = read('public')
        leak = [v.type, v.path, v.name, v.get('items'), v.copy(), v.length()]
        print(leak)
        leak.append(v.get('items').field('__class__'))
      """)),
    P("dunder", "module views: datetime.datetime, re.compile(...), json internals",
      attempt("""
        found = []
        for obj, name in ((datetime.datetime, 'now'), (datetime.datetime, 'max'),
                          (datetime.timedelta, 'max'), (re.compile('a'), 'scanner'),
                          (json.loads, 'globals'), (datetime.date, 'today'),
                          (datetime.datetime(2020, 1, 1), 'tzinfo'), (re, 'sre_compile')):
            try:
                found.append(getattr(obj, name))
            except AttributeError as e:
                print('no', name)
        leak = found
      """)),
    P("dunder", "Decimal class and instance internals", attempt("""
        found = []
        for name in ('from_float', 'as_integer_ratio', 'adjusted', 'to_eng_string',
                     'number_class', 'radix', 'conjugate', 'to_integral'):
            try:
                found.append(getattr(Decimal, name))
            except AttributeError:
                print('no class', name)
        t = Decimal('1.5').as_tuple()
        found.append(t)
        found.append(getattr(t, '_asdict'))
        leak = found
      """)),
    P("dunder", "agent classes: mro, base classes, object via an agent class", attempt("""
        class A:
            pass
        class E(Exception):
            pass
        found = []
        for obj, name in ((A, 'mro'), (A(), 'kernos_owner'), (E, 'mro'),
                          (E('x'), 'with_traceback'), (E('x'), 'add_note'),
                          (A, 'register'), (E, 'args')):
            try:
                found.append(getattr(obj, name))
            except AttributeError:
                print('no', name)
        leak = found
      """)),
    P("dunder", "bound methods' self/func and builtin methods' module", attempt("""
        m = 'abc'.upper
        found = []
        for name in ('self', 'func', 'im_self', 'im_func', 'module', 'qualname'):
            try:
                found.append(getattr(m, name))
                found.append(getattr(len, name))
                found.append(getattr(read, name))
            except AttributeError:
                pass
        leak = found
        print(len(found))
      """)),
    P("dunder", "isinstance/callable/exceptions as a route to type and object", attempt("""
        found = [c for c in (Exception, CapabilityDenied, BoundaryError, StopIteration)
                 if isinstance(c, Exception)]
        e = CapabilityDenied('victim', 'read:SECRET')
        found.append(e.args)
        found.append(getattr(e, 'principal'))
        leak = found
      """)),
]

IMPORTS = [
    P("imports", "import os, then open the canary", PATH + code("""
        import os
        print(open(path).read())
      """)),
    P("imports", "from-import and __import__", PATH + code("""
        from builtins import open
        leaks.append(__import__('os'))
      """)),
    P("imports", "datetime.sys -> sys.modules['builtins']", attempt("""
        s = datetime.sys
        use(s.modules['builtins'])
      """)),
    P("imports", "re.enum -> enum.sys -> builtins", attempt("""
        e = re.enum
        leak = e
        use(e.sys.modules['builtins'])
      """)),
    P("imports", "json.codecs.open on the canary", attempt("""
        c = json.codecs
        leak = c
        handle = c.open(path)
        leaks.append(handle.read())
        print(leaks)
      """)),
    P("imports", "json.decoder / json.scanner / json.encoder modules", attempt("""
        leak = [getattr(json, 'decoder'), getattr(json, 'scanner'), getattr(json, 'encoder')]
        use(leak[0].re.enum.sys.modules['builtins'])
      """)),
    P("imports", "math/decimal module loaders and specs", attempt("""
        for name in ('__loader__', '__spec__', '__builtins__', 'sys', '__dict__'):
            try:
                leaks.append(getattr(math, name))
            except AttributeError:
                pass
        leak = getattr(decimal, 'sys')
        use(leak.modules['builtins'])
      """)),
    P("imports", "importlib and builtins through names in scope", attempt("""
        found = []
        found.append(importlib)
        found.append(builtins)
        leak = found
      """)),
    P("imports", "codecs reached through str.encode / bytes.decode", attempt("""
        found = []
        for codec in ('rot13', 'zlib_codec', 'hex', 'base64', 'uu', 'idna', 'punycode'):
            try:
                found.append('abc'.encode(codec))
                found.append(b'abc'.decode(codec))
            except LookupError:
                pass
        leak = found
        print(found)
      """)),
    P("imports", "the re module's internals through compiled patterns", attempt("""
        p = re.compile('(a)(b)')
        m = p.match('ab')
        leak = [getattr(p, 'scanner'), getattr(m, 're'), getattr(m, 'regs')]
        use(getattr(leak[1], 'sre_compile').sys.modules['builtins'])
      """)),
    P("imports", "datetime.datetime.strptime's lazy import of _strptime", attempt("""
        d = datetime.datetime.strptime('2020', '%Y')
        leak = getattr(datetime, '_strptime')
        use(leak.sys.modules['builtins'])
      """)),
]

REACH: list[Payload] = FRAMES + FORMAT + DUNDER + IMPORTS
