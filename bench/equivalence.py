"""Patch equivalence: apply each server's JSONPatch to the reviewed object and compare what
matters (node allocatable and overcommit annotations, pod container requests).

Quantities and the JSON annotations are compared by value, not by spelling: "1500m" and "1.5"
are the same cpu, "16Gi" and "17179869184" the same memory.
"""

from __future__ import annotations

import base64
import copy
import json
from fractions import Fraction

from common import quantity


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ValueError(f"bad JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc, parts):
    cur = doc
    for p in parts[:-1]:
        cur = cur[int(p)] if isinstance(cur, list) else cur[p]
    return cur, parts[-1]


def apply_patch(doc, ops):
    """RFC 6902 apply (add, remove, replace, move, copy, test)."""
    doc = copy.deepcopy(doc)
    for op in ops:
        kind, parts = op["op"], _pointer(op["path"])
        if not parts:
            if kind in ("add", "replace"):
                doc = copy.deepcopy(op["value"])
                continue
            raise ValueError(f"unsupported root op {op}")
        if kind in ("move", "copy"):
            src_parent, src_key = _parent(doc, _pointer(op["from"]))
            idx = int(src_key) if isinstance(src_parent, list) else src_key
            value = copy.deepcopy(src_parent[idx])
            if kind == "move":
                del src_parent[idx]
            kind, op = "add", {"value": value}
        parent, key = _parent(doc, parts)
        if kind == "test":
            idx = int(key) if isinstance(parent, list) else key
            if parent[idx] != op["value"]:
                raise ValueError(f"test failed at {op}")
        elif isinstance(parent, list):
            if kind == "add":
                parent.insert(len(parent) if key == "-" else int(key), copy.deepcopy(op["value"]))
            elif kind == "replace":
                parent[int(key)] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[int(key)]
        else:
            if kind in ("add", "replace"):
                if kind == "replace" and key not in parent:
                    raise ValueError(f"replace of a missing member: {op}")
                parent[key] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[key]
            else:
                raise ValueError(f"unsupported op {op}")
    return doc


def patched_object(review: dict, answer: dict) -> dict:
    """The object as the API server would store it after this answer's patch."""
    response = answer.get("response") or {}
    if not response.get("allowed", False):
        raise ValueError(f"review not allowed: {response.get('status')}")
    if response.get("uid") != review["request"]["uid"]:
        raise ValueError("response uid does not match the request uid")
    obj = review["request"]["object"]
    patch = response.get("patch")
    if not patch:
        return obj
    if response.get("patchType") != "JSONPatch":
        raise ValueError(f"unexpected patchType {response.get('patchType')!r}")
    return apply_patch(obj, json.loads(base64.b64decode(patch)))


def _resources(lst) -> dict:
    return {k: quantity(v) for k, v in (lst or {}).items()}


def _annotation_value(name: str, text: str | None):
    if text is None:
        return None
    if not text.lstrip().startswith("{"):
        value = _listed_annotation(name, text)
        if value is None:
            return ("unparsable", text)
    else:
        try:
            value = json.loads(text)
        except ValueError:
            return ("unparsable", text)
    if name.endswith("raw-allocatable") and isinstance(value, dict):
        return _resources(value)
    if name.endswith("applied") and isinstance(value, dict):
        ratios = value.get("ratios") or value.get("nodeRatios") or {}
        return {"policy": value.get("policy"), "ratios": {k: Fraction(str(v)) for k, v in ratios.items()}}
    return value


def _listed_annotation(name: str, text: str):
    """The listed format (cpu=4,memory=16Gi; policy=batch;ratios=cpu=2) as the JSON one reads."""
    def pairs(part: str):
        if part == "":
            return {}
        out = {}
        for entry in part.split(","):
            k, sep, v = entry.partition("=")
            if not sep or not k or not v or k in out:
                return None
            out[k] = v
        return out
    if name.endswith("raw-allocatable"):
        return pairs(text)
    sections = dict(s.partition("=")[::2] for s in text.split(";"))
    ratios = pairs(sections.get("ratios", ""))
    if "policy" not in sections or ratios is None:
        return None
    return {"policy": sections["policy"], "ratios": ratios}


def essence(obj: dict) -> dict:
    """What the mutation decides, in spelling-independent form."""
    kind = obj.get("kind")
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    if kind == "Node":
        return {
            "allocatable": _resources((obj.get("status") or {}).get("allocatable")),
            "capacity": _resources((obj.get("status") or {}).get("capacity")),
            "annotations": {
                k: _annotation_value(k, annotations.get(k))
                for k in ("overcommit.dev/raw-allocatable", "overcommit.dev/applied")
            },
        }
    if kind == "Pod":
        spec = obj.get("spec") or {}
        out = {}
        for group in ("initContainers", "containers"):
            for c in spec.get(group) or []:
                res = c.get("resources") or {}
                out[f"{group}/{c['name']}"] = {
                    "requests": _resources(res.get("requests")),
                    "limits": _resources(res.get("limits")),
                }
        return out
    raise ValueError(f"unexpected kind {kind!r}")


def describe(e) -> str:
    def conv(v):
        if isinstance(v, Fraction):
            if v.denominator == 1:
                return str(v.numerator)
            from decimal import Decimal, getcontext
            getcontext().prec = 40
            return format(Decimal(v.numerator) / Decimal(v.denominator), "f")
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        return v
    return json.dumps(conv(e), sort_keys=True)
