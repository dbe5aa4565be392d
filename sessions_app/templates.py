"""Session templates: validation against the launch-spec schema, and import /
export as YAML or JSON with errors that name the field and the line.

A template document is ``{"name": str, "description": str?, "spec": {...}}``
where ``spec`` follows ``specs.SPEC_SCHEMA``. Export writes the spec's fields
in the schema's order, so an exported document reads like the launch dialog;
exporting what an export imported gives the same text again.

Import refuses, with the line: unknown fields (suggesting the likely name),
values of the wrong type, keys given twice, and YAML anchors/aliases (a few
lines of aliases can expand to gigabytes). YAML timestamps stay strings, as
the schema wants (``starts_at: 2030-01-01T09:00:00Z`` needs no quotes).

A hostile document costs little: its text is bounded (``MAX_DOCUMENT_CHARS``),
its nesting is bounded while it is scanned, before any Python object exists
(``MAX_DEPTH``: PyYAML's scanner is quadratic in the depth of flow
collections, and both parsers recurse), and so are its numbers: an integer of
more than ``MAX_DIGITS`` digits, a non-finite number (``.inf``, ``.nan``,
``NaN``, ``Infinity``, ``1e309``) and any YAML tag beyond plain strings,
numbers, booleans, null, mappings and lists (``!!python/...``) are refused
with the field and the line.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import yaml

from bai_common.jsonlimits import lone_surrogate, lone_surrogate_at, nesting_beyond

from .errors import InvalidInput
from .slots import SlotError, parse_slot_value
from .specs import (
    INVALID_UNICODE,
    ROLE_PROPERTIES,
    SPEC_PROPERTIES,
    SPEC_SCHEMA,
    TEMPLATE_DESCRIPTION,
    TEMPLATE_NAME,
    error_message,
)

DOCUMENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "spec"],
    "properties": {
        "name": TEMPLATE_NAME,
        "description": TEMPLATE_DESCRIPTION,
        "spec": SPEC_SCHEMA,
    },
}
FORMATS = ("yaml", "json")
MAX_DOCUMENT_CHARS = 64 * 1024
# A template is four levels deep (document, spec, roles, role, resources):
# anything near this bound is an attack, not a template.
MAX_DEPTH = 32
MAX_DIGITS = 300
_YAML = "tag:yaml.org,2002:"
# The tags a template's values may carry: what JSON has, no more.
PLAIN_TAGS = frozenset(
    _YAML + kind for kind in ("str", "int", "float", "bool", "null", "map", "seq")
)


class _Loader(yaml.CSafeLoader):
    """LibYAML's safe loader (its parser is C and keeps no recursion), without
    implicit timestamps: dates stay the strings the schema expects."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _describe(error: jsonschema.ValidationError) -> tuple[str, str]:
    path = ".".join(str(p) for p in error.absolute_path)
    if error.validator == "additionalProperties":
        known = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(known))
        name = f"{path}.{extra[0]}" if path else (extra[0] or "document")
        message = f"unknown field {extra[0]!r}"
        close = difflib.get_close_matches(str(extra[0]), known, n=1)
        if close:
            message += f" (did you mean {close[0]!r}?)"
        return name, message
    if error.validator == "required":
        missing = str(error.message).split("'")[1] if "'" in error.message else ""
        name = f"{path}.{missing}" if path and missing else (missing or path or "document")
        return name, "is required"
    return path or "document", error_message(error)


def validate_template_spec(spec: Any) -> dict[str, Any]:
    """Refuse a spec that does not follow the schema, or whose resource amounts
    do not read as amounts (``mem: 2 gigs``), naming the field."""
    errors = sorted(
        jsonschema.Draft202012Validator(SPEC_SCHEMA).iter_errors(spec), key=lambda e: e.path
    )
    fields: dict[str, list[str]] = {}
    for error in errors:
        name, message = _describe(error)
        fields.setdefault(f"spec.{name}", []).append(message)
    if not fields:
        fields = _amount_errors(spec)
    if fields:
        first = next(iter(fields.items()))
        raise InvalidInput(f"{first[0]}: {first[1][0]}", fields)
    if (where := lone_surrogate_at(spec)) is not None:
        name = ".".join(["spec", *map(str, where)])
        raise InvalidInput(f"{name}: {INVALID_UNICODE}", {name: [INVALID_UNICODE]})
    return spec


