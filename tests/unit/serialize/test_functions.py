"""Functions defined in cells come back working after a restore (I3), bound to the namespace."""

from __future__ import annotations

import functools
import json
import math
import os.path
import types

import pytest


def test_plain_function_and_lambda_still_compute(notebook):
    notebook.run("""
        def area(width, height=2):
            "Width times height."
            return width * height
        square = lambda x: x * x
    """)
    restored = notebook.restore("area", "square")
    assert restored["area"](3) == 6
    assert restored["area"](3, height=5) == 15
    assert restored["area"].__doc__ == "Width times height."
    assert restored["area"].__defaults__ == (2,)
    assert restored["square"](7) == 49
    assert restored["square"].__name__ == "<lambda>"
    assert restored["area"] is not notebook["area"]


def test_restored_function_is_a_real_function_with_its_names(notebook):
    notebook.run("""
        class Shop:
            def price(self):
                return 3
        def total(*, tax: float = 0.5, **extra) -> float:
            return 10 + tax
    """)
    restored = notebook.restore("total", "Shop")
    total = restored["total"]
    assert type(total) is types.FunctionType
    assert total.__qualname__ == "total"
    assert total.__module__ == "__main__"
    assert total.__kwdefaults__ == {"tax": 0.5}
    assert total.__annotations__ == {"tax": float, "return": float}
    assert total() == 10.5
    assert restored["Shop"].price.__qualname__ == "Shop.price"


def test_recursive_function_calls_itself_through_the_namespace(notebook):
    notebook.run("""
        def factorial(n):
            return 1 if n <= 1 else n * factorial(n - 1)
    """)
    restored = notebook.restore("factorial")
    assert restored["factorial"](10) == 3628800


def test_functions_use_the_namespace_as_globals_and_see_later_changes(notebook):
    notebook.run("""
        RATE = 2
        def scaled(x):
            return x * RATE
    """)
    restored = notebook.restore("scaled")
    scaled = restored["scaled"]
    assert scaled.__globals__ is restored.namespace
    restored["RATE"] = 10
    assert scaled(3) == 30
    restored["RATE"] = 100
    assert scaled(3) == 300


def test_two_closures_sharing_one_nonlocal_still_share_it(notebook):
    notebook.run("""
        def make_counter():
            count = 0
            def inc():
                nonlocal count
                count += 1
                return count
            def get():
                return count
            return inc, get
        inc, get = make_counter()
        inc(); inc()
    """)
    restored = notebook.restore("inc", "get")
    inc, get = restored["inc"], restored["get"]
    assert get() == 2
    assert inc() == 3
    assert get() == 3
    assert inc.__closure__[0] is get.__closure__[0]
    assert notebook["get"]() == 2  # the original is untouched


def test_closures_in_separate_dumps_each_keep_their_value(notebook):
    notebook.run("""
        def adder(n):
            return lambda x: x + n
        add2, add5 = adder(2), adder(5)
    """)
    restored = notebook.restore("add2", "add5")
    assert restored["add2"](1) == 3
    assert restored["add5"](1) == 6


def test_nested_function_and_empty_closure_cell(notebook):
    notebook.run("""
        def outer():
            def later():
                return value
            inner = lambda: later()
            value_getter = later
            return inner, value_getter
        inner, getter = outer()
    """)
    restored = notebook.restore("inner", "getter")
    # `value` was never assigned: its cell is empty, and stays empty.
    with pytest.raises(NameError, match="value"):
        restored["getter"]()
    with pytest.raises(NameError):
        restored["inner"]()


def test_decorator_with_functools_wraps_keeps_wrapper_and_wrapped(notebook):
    notebook.run("""
        import functools
        def counted(func):
            @functools.wraps(func)
            def wrapper(*args, **kwargs):
                wrapper.calls += 1
                return func(*args, **kwargs)
            wrapper.calls = 0
            return wrapper
        @counted
        def add(a, b):
            "Add two numbers."
            return a + b
        add(1, 2)
    """)
    restored = notebook.restore("add")
    add = restored["add"]
    assert add.__name__ == "add"
    assert add.__doc__ == "Add two numbers."
    assert add.calls == 1
    assert add(2, 3) == 5
    assert add.calls == 2
    assert add.__wrapped__(4, 4) == 8
    assert add.__wrapped__ is not notebook["add"].__wrapped__


def test_default_argument_referring_to_a_cell_class_is_the_restored_class(notebook):
    notebook.run("""
        class Config:
            level = 3
        def make(kind=Config):
            return kind()
    """)
    restored = notebook.restore("make", "Config")
    assert restored["make"].__defaults__[0] is restored["Config"]
    assert isinstance(restored["make"](), restored["Config"])


def test_function_attribute_pointing_back_to_the_function(notebook):
    notebook.run("""
        def handler():
            return handler.meta["self"]
        handler.meta = {"self": handler}
    """)
    restored = notebook.restore("handler")
    assert restored["handler"]() is restored["handler"]


