"""Records: the value classes of the model, the collectors and the views,
made without the standard ``dataclasses`` module.

Why not ``dataclasses``: it writes each class's ``__init__``, ``__repr__``,
``__eq__``, ``__hash__``, ``__setattr__`` and ``__delattr__`` as source text
and compiles it, ~1 ms a class on the slow guest: 20-29 ms for the 27
classes an ``inspect`` makes, and importing it brings ``inspect``, ``dis``
and ``ast`` (~12 ms more), all before the first line of output (issue 23
item 2).  A record's methods are closures over its field list, made in tens
of microseconds.

What ``@record``, ``@record(frozen=True)`` and ``@record(eq=False)`` make is
what the same ``@dataclass`` makes for a class that declares annotated
fields with optional defaults, ``field(default=, default_factory=, repr=,
compare=)`` included: an ``__init__`` taking the fields in order (bases'
fields first), by position or keyword; a ``__repr__`` and an ``__eq__`` over
the shown and the compared fields; ``__hash__`` set by dataclasses' rules
(frozen and eq: a hash of the compared fields; eq only: unhashable); a
frozen record refuses assignment with ``FrozenInstanceError``; methods the
class writes itself are kept.  What dataclasses has beyond that
(``__post_init__``, ``InitVar``, slots, order, kw_only) raises TypeError when
a class asks for it, rather than behaving differently.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, ClassVar, TypeVar, dataclass_transform, overload

T = TypeVar("T")


class _Missing:
    """The absence of a default (None is a default)."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class FrozenInstanceError(AttributeError):
    """An assignment to a field of a frozen record."""


class Field:
    """One field of a record: its name, its default or default factory, and
    whether ``__repr__`` shows it and ``__eq__`` (and the hash) compare it."""

    __slots__ = ("name", "default", "default_factory", "repr", "compare")

    def __init__(self, default: Any = MISSING, default_factory: Any = MISSING,
                 repr: bool = True, compare: bool = True) -> None:
        if default is not MISSING and default_factory is not MISSING:
            raise ValueError("cannot specify both default and default_factory")
        self.name = ""
        self.default = default
        self.default_factory = default_factory
        self.repr = repr
        self.compare = compare

    def __repr__(self) -> str:
        return (f"Field(name={self.name!r}, default={self.default!r}, "
                f"default_factory={self.default_factory!r}, repr={self.repr}, "
                f"compare={self.compare})")


def field(*, default: Any = MISSING, default_factory: Callable[[], Any] | Any = MISSING,
          repr: bool = True, compare: bool = True) -> Any:
    """A field with a default made at each ``__init__`` (``default_factory``)
    or left out of ``__repr__`` or of ``__eq__`` and the hash."""
    return Field(default, default_factory, repr, compare)


# Names a class may not define for a record: dataclasses would call or honour
# them, a record would not.
_UNSUPPORTED = ("__post_init__", "__slots__")


@overload
def record(cls: type[T], /) -> type[T]: ...
@overload
def record(*, frozen: bool = False, eq: bool = True) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(field_specifiers=(field, Field))
def record(cls: Any = None, /, *, frozen: bool = False, eq: bool = True) -> Any:
    """The class decorator (see the module's docstring)."""
    def wrap(c: type[T]) -> type[T]:
        return _process(c, frozen, eq)
    return wrap if cls is None else wrap(cls)


def fields(obj: Any) -> tuple[Field, ...]:
    """The fields of a record class or instance, in ``__init__`` order."""
    try:
        return tuple(obj.__record_fields__.values())
    except AttributeError:
        raise TypeError(f"fields() takes a record class or instance, not {type(obj).__name__}") \
            from None


def field_names(obj: Any) -> tuple[str, ...]:
    """The names of ``fields(obj)``, from a tuple made once per class."""
    try:
        names: tuple[str, ...] = obj.__record_names__
    except AttributeError:
        raise TypeError(f"field_names() takes a record class or instance, not "
                        f"{type(obj).__name__}") from None
    return names


