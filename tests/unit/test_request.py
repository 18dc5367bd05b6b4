"""``Request.__init__`` is written out (the dataclass's own is interpreted even when
compiled): it must be the one the dataclass would make, every field in order, with its
default."""

import dataclasses
import math

from fleetsim.serving.request import Request

FIELDS = dataclasses.fields(Request)


def _value(i: int, field: dataclasses.Field) -> object:
    """A value of the field's type that no other field gets. (Annotations are strings in the
    sources and only partly types in the compiled engine, which checks what is set: a field
    without a plain type takes the first candidate it accepts.)"""
    plain = {"int": 100 + i, "float": i + 0.5, "tuple[int, ...]": (i,), "tuple": (i,)}
    name = field.type if isinstance(field.type, str) else field.type.__name__
    if name in plain:
        return plain[name]
    probe = Request(id=0, arrival_s=0.0, num_prompt_tokens=1, max_output_tokens=1)
    for candidate in (100 + i, [i + 0.25], f"reason {i}"):
        try:
            setattr(probe, field.name, candidate)
        except TypeError:
            continue
        return candidate
    raise AssertionError(f"no test value for {field.name}: {field.type}")


def test_every_field_is_a_parameter_in_order_and_set_from_it():
    values = [_value(i, f) for i, f in enumerate(FIELDS)]
    by_position = Request(*values)
    by_name = Request(**{f.name: v for f, v in zip(FIELDS, values, strict=True)})
    for f, v in zip(FIELDS, values, strict=True):
        assert getattr(by_position, f.name) == v, f.name
        assert getattr(by_name, f.name) == v, f.name


def test_defaults_are_the_fields_defaults():
    r = Request(id=1, arrival_s=0.0, num_prompt_tokens=2, max_output_tokens=3)
    for f in FIELDS:
        if f.default is dataclasses.MISSING:
            continue
        got = getattr(r, f.name)
        if isinstance(f.default, float) and math.isnan(f.default):
            assert math.isnan(got), f.name
        else:
            assert got == f.default, f.name


def test_replace_keeps_every_field():
    r = Request(id=1, arrival_s=0.5, num_prompt_tokens=2, max_output_tokens=3, priority=4)
    r.num_output_tokens = 2
    copy = dataclasses.replace(r, id=9)
    assert (copy.id, copy.arrival_s, copy.priority, copy.num_output_tokens) == (9, 0.5, 4, 2)
