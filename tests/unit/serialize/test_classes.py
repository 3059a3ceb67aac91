"""Classes defined in cells, and their instances, come back working after a restore (I3)."""

from __future__ import annotations

import abc
import dataclasses
import enum
import typing

import pytest


def test_inheritance_super_and_method_overrides(notebook):
    notebook.run("""
        class Animal:
            def __init__(self, name):
                self.name = name
            def speak(self):
                return "..."
            def describe(self):
                return f"{self.name} says {self.speak()}"
        class Dog(Animal):
            def __init__(self, name, tricks):
                super().__init__(name)
                self.tricks = tricks
            def speak(self):
                return "woof, not " + super().speak()
        rex = Dog("rex", ["sit"])
    """)
    restored = notebook.restore("Animal", "Dog", "rex")
    animal, dog, rex = restored["Animal"], restored["Dog"], restored["rex"]
    assert dog.__bases__ == (animal,)
    assert type(rex) is dog
    assert isinstance(rex, animal)
    assert rex.describe() == "rex says woof, not ..."
    assert rex.tricks == ["sit"]
    assert dog("fido", []).describe() == "fido says woof, not ..."
    assert dog is not notebook["Dog"]
    assert dog.__name__ == "Dog" and dog.__qualname__ == "Dog" and dog.__module__ == "__main__"


def test_property_with_setter_staticmethod_classmethod_and_cached_property(notebook):
    notebook.run("""
        import functools
        class Temperature:
            unit = "C"
            def __init__(self, celsius):
                self._celsius = celsius
                self.computed = 0
            @property
            def celsius(self):
                "The temperature."
                return self._celsius
            @celsius.setter
            def celsius(self, value):
                if value < -273.15:
                    raise ValueError("below absolute zero")
                self._celsius = value
            @staticmethod
            def freezing():
                return 0
            @classmethod
            def describe(cls):
                return cls.__name__ + " in " + cls.unit
            @functools.cached_property
            def fahrenheit(self):
                self.computed += 1
                return self._celsius * 9 / 5 + 32
        t = Temperature(100)
    """)
    restored = notebook.restore("Temperature", "t")
    temperature, t = restored["Temperature"], restored["t"]
    assert temperature.celsius.__doc__ == "The temperature."
    t.celsius = 20
    assert t.celsius == 20
    with pytest.raises(ValueError, match="absolute zero"):
        t.celsius = -300
    assert temperature.freezing() == 0
    assert temperature.describe() == "Temperature in C"
    assert t.fahrenheit == 68.0
    assert t.fahrenheit == 68.0
    assert t.computed == 1  # cached under its own name
    assert temperature.__dict__["fahrenheit"].attrname == "fahrenheit"


def test_slots_class_and_instance(notebook):
    notebook.run("""
        class Point:
            __slots__ = ("x", "y")
            def __init__(self, x, y):
                self.x, self.y = x, y
            def norm2(self):
                return self.x ** 2 + self.y ** 2
        p = Point(3, 4)
    """)
    restored = notebook.restore("Point", "p")
    p = restored["p"]
    assert p.norm2() == 25
    assert not hasattr(p, "__dict__")
    with pytest.raises(AttributeError):
        p.z = 1
    p.x = 0
    assert p.norm2() == 16


def test_enum_members_methods_and_lookup_by_value(notebook):
    notebook.run("""
        import enum
        class Color(enum.Enum):
            RED = 1
            GREEN = 2
            def lower(self):
                return self.name.lower()
        class Permission(enum.Flag):
            READ = enum.auto()
            WRITE = enum.auto()
        class Level(enum.IntEnum):
            LOW = 1
            HIGH = 2
        favourite = Color.GREEN
        both = Permission.READ | Permission.WRITE
    """)
    restored = notebook.restore("Color", "favourite", "Permission", "both", "Level")
    color = restored["Color"]
    assert issubclass(color, enum.Enum)
    assert color(1) is color.RED
    assert color["GREEN"] is restored["favourite"]
    assert restored["favourite"].lower() == "green"
    assert [member.name for member in color] == ["RED", "GREEN"]
    with pytest.raises(ValueError):
        color(3)
    permission = restored["Permission"]
    assert permission.READ in restored["both"]
    assert restored["both"] == permission.READ | permission.WRITE
    assert restored["Level"].HIGH > restored["Level"].LOW
    assert restored["Level"](2) + 1 == 3


