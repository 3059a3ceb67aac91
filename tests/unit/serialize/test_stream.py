"""The stream format and the load context around it."""

from __future__ import annotations

import pickle

import dill
import pytest

from kernos.serialize import rebuild
from kernos.serialize.pickler import Serializer


def test_load_refuses_a_stream_that_does_not_hold_a_tuple():
    with pytest.raises(TypeError, match="holds list, not a tuple"):
        Serializer({}).load(pickle.dumps([1, 2], protocol=5))


def test_load_context_is_reset_even_when_a_load_fails():
    broken = pickle.dumps((1,), protocol=5)[:-3]
    with pytest.raises(Exception):  # noqa: B017 - whatever the unpickler raises
        Serializer({}).load(broken)
    assert rebuild._context.get(None) is None


def test_dump_of_several_roots_loads_as_a_tuple_in_root_order():
    serializer = Serializer({})
    pickled = serializer.dump([("a", 1), ("b", "two"), ("c", [3])], op=1)
    assert serializer.load(pickled.stream) == (1, "two", [3])


def test_the_namespace_itself_loads_as_the_namespace_being_loaded_into(notebook, new_notebook):
    notebook.run("me = globals()")
    pickled = notebook.dump("me")
    fresh = new_notebook()
    [value] = fresh.load(pickled)
    assert value is fresh.namespace


def test_without_a_module_the_namespace_module_is_made_from_the_namespace(notebook):
    notebook.run("import sys; me = sys.modules['__main__']; answer = 42")
    pickled = notebook.dump("me")
    [module] = Serializer({"answer": 42}).load(pickled.stream)
    assert module.__name__ == "__main__"
    assert module.answer == 42


def test_code_blobs_written_with_dills_memo_still_load():
    # Code objects are now pickled without a memo; blobs from before must still load.
    def sample(x):
        return sample_global + x  # noqa: F821 - resolved at call time

    code = rebuild.code_from_dill(dill.dumps(sample.__code__, protocol=5))
    assert code == sample.__code__


def test_code_blob_refuses_what_is_not_code():
    with pytest.raises(TypeError, match="expected a code object"):
        rebuild.code_from_dill(dill.dumps([1]))


def test_class_made_twice_in_one_stream_is_made_once():
    made = rebuild.make_class(type, "Once", (), {"__module__": "m", "__qualname__": "Once"})
    again = rebuild.make_class(type, "Once", (), {"__module__": "m", "__qualname__": "Once",
                                                  rebuild.SAME_AS: made})
    assert again is made


def test_stream_of_an_unchanged_value_does_not_depend_on_the_op():
    serializer = Serializer({})
    value = {"k": [1, 2]}
    assert (serializer.dump([("v", value)], op=1).stream
            == serializer.dump([("v", value)], op=99).stream)