def _amount_errors(spec: dict[str, Any]) -> dict[str, list[str]]:
    """Amounts are read as the launch reads them, so a template that saves does
    not fail only when launched. Slot names stay free: which slots exist is the
    launching installation's to say."""
    roles = spec.get("roles") or {}
    places = [("spec.resources", spec.get("resources"))] + [
        (f"spec.roles.{role}.resources", (roles.get(role) or {}).get("resources"))
        for role in ("main", "sub")
    ]
    fields: dict[str, list[str]] = {}
    for field, slots in places:
        for slot, value in (slots or {}).items():
            try:
                parse_slot_value(slot, value)
            except SlotError as exc:
                fields.setdefault(field, []).append(f"{slot}: {exc.message}")
    return fields


_FIELDS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": TEMPLATE_NAME, "description": TEMPLATE_DESCRIPTION},
}
# The whole name, as the schema's pattern says (whose ``$`` Python lets match
# before a final line break).
_NAME_CHARACTERS = re.compile(r"[^\x00-\x1f\x7f]*")


def validate_template_fields(*, name: Any, description: Any) -> None:
    """Refuse a name or description that could not be stored, or a name that
    could not be a file name on export, naming the field."""
    fields: dict[str, list[str]] = {}
    validator = jsonschema.Draft202012Validator(_FIELDS_SCHEMA)
    for error in validator.iter_errors({"name": name, "description": description}):
        fields.setdefault(str(error.absolute_path[0]), []).append(error_message(error))
    if "name" not in fields and not name.strip():
        fields["name"] = ["is required"]
    elif "name" not in fields and not _NAME_CHARACTERS.fullmatch(name):
        fields["name"] = [TEMPLATE_NAME["x-errors"]["pattern"]]
    for field, value in (("name", name), ("description", description)):
        if field not in fields and lone_surrogate(value):
            fields[field] = [INVALID_UNICODE]
    if fields:
        first = next(iter(fields.items()))
        raise InvalidInput(f"{first[0]}: {first[1][0]}", fields)


# --- import -----------------------------------------------------------------


def parse_template_document(text: str, fmt: str) -> dict[str, Any]:
    """Parse and validate an imported template. Errors name the field and line."""
    if fmt not in FORMATS:
        raise InvalidInput("format: use yaml or json", {"format": ["use yaml or json"]})
    if len(text) > MAX_DOCUMENT_CHARS:
        message = f"at most {MAX_DOCUMENT_CHARS} characters (got {len(text)})"
        raise InvalidInput(f"document: {message}", {"document": [message]})
    if lone_surrogate(text):
        message = "the text is not valid Unicode (it holds a lone surrogate)"
        raise InvalidInput(f"document: {message}", {"document": [message]})
    if fmt == "json":
        data = _load_json(text)
        node = _compose_quietly(text)  # JSON is YAML: used only to find lines
        _refuse_marked_values(data, node)
    else:
        data, node = _load_yaml(text)
    validator = jsonschema.Draft202012Validator(DOCUMENT_SCHEMA)
    errors = sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        fields: dict[str, list[str]] = {}
        for error in errors:
            name, message = _describe(error)
            path = list(error.absolute_path)
            if error.validator in ("additionalProperties", "required"):
                path.append(name.rsplit(".", 1)[-1])
            line = _line_of(node, path)
            fields.setdefault(name, []).append(f"line {line}: {message}" if line else message)
        first = next(iter(fields.items()))
        raise InvalidInput(f"{first[0]}: {first[1][0]}", fields)
    if (where := lone_surrogate_at(data)) is not None:
        _refuse([(".".join(map(str, where)), _line_of(node, list(where)), INVALID_UNICODE)])
    try:  # what the schema's pattern cannot say (a final line break in the name)
        validate_template_fields(name=data["name"], description=data.get("description", ""))
    except InvalidInput as exc:
        _refuse(
            [
                (field, _line_of(node, [field]), message)
                for field, messages in exc.fields.items()
                for message in messages
            ]
        )
    return data