def test_dataclass_fields_replace_and_defaults_work_after_restore(notebook):
    notebook.run("""
        import dataclasses
        @dataclasses.dataclass
        class Run:
            name: str
            epochs: int = 10
            tags: list = dataclasses.field(default_factory=list)
        @dataclasses.dataclass(frozen=True, order=True)
        class Version:
            major: int
            minor: int = 0
        run = Run("baseline", tags=["a"])
    """)
    restored = notebook.restore("Run", "run", "Version")
    run_class, run, version = restored["Run"], restored["run"], restored["Version"]
    assert dataclasses.is_dataclass(run)
    assert [f.name for f in dataclasses.fields(run)] == ["name", "epochs", "tags"]
    assert dataclasses.replace(run, epochs=3) == run_class("baseline", 3, ["a"])
    assert run_class("x").tags == []
    assert run_class("x").tags is not run_class("y").tags  # the factory still runs
    assert dataclasses.asdict(run) == {"name": "baseline", "epochs": 10, "tags": ["a"]}
    assert repr(run) == "Run(name='baseline', epochs=10, tags=['a'])"
    assert version(1, 2) < version(2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        version(1).major = 5
    assert hash(version(1, 2)) == hash(version(1, 2))


def test_slotted_dataclass(notebook):
    notebook.run("""
        import dataclasses
        @dataclasses.dataclass(slots=True)
        class Pair:
            left: int
            right: int = 2
        pair = Pair(1)
    """)
    restored = notebook.restore("Pair", "pair")
    assert restored["pair"] == restored["Pair"](1, 2)
    assert restored["Pair"].__slots__ == ("left", "right")


def test_named_tuples_keep_fields_defaults_and_methods(notebook):
    notebook.run("""
        import collections, typing
        class Sample(typing.NamedTuple):
            x: int
            label: str = "none"
        Row = collections.namedtuple("Row", "a b")
        sample = Sample(1)
        row = Row(1, 2)
    """)
    restored = notebook.restore("Sample", "sample", "Row", "row")
    sample_class, sample = restored["Sample"], restored["sample"]
    assert sample == (1, "none")
    assert sample.label == "none"
    assert type(sample) is sample_class
    assert sample_class._fields == ("x", "label")
    assert sample._replace(x=5) == sample_class(5)
    assert sample_class(2, "two")._asdict() == {"x": 2, "label": "two"}
    assert restored["row"].b == 2
    assert restored["Row"]._make([3, 4]) == (3, 4)


def test_abstract_methods_are_still_enforced(notebook):
    notebook.run("""
        import abc
        class Shape(abc.ABC):
            @abc.abstractmethod
            def area(self): ...
        class Square(Shape):
            def __init__(self, side):
                self.side = side
            def area(self):
                return self.side ** 2
        class Unfinished(Shape):
            pass
    """)
    restored = notebook.restore("Shape", "Square", "Unfinished")
    with pytest.raises(TypeError, match="abstract"):
        restored["Shape"]()
    with pytest.raises(TypeError, match="abstract"):
        restored["Unfinished"]()
    assert restored["Square"](3).area() == 9
    assert isinstance(restored["Square"](1), abc.ABC)
    assert issubclass(restored["Square"], restored["Shape"])


def test_class_registry_holding_its_own_instances(notebook):
    notebook.run("""
        class Node:
            registry = []
            def __init__(self, name):
                self.name = name
                self.peers = []
                Node.registry.append(self)
        a, b = Node("a"), Node("b")
        a.peers.append(b)
        b.peers.append(a)
    """)
    restored = notebook.restore("Node", "a", "b")
    node, a, b = restored["Node"], restored["a"], restored["b"]
    assert node.registry == [a, b]
    assert node.registry[0] is a
    assert a.peers[0] is b and b.peers[0] is a
    assert type(a) is node
    node("c")
    assert [n.name for n in node.registry] == ["a", "b", "c"]


@pytest.mark.parametrize("order", [("Plugin", "CsvPlugin"), ("CsvPlugin", "Plugin")])
def test_subclass_registered_by_init_subclass_is_made_once_whatever_the_order(notebook, order):
    notebook.run("""
        class Plugin:
            registry = {}
            def __init_subclass__(cls, **kwargs):
                super().__init_subclass__(**kwargs)
                Plugin.registry[cls.__name__] = cls
        class CsvPlugin(Plugin):
            pass
    """)
    restored = notebook.restore(*order)
    plugin = restored["Plugin"]
    assert plugin.registry == {"CsvPlugin": restored["CsvPlugin"]}
    assert plugin.registry["CsvPlugin"] is restored["CsvPlugin"]
    assert plugin.__subclasses__() == [restored["CsvPlugin"]]


@pytest.mark.parametrize("order", [("Counted", "Child"), ("Child", "Counted"), ("Child",)])
def test_restore_does_not_run_init_subclass_again(notebook, order):
    notebook.run("""
        class Counted:
            made = []
            def __init_subclass__(cls, **kwargs):
                super().__init_subclass__(**kwargs)
                cls.__bases__[0].made.append(cls.__name__)
        class Child(Counted):
            pass
    """)
    restored = notebook.restore(*order)
    counted = restored["Child"].__bases__[0]
    assert counted.made == ["Child"]
    new_class = type("Later", (counted,), {})  # the hook is back once the load is done
    assert counted.made == ["Child", "Later"]
    assert new_class.__bases__ == (counted,)


def test_metaclass_defined_in_a_cell(notebook):
    notebook.run("""
        class Tracked(type):
            def __new__(meta, name, bases, namespace):
                namespace.setdefault("tracked", True)
                return super().__new__(meta, name, bases, namespace)
            def describe(cls):
                return "tracked " + cls.__name__
        class Model(metaclass=Tracked):
            def predict(self):
                return 42
        model = Model()
    """)
    restored = notebook.restore("Tracked", "Model", "model")
    model_class = restored["Model"]
    assert type(model_class) is restored["Tracked"]
    assert model_class.tracked is True
    assert model_class.describe() == "tracked Model"
    assert restored["model"].predict() == 42


def test_generic_class_with_cell_type_variables(notebook):
    notebook.run("""
        from typing import Generic, TypeVar
        T = TypeVar("T")
        class Box(Generic[T]):
            def __init__(self, item: T):
                self.item = item
        box = Box[int](3)
    """)
    restored = notebook.restore("T", "Box", "box")
    box_class = restored["Box"]
    assert box_class.__parameters__ == (restored["T"],)
    assert restored["box"].item == 3
    assert box_class[str]("s").item == "s"


def test_protocol_and_typed_dict_defined_in_cells(notebook):
    notebook.run("""
        from typing import Protocol, TypedDict, runtime_checkable
        @runtime_checkable
        class Sized(Protocol):
            def __len__(self) -> int: ...
        class Movie(TypedDict):
            title: str
            year: int
        movie = Movie(title="Alien", year=1979)
    """)
    restored = notebook.restore("Sized", "Movie", "movie")
    assert isinstance([], restored["Sized"])
    assert not isinstance(3, restored["Sized"])
    movie_class = restored["Movie"]
    assert typing.get_type_hints(movie_class) == {"title": str, "year": int}
    assert movie_class.__required_keys__ == frozenset({"title", "year"})
    assert restored["movie"] == {"title": "Alien", "year": 1979}
    assert movie_class(title="x", year=1) == {"title": "x", "year": 1}


def test_nested_class_and_instances_of_it(notebook):
    notebook.run("""
        class Outer:
            class Inner:
                def hello(self):
                    return "inner"
            def make(self):
                return self.Inner()
        inner = Outer().make()
    """)
    restored = notebook.restore("Outer", "inner")
    assert type(restored["inner"]) is restored["Outer"].Inner
    assert restored["inner"].hello() == "inner"
    assert restored["Outer"].Inner.__qualname__ == "Outer.Inner"


def test_instances_with_getstate_and_setstate(notebook):
    notebook.run("""
        class Cache:
            def __init__(self):
                self.size = 3
                self.scratch = object()
            def __getstate__(self):
                return {"size": self.size}
            def __setstate__(self, state):
                self.__dict__.update(state)
                self.scratch = "rebuilt"
        cache = Cache()
    """)
    restored = notebook.restore("cache")
    assert restored["cache"].size == 3
    assert restored["cache"].scratch == "rebuilt"


def test_exception_with_a_custom_init_restores(notebook):
    notebook.run("""
        class ApiError(RuntimeError):
            def __init__(self, message, status):
                super().__init__(message)
                self.status = status
        class Plain(ValueError):
            pass
        last_error = ApiError("rate limited", 429)
        plain = Plain("bad", 1)
        builtin = KeyError("missing")
    """)
    restored = notebook.restore("ApiError", "last_error", "plain", "builtin")
    error = restored["last_error"]
    assert type(error) is restored["ApiError"]
    assert isinstance(error, RuntimeError)
    assert error.args == ("rate limited",)
    assert str(error) == "rate limited"
    assert error.status == 429
    assert restored["plain"].args == ("bad", 1)
    assert repr(restored["builtin"]) == "KeyError('missing')"
    with pytest.raises(RuntimeError, match="rate limited"):
        raise error


def test_unicode_decode_error_subclass_keeps_its_fields(notebook):
    notebook.run("""
        class BadBytes(UnicodeDecodeError):
            def __init__(self, data):
                super().__init__("utf-8", data, 0, 1, "invalid start byte")
        failure = BadBytes(b"\\xff")
    """)
    restored = notebook.restore("failure")
    assert restored["failure"].object == b"\xff"
    assert restored["failure"].reason == "invalid start byte"


def test_instance_of_cell_class_keeps_attributes_and_equality(notebook):
    notebook.run("""
        class Money:
            def __init__(self, amount, currency):
                self.amount, self.currency = amount, currency
            def __eq__(self, other):
                return (self.amount, self.currency) == (other.amount, other.currency)
            __hash__ = None
        prices = {"tea": Money(3, "EUR"), "cake": Money(5, "EUR")}
    """)
    restored = notebook.restore("prices", "Money")
    assert restored["prices"]["tea"] == restored["Money"](3, "EUR")
    assert restored["prices"]["cake"].__dict__ == {"amount": 5, "currency": "EUR"}
    assert restored["Money"].__hash__ is None


def test_stdlib_classes_come_back_by_reference(notebook):
    notebook.run("""
        import datetime, decimal, enum
        kinds = [int, datetime.datetime, decimal.Decimal, enum.Enum]
        when = datetime.datetime(2024, 5, 1, 12, 30)
    """)
    restored = notebook.restore("kinds", "when")
    assert restored["kinds"] == [int, __import__("datetime").datetime,
                                 __import__("decimal").Decimal, enum.Enum]
    assert restored["when"].isoformat() == "2024-05-01T12:30:00"


def test_class_referenced_from_another_module_is_stored_by_name():
    from kernos.serialize.pickler import Serializer

    serializer = Serializer({})
    assert not serializer.is_by_value(dataclasses.Field)
    assert not serializer.is_by_value(abc.ABC)

    class Local:
        pass

    assert serializer.is_by_value(Local)  # "<locals>" cannot be found by name
