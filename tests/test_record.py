"""diag.model.records against its oracle, the standard dataclasses: the same
class body under @record and under @dataclass must construct, print,
compare, hash, refuse assignment and replace alike (what a warm `inspect`
imports is tests/test_cli.py's)."""

import copy
import dataclasses
import pickle

import pytest

from diag.model import records as rec


def _pair(body, **opts):
    """The class BODY (a function filling a namespace) made by dataclasses
    and by record with the same options."""
    def make(decorate):
        ns = {"__annotations__": {}}
        body(ns)
        cls = type("Shape", (), ns)
        return decorate(cls)
    return (make(dataclasses.dataclass(**opts)),
            make(rec.record(**opts)))


def _plain(ns):
    ns["__annotations__"].update(a="int", b="str", c="Optional[int]")
    ns["b"] = "x"
    ns["c"] = None


def _factory(ns):
    ns["__annotations__"].update(a="int", items="list", hidden="int")
    ns["items"] = dataclasses.field(default_factory=list)
    ns["hidden"] = dataclasses.field(default=7, repr=False, compare=False)


def _factory_rec(ns):
    ns["__annotations__"].update(a="int", items="list", hidden="int")
    ns["items"] = rec.field(default_factory=list)
    ns["hidden"] = rec.field(default=7, repr=False, compare=False)


CALLS = [((1,), {}), ((1, "y"), {}), ((1, "y", 3), {}), ((), {"a": 1, "c": 2}),
         ((1,), {"c": 5}), ((), {"b": "q", "a": 0})]
BAD_CALLS = [((), {}), ((1, "y", 3, 4), {}), ((1,), {"a": 2}), ((1,), {"zz": 1}),
             ((), {"b": "q"})]


def _outcome(cls, args, kwargs):
    try:
        obj = cls(*args, **kwargs)
    except TypeError:
        return "TypeError"
    return (repr(obj).replace("Shape", "S"), vars(obj))


@pytest.mark.parametrize("opts", [{}, {"frozen": True}, {"eq": False}])
def test_construction_and_repr_match_dataclasses(opts):
    dc, rc = _pair(_plain, **opts)
    for args, kwargs in CALLS + BAD_CALLS:
        assert _outcome(dc, args, kwargs) == _outcome(rc, args, kwargs), (args, kwargs)


@pytest.mark.parametrize("opts", [{}, {"frozen": True}, {"eq": False}])
def test_equality_and_hash_follow_dataclasses_rules(opts):
    dc, rc = _pair(_plain, **opts)
    for cls in (dc, rc):
        one, same, other = cls(1, "y"), cls(1, "y"), cls(2, "y")
        expect_eq = opts.get("eq", True)
        assert (one == same) is expect_eq
        assert one != other
        assert (cls.__hash__ is None) is (expect_eq and not opts.get("frozen"))
    if opts.get("frozen"):
        assert hash(rc(1, "y")) == hash(rc(1, "y"))
        assert hash(rc(1, "y")) == hash(dc(1, "y"))   # both hash the tuple of fields


def test_a_record_is_not_equal_to_another_class_with_the_same_fields():
    dc, rc = _pair(_plain)
    assert rc(1) != dc(1)
    assert rc(1).__eq__(dc(1)) is NotImplemented


def test_factory_defaults_and_hidden_fields():
    dc = dataclasses.dataclass(frozen=True)(type("Shape", (), _filled(_factory)))
    rc = rec.record(frozen=True)(type("Shape", (), _filled(_factory_rec)))
    for cls in (dc, rc):
        x, y = cls(1), cls(1, hidden=8)
        assert x.items == [] and x.items is not cls(1).items      # a new list each time
        assert x == y                                              # hidden is not compared
        assert repr(x).endswith("(a=1, items=[])")
        assert not hasattr(cls, "items") and cls.hidden == 7       # as dataclasses leaves them


def _filled(body):
    ns = {"__annotations__": {}}
    body(ns)
    return ns


def test_frozen_refuses_assignment_and_deletion():
    _, rc = _pair(_plain, frozen=True)
    obj = rc(1)
    with pytest.raises(rec.FrozenInstanceError, match="cannot assign to field 'a'"):
        obj.a = 2
    with pytest.raises(AttributeError):
        del obj.b
    object.__setattr__(obj, "a", 3)   # what a cached field of the model does
    assert obj.a == 3


def test_inheritance_puts_base_fields_first():
    @rec.record(frozen=True)
    class Base:
        kind: str
        path: str = ""

    @rec.record(frozen=True)
    class Derived(Base):
        version: str = "?"

    d = Derived("jemalloc", version="5")
    assert rec.field_names(Derived) == ("kind", "path", "version")
    assert repr(d).endswith(".Derived(kind='jemalloc', path='', version='5')")
    assert d != Base("jemalloc")
    with pytest.raises(TypeError, match="frozen"):
        rec.record(type("Mixed", (Base,), {"__annotations__": {}}))


def test_methods_the_class_writes_are_kept():
    @rec.record(frozen=True)
    class Own:
        a: int

        def __repr__(self):
            return "mine"

        def __eq__(self, other):
            return True

    assert repr(Own(1)) == "mine" and Own(1) == Own(2)
    assert hash(Own(1)) == hash(Own(1))   # eq in the body: still hashed, as dataclasses does


def test_replace_fields_and_asdict():
    @rec.record(frozen=True)
    class Inner:
        n: int

    @rec.record(frozen=True)
    class Outer:
        inner: Inner
        many: tuple = ()
        by_name: dict = rec.field(default_factory=dict)

    o = Outer(Inner(1), (Inner(2),), {"k": Inner(3)})
    assert rec.replace(o, many=()) == Outer(Inner(1), (), {"k": Inner(3)})
    assert rec.replace(o, many=()).inner is o.inner
    with pytest.raises(TypeError, match="no field 'nope'"):
        rec.replace(o, nope=1)
    assert [f.name for f in rec.fields(o)] == ["inner", "many", "by_name"]
    assert rec.asdict(o) == {"inner": {"n": 1}, "many": ({"n": 2},), "by_name": {"k": {"n": 3}}}
    with pytest.raises(TypeError):
        rec.fields(object())


def test_records_copy_and_pickle():
    from diag.model import ProcessMemory
    m = ProcessMemory(rss=10, swap=2)
    assert pickle.loads(pickle.dumps(m)) == m
    assert copy.deepcopy(m) == m and copy.copy(m) == m


def test_what_dataclasses_would_do_differently_is_refused():
    with pytest.raises(ValueError, match="mutable default"):
        rec.record(type("Shared", (), {"__annotations__": {"a": "list"}, "a": []}))
    with pytest.raises(TypeError, match="non-default argument 'b'"):
        rec.record(type("Order", (), {"__annotations__": {"a": "int", "b": "int"}, "a": 1}))
    with pytest.raises(TypeError, match="__post_init__"):
        rec.record(type("Post", (), {"__annotations__": {"a": "int"},
                                     "__post_init__": lambda self: None}))
    ns = {"__annotations__": {"a": "int", "k": "ClassVar[int]"}, "k": 3}
    assert rec.field_names(rec.record(type("CV", (), ns))) == ("a",)