def _refuse(problems: list[tuple[str, int | None, str]]) -> None:
    """``(field, line, message)`` in document order, as one InvalidInput."""
    if not problems:
        return
    fields: dict[str, list[str]] = {}
    for name, line, message in sorted(problems, key=lambda p: p[1] or 0):
        fields.setdefault(name, []).append(f"line {line}: {message}" if line else message)
    first = next(iter(fields.items()))
    raise InvalidInput(f"{first[0]}: {first[1][0]}", fields)


# JSON: the depth is counted on the text, before the recursive decoder runs;
# numbers the decoder would make unbounded or non-finite come back marked.


class _Marked:
    """A JSON value refused while decoding, kept so the error can name its field."""

    def __init__(self, message: str) -> None:
        self.message = message


def _json_int(digits: str) -> int | _Marked:
    count = len(digits.lstrip("-"))
    if count > MAX_DIGITS:
        return _Marked(f"a number of {count} digits; at most {MAX_DIGITS}")
    return int(digits)


def _json_float(text: str) -> float | _Marked:
    value = float(text)
    return value if math.isfinite(value) else _Marked(f"{text} is out of range")


def _load_json(text: str) -> Any:
    too_deep = nesting_beyond(text, MAX_DEPTH)
    if too_deep is not None:
        line = text.count("\n", 0, too_deep) + 1
        message = f"line {line}: nested deeper than {MAX_DEPTH} levels"
        raise InvalidInput(message, {"document": [message]})

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                line = _json_line(text, key)
                where = f"line {line}: " if line else ""
                raise InvalidInput(f"{key}: {where}given twice", {key: [f"{where}given twice"]})
            seen[key] = value
        return seen

    try:
        return json.loads(
            text,
            object_pairs_hook=no_duplicates,
            parse_int=_json_int,
            parse_float=_json_float,
            parse_constant=lambda name: _Marked(f"{name} is not a number"),
        )
    except json.JSONDecodeError as exc:
        message = f"line {exc.lineno}: invalid JSON: {exc.msg}"
        raise InvalidInput(message, {"document": [message]}) from None


