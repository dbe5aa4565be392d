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
"""

from __future__ import annotations

import difflib
import json
from typing import Any

import jsonschema
import yaml

from .errors import InvalidInput
from .slots import SlotError, parse_slot_value
from .specs import ROLE_PROPERTIES, SPEC_PROPERTIES, SPEC_SCHEMA, error_message

DOCUMENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "spec"],
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 64},
        "description": {"type": "string", "maxLength": 255},
        "spec": SPEC_SCHEMA,
    },
}
FORMATS = ("yaml", "json")


class _Loader(yaml.SafeLoader):
    """SafeLoader without implicit timestamps: dates stay the strings the schema expects."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _describe(error: jsonschema.ValidationError) -> tuple[str, str]:
    path = ".".join(str(p) for p in error.absolute_path)
    if error.validator == "additionalProperties":
        known = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(known))
        name = f"{path}.{extra[0]}" if path else extra[0]
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


# --- import -----------------------------------------------------------------


def parse_template_document(text: str, fmt: str) -> dict[str, Any]:
    """Parse and validate an imported template. Errors name the field and line."""
    if fmt not in FORMATS:
        raise InvalidInput("format: use yaml or json", {"format": ["use yaml or json"]})
    if fmt == "json":
        data = _load_json(text)
        node = _compose_quietly(text)  # JSON is YAML: used only to find lines
    else:
        node = _compose_yaml(text)
        data = yaml.load(text, Loader=_Loader) if node is not None else None  # a SafeLoader
    if node is not None:
        _refuse_duplicate_keys(node)
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
    return data


def _load_json(text: str) -> Any:
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
        return json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as exc:
        message = f"line {exc.lineno}: invalid JSON: {exc.msg}"
        raise InvalidInput(message, {"document": [message]}) from None


def _compose_yaml(text: str) -> yaml.Node | None:
    try:
        for event in yaml.parse(text, Loader=_Loader):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                line = event.start_mark.line + 1
                message = f"line {line}: YAML anchors and aliases are not supported"
                raise InvalidInput(message, {"document": [message]})
        return yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        message = f"{where}invalid YAML: {problem}"
        raise InvalidInput(message, {"document": [message]}) from None


def _compose_quietly(text: str) -> yaml.Node | None:
    try:
        return yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError:
        return None


def _refuse_duplicate_keys(node: yaml.Node, path: tuple[str, ...] = ()) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key, value in node.value:
            name = ".".join((*path, str(key.value)))
            if key.value in seen:
                message = f"line {key.start_mark.line + 1}: given twice"
                raise InvalidInput(f"{name}: {message}", {name: [message]})
            seen.add(key.value)
            _refuse_duplicate_keys(value, (*path, str(key.value)))
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _refuse_duplicate_keys(item, (*path, str(index)))


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
