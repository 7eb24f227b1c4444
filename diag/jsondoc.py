"""Reading allocdiag's own JSON documents back into the model: the pieces
the snapshot reader (diag.recording) and the wall reader (diag.wallfile)
share.  A document that does not fit raises ``Bad`` with the path of the
offending key; each reader turns it into MalformedData once, naming what
it expected."""

from diag.model import Finding, Knob
from diag.model.records import field_names


class Bad(Exception):
    """Internal: a document that does not describe what its reader reads."""


def obj(doc, what):
    """DOC as a dict ({} for None); Bad when it is anything else."""
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise Bad(f"{what} is not an object")
    return doc


def int_or_none(v, what):
    if v is None or (isinstance(v, int) and not isinstance(v, bool)):
        return v
    raise Bad(f"{what} is not an integer: {v!r}")


def finding(doc, what):
    """The Finding whose ``to_json()`` is DOC (its knob needs a name)."""
    doc = obj(doc, what)
    if not isinstance(doc.get("id"), str) or not isinstance(doc.get("title"), str):
        raise Bad(f"{what} has no id/title")
    knob = doc.get("knob")
    if knob is not None:
        knob = obj(knob, f"{what}.knob")
        if not isinstance(knob.get("name"), str):
            raise Bad(f"{what}.knob has no name")
        knob = Knob(**{k: knob[k] for k in field_names(Knob) if k in knob})
    return Finding(id=doc["id"], severity=doc.get("severity", "info"), title=doc["title"],
                   evidence=obj(doc.get("evidence"), f"{what}.evidence"), knob=knob,
                   expected_effect_bytes=int_or_none(doc.get("expected_effect_bytes"),
                                                     f"{what}.expected_effect_bytes"),
                   confidence=doc.get("confidence", "medium"))