def _refuse_marked_values(data: Any, node: yaml.Node | None) -> None:
    problems = []
    stack: list[tuple[tuple[Any, ...], Any]] = [((), data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, _Marked):
            name = ".".join(str(p) for p in path) or "document"
            problems.append((name, _line_of(node, list(path)), value.message))
        elif isinstance(value, dict):
            stack.extend(((*path, key), item) for key, item in value.items())
        elif isinstance(value, list):
            stack.extend(((*path, index), item) for index, item in enumerate(value))
    _refuse(problems)


# YAML: the events are read first (LibYAML makes them without recursion),
# stopping at the first anchor or the first level too deep; then the document
# is composed to nodes (which keep their lines), every node is checked, and
# only then built into Python objects.


def _load_yaml(text: str) -> tuple[Any, yaml.Node | None]:
    try:
        _refuse_anchors_and_depth(text)
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None, None
            _refuse_unsafe_nodes(loader, node)
            return loader.construct_document(node), node
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        message = f"{where}invalid YAML: {problem}"
        raise InvalidInput(message, {"document": [message]}) from None


def _refuse_anchors_and_depth(text: str) -> None:
    depth = 0
    for event in yaml.parse(text, Loader=_Loader):
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            message = f"line {line}: YAML anchors and aliases are not supported"
            raise InvalidInput(message, {"document": [message]})
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                message = f"line {line}: nested deeper than {MAX_DEPTH} levels"
                raise InvalidInput(message, {"document": [message]})
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _compose_quietly(text: str) -> yaml.Node | None:
    try:
        return yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError:
        return None


def _nodes(root: yaml.Node) -> Iterator[tuple[tuple[str, ...], yaml.Node]]:
    """Every node with its path, in document order; a key has its mapping's path."""
    stack: list[tuple[tuple[str, ...], yaml.Node]] = [((), root)]
    while stack:
        path, node = stack.pop()
        yield path, node
        if isinstance(node, yaml.MappingNode):
            for key, value in reversed(node.value):
                stack.append(((*path, str(key.value)), value))
                stack.append((path, key))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(
                ((*path, str(i)), item) for i, item in reversed(list(enumerate(node.value)))
            )


def _refuse_unsafe_nodes(loader: _Loader, root: yaml.Node) -> None:
    """Refuse what building the document would choke on, or should never build:
    foreign tags, keys that are not plain values, keys given twice, numbers
    too long or not finite, and explicit tags on values that do not fit them."""
    problems: list[tuple[str, int | None, str]] = []
    for path, node in _nodes(root):
        problem = _node_problem(loader, node)
        if problem is not None:
            problems.append((".".join(path) or "document", node.start_mark.line + 1, problem))
        elif isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key, _value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag in PLAIN_TAGS:
                    # Every key of a template is a name: ``ON:``, ``1:`` or an
                    # empty key stay the text they are, not True, 1 or None.
                    key.tag = _YAML + "str"
                if not isinstance(key, yaml.ScalarNode):
                    line = key.start_mark.line + 1
                    problems.append(
                        (
                            ".".join(path) or "document",
                            line,
                            "a key must be a plain value, not a list or a mapping",
                        )
                    )
                elif key.value in seen:
                    name = ".".join((*path, str(key.value)))
                    problems.append((name, key.start_mark.line + 1, "given twice"))
                else:
                    seen.add(key.value)
        if len(problems) >= 20:
            break
    _refuse(problems)


_PLAIN = (True, False)  # a plain scalar, for the resolver


def _node_problem(loader: _Loader, node: yaml.Node) -> str | None:
    if node.tag not in PLAIN_TAGS:
        return f"the tag {node.tag.replace(_YAML, '!!')} is not allowed (plain values only)"
    if not isinstance(node, yaml.ScalarNode) or node.tag == _YAML + "str":
        return None
    kind = node.tag.removeprefix(_YAML)
    if kind == "int":
        digits = sum(c.isdigit() for c in node.value)
        if digits > MAX_DIGITS:
            return f"a number of {digits} digits; at most {MAX_DIGITS}"
    # A value given its tag by the resolver fits it, except a float that
    # overflows; one tagged by hand (``!!int abc``) is tried.
    if kind != "float" and loader.resolve(yaml.ScalarNode, node.value, _PLAIN) == node.tag:
        return None
    try:
        value = loader.construct_object(node)
    except (ValueError, KeyError, yaml.YAMLError):
        return f"{node.value!r} is not a valid {kind}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{node.value} is not a finite number"
    return None


def _line_of(node: yaml.Node | None, path: list[Any]) -> int | None:
    """1-based line of the node at ``path`` (or of its deepest parent present)."""
    if node is None:
        return None
    line = node.start_mark.line + 1
    for part in path:
        if isinstance(node, yaml.MappingNode):
            pair = next(((k, v) for k, v in node.value if k.value == str(part)), None)
            if pair is None:
                return line
            line = pair[0].start_mark.line + 1
            node = pair[1]
        elif (
            isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value)
        ):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _json_line(text: str, key: str) -> int | None:
    """Best effort, for JSON that YAML cannot read: the last line naming ``key``."""
    needle = json.dumps(key)
    found = None
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            found = number
    return found


# --- export -----------------------------------------------------------------


def export_template_document(*, name: str, description: str, spec: dict[str, Any], fmt: str) -> str:
    document = {"name": name, "description": description, "spec": _ordered_spec(spec)}
    if fmt == "json":
        return json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    text = yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=100)
    if yaml.load(text, Loader=_Loader) != document:  # a SafeLoader
        # PyYAML writes some characters (NEL, LS, PS) raw, and reads them back
        # as line breaks: escape everything beyond ASCII instead.
        text = yaml.safe_dump(document, sort_keys=False, allow_unicode=False, width=100)
    return text


def _ordered_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec's fields in the schema's order (roles: main, then sub)."""
    ordered = _in_order(spec, list(SPEC_PROPERTIES))
    roles = ordered.get("roles")
    if isinstance(roles, dict):
        ordered["roles"] = {
            role: _in_order(value, list(ROLE_PROPERTIES)) if isinstance(value, dict) else value
            for role, value in _in_order(roles, ["main", "sub"]).items()
        }
    return ordered


def _in_order(mapping: dict[str, Any], order: list[str]) -> dict[str, Any]:
    rank = {key: i for i, key in enumerate(order)}
    return dict(sorted(mapping.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0])))