def replace(obj: T, /, **changes: Any) -> T:
    """A new record like OBJ with CHANGES: ``dataclasses.replace``."""
    names = field_names(obj)
    unknown = set(changes).difference(names)
    if unknown:
        raise TypeError(f"{type(obj).__qualname__} has no field {sorted(unknown)[0]!r}")
    values = {name: changes[name] if name in changes else getattr(obj, name) for name in names}
    return type(obj)(**values)


def asdict(obj: Any) -> dict[str, Any]:
    """OBJ's fields as a dict, records inside it (and in its lists, tuples
    and dicts) as dicts too: ``dataclasses.asdict``, except that other
    values are shared rather than deep-copied."""
    return {name: _asdict_value(getattr(obj, name)) for name in field_names(obj)}


def _asdict_value(value: Any) -> Any:
    if hasattr(type(value), "__record_fields__"):
        return asdict(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):   # a namedtuple
        return type(value)(*(_asdict_value(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_asdict_value(v) for v in value)
    if isinstance(value, dict):
        return type(value)((_asdict_value(k), _asdict_value(v)) for k, v in value.items())
    return value


def _is_classvar(annotation: Any) -> bool:
    if isinstance(annotation, str):   # `from __future__ import annotations`
        return annotation.startswith(("ClassVar", "typing.ClassVar"))
    return annotation is ClassVar or getattr(annotation, "__origin__", None) is ClassVar


def _own_fields(cls: type) -> list[Field]:
    """The fields CLS's own body declares; class attributes holding a
    ``field()`` become its default (or go, for a factory), as in dataclasses."""
    out = []
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        if _is_classvar(annotation):
            continue
        value = cls.__dict__.get(name, MISSING)
        if isinstance(value, Field):
            f = value
            if f.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
        else:
            f = Field(default=value)
            if value is not MISSING and type(value).__hash__ is None:
                # dataclasses' rule: a list/dict/set default would be shared by
                # every instance
                raise ValueError(f"mutable default {type(value)} for field {name} "
                                 f"is not allowed: use default_factory")
        f.name = name
        out.append(f)
    return out


def _process(cls: type[T], frozen: bool, eq: bool) -> type[T]:
    for name in _UNSUPPORTED:
        if name in cls.__dict__:
            raise TypeError(f"{cls.__qualname__}: a record does not support {name}")
    all_fields: dict[str, Field] = {}
    for base in cls.__mro__[-1:0:-1]:
        base_fields = base.__dict__.get("__record_fields__")
        if base_fields is not None:
            if base.__dict__["__record_frozen__"] != frozen:
                raise TypeError(f"{cls.__qualname__}: cannot mix frozen and non-frozen "
                                f"records ({base.__qualname__})")
            all_fields.update(base_fields)
    for f in _own_fields(cls):
        all_fields[f.name] = f
    seen_default = None
    for f in all_fields.values():
        if f.default is MISSING and f.default_factory is MISSING:
            if seen_default is not None:
                raise TypeError(f"{cls.__qualname__}: non-default argument {f.name!r} "
                                f"follows default argument {seen_default!r}")
        else:
            seen_default = f.name
    names = tuple(all_fields)
    type.__setattr__(cls, "__record_fields__", all_fields)
    type.__setattr__(cls, "__record_names__", names)
    type.__setattr__(cls, "__record_frozen__", frozen)
    _set_new(cls, "__init__", _make_init(cls, all_fields))
    _set_new(cls, "__repr__", _make_repr(tuple(f.name for f in all_fields.values() if f.repr)))
    _set_new(cls, "__match_args__", names)
    compared = tuple(f.name for f in all_fields.values() if f.compare)
    if eq:
        _set_new(cls, "__eq__", _make_eq(compared))
        own_hash = cls.__dict__.get("__hash__", MISSING)
        # a class body that defines __eq__ gets __hash__ = None from Python:
        # that is not a hash of its own (dataclasses' has_explicit_hash)
        if own_hash is MISSING or (own_hash is None and "__eq__" in cls.__dict__):
            type.__setattr__(cls, "__hash__", _make_hash(compared) if frozen else None)
    if frozen:
        for name in ("__setattr__", "__delattr__"):
            if name in cls.__dict__:
                raise TypeError(f"{cls.__qualname__}: a frozen record cannot define {name}")
        _make_frozen(cls, frozenset(names))
    return cls


def _set_new(cls: type, name: str, value: Any) -> None:
    if name not in cls.__dict__:
        type.__setattr__(cls, name, value)


def _make_init(cls: type, all_fields: dict[str, Field]) -> Callable[..., None]:
    names = tuple(all_fields)
    count = len(names)
    # (name, default, factory) of every field, in order: the general path's plan
    plan = tuple((f.name, f.default, f.default_factory) for f in all_fields.values())
    # The keyword path: a copy of TEMPLATE updated with the keywords holds
    # every field, and a field without a plain default still holds MISSING
    # when no keyword named it (then its factory makes one, or it is an error)
    template = {f.name: f.default for f in all_fields.values()}
    unset = tuple((f.name, f.default_factory) for f in all_fields.values()
                  if f.default is MISSING)
    qualname = cls.__qualname__

    def general(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        if len(args) > count:
            raise TypeError(f"{qualname}() takes {count} positional arguments but "
                            f"{len(args)} were given")
        values = {}
        taken = 0   # of kwargs
        for i, (name, default, factory) in enumerate(plan):
            if i < len(args):
                if name in kwargs:
                    raise TypeError(f"{qualname}() got multiple values for argument {name!r}")
                values[name] = args[i]
            elif name in kwargs:
                values[name] = kwargs[name]
                taken += 1
            elif factory is not MISSING:
                values[name] = factory()
            elif default is not MISSING:
                values[name] = default
            else:
                raise TypeError(f"{qualname}() missing required argument {name!r}")
        if taken < len(kwargs):
            unknown = sorted(set(kwargs).difference(names))
            raise TypeError(f"{qualname}() got an unexpected keyword argument {unknown[0]!r}")
        return values

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if args:
            if not kwargs and len(args) == count:
                # every field by position: all in C
                self.__dict__.update(zip(names, args))
            else:
                self.__dict__.update(general(args, kwargs))
            return
        values = template.copy()
        values.update(kwargs)
        if len(values) != count:   # a keyword that is not a field
            values = general(args, kwargs)
        else:
            for name, factory in unset:
                if values[name] is MISSING:
                    if factory is MISSING:
                        general(args, kwargs)   # raises: a required field is missing
                    values[name] = factory()
        self.__dict__.update(values)

    __init__.__qualname__ = f"{qualname}.__init__"
    return __init__


def _make_repr(shown: tuple[str, ...]) -> Callable[[Any], str]:
    def __repr__(self: Any) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in shown)
        return f"{type(self).__qualname__}({inner})"
    return __repr__


def _key(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """A function from a record to the tuple of its NAMES fields."""
    if len(names) >= 2:
        return operator.attrgetter(*names)
    if names:
        one = names[0]
        return lambda obj: (getattr(obj, one),)
    return lambda obj: ()


def _make_eq(compared: tuple[str, ...]) -> Callable[[Any, Any], Any]:
    key = _key(compared)

    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return key(self) == key(other)
        return NotImplemented
    return __eq__


def _make_hash(compared: tuple[str, ...]) -> Callable[[Any], int]:
    key = _key(compared)

    def __hash__(self: Any) -> int:
        return hash(key(self))
    return __hash__


def _make_frozen(cls: type[Any], names: frozenset[str]) -> None:
    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    type.__setattr__(cls, "__setattr__", __setattr__)
    type.__setattr__(cls, "__delattr__", __delattr__)