def test_lru_cache_function_defined_in_a_cell_restores_and_caches(notebook):
    notebook.run("""
        import functools
        @functools.lru_cache(maxsize=None)
        def fib(n):
            "Fibonacci."
            return n if n < 2 else fib(n - 1) + fib(n - 2)
        fib(20)
        @functools.lru_cache(maxsize=4, typed=True)
        def ident(x):
            return x
    """)
    restored = notebook.restore("fib", "ident")
    fib = restored["fib"]
    assert fib(30) == 832040
    assert fib.__doc__ == "Fibonacci."
    assert fib.__wrapped__.__globals__ is restored.namespace
    assert fib.cache_parameters() == {"maxsize": None, "typed": False}
    assert fib.cache_info().currsize > 0  # it caches again
    assert restored["ident"].cache_parameters() == {"maxsize": 4, "typed": True}


def test_partial_of_a_cell_function(notebook):
    notebook.run("""
        import functools
        def power(base, exponent):
            return base ** exponent
        square = functools.partial(power, exponent=2)
    """)
    restored = notebook.restore("square", "power")
    assert restored["square"](9) == 81
    assert restored["square"].func is restored["power"]


def test_bound_method_of_a_cell_instance_stays_bound_to_the_same_instance(notebook):
    notebook.run("""
        class Greeter:
            def __init__(self, name):
                self.name = name
            def greet(self):
                return "hi " + self.name
        greeter = Greeter("ada")
        greet = greeter.greet
    """)
    restored = notebook.restore("greeter", "greet")
    assert restored["greet"]() == "hi ada"
    assert restored["greet"].__self__ is restored["greeter"]


def test_modules_come_back_as_the_same_imported_module(notebook):
    notebook.run("""
        import json, math
        import os.path as osp
        modules = {"json": json, "math": math}
    """)
    restored = notebook.restore("json", "math", "osp", "modules")
    assert restored["json"] is json
    assert restored["math"] is math
    assert restored["osp"] is os.path
    assert restored["modules"]["json"] is json


def test_the_namespace_module_itself_comes_back_as_the_new_namespace_module(notebook):
    notebook.run("import sys; me = sys.modules['__main__']")
    assert notebook["me"] is notebook.module
    restored = notebook.restore("me")
    assert restored["me"] is restored.module


def test_library_functions_and_classes_are_stored_by_name(notebook):
    notebook.run("""
        import json, collections
        from os.path import join
        tools = [json.dumps, join, collections.OrderedDict, len]
    """)
    pickled = notebook.dump("tools")
    assert b"make_function" not in pickled.stream
    restored = notebook.restore_from(pickled, ["tools"])
    assert restored["tools"] == [json.dumps, os.path.join, __import__("collections").OrderedDict,
                                 len]


def test_module_not_importable_by_name_becomes_a_placeholder(notebook):
    notebook["scratch"] = types.ModuleType("made_up_module_xyz")
    pickled = notebook.dump("scratch")
    [transient] = pickled.transients
    assert transient.name == "scratch"
    assert transient.path == "scratch"
    assert "made_up_module_xyz" in transient.reason
    restored = notebook.restore_from(pickled, ["scratch"])
    assert "cannot be re-imported" in repr(restored["scratch"])


def test_type_var_defined_in_a_cell_is_rebuilt_with_its_bounds(notebook):
    notebook.run("""
        from typing import TypeVar
        Number = TypeVar("Number", bound=float)
        Text = TypeVar("Text", str, bytes, covariant=True)
    """)
    restored = notebook.restore("Number", "Text")
    number, text = restored["Number"], restored["Text"]
    assert number.__name__ == "Number"
    assert number.__bound__ is float
    assert text.__constraints__ == (str, bytes)
    assert text.__covariant__
    assert number.__module__ == "__main__"


def test_code_refs_report_the_global_names_stored_code_reads(notebook):
    notebook.run("""
        import math
        def area(r):
            return math.pi * r ** 2 + OFFSET + helper(r)
        def helper(r):
            return [SCALE for _ in range(r)]
        data = {"numbers": [1, 2, 3]}
    """)
    refs = notebook.dump("area").code_refs
    assert {"math", "OFFSET", "helper", "pi"} <= refs
    assert "r" not in refs  # a local, not a global
    assert "SCALE" in notebook.dump("helper").code_refs  # read inside a nested comprehension
    assert notebook.dump("data").code_refs == frozenset()


def test_code_refs_include_names_read_by_methods_of_cell_classes(notebook):
    notebook.run("""
        class Model:
            def predict(self):
                return WEIGHTS @ self.x
    """)
    assert "WEIGHTS" in notebook.dump("Model").code_refs


def test_library_function_by_reference_reports_no_code_refs(notebook):
    notebook["dumps"] = json.dumps
    notebook["sqrt"] = math.sqrt
    assert notebook.dump("dumps", "sqrt").code_refs == frozenset()


def test_generator_function_restores_and_makes_fresh_generators(notebook):
    notebook.run("""
        def countdown(n):
            while n:
                yield n
                n -= 1
    """)
    restored = notebook.restore("countdown")
    assert list(restored["countdown"](3)) == [3, 2, 1]


def test_async_function_restores(notebook):
    notebook.run("""
        async def twice(x):
            return 2 * x
    """)
    restored = notebook.restore("twice")
    coroutine = restored["twice"](4)
    with pytest.raises(StopIteration) as stopped:
        coroutine.send(None)
    assert stopped.value.value == 8


def test_lambdas_in_a_list_still_compose_after_restore(notebook):
    notebook.run("""
        pipeline = [lambda x: x + 1, lambda x: x * 10]
    """)
    restored = notebook.restore("pipeline")
    assert functools.reduce(lambda acc, f: f(acc), restored["pipeline"], 1) == 20
