"""Session templates: validation against the launch-spec schema, and import /
export as YAML or JSON with errors that name the field and the line.

A template document is ``{"name": str, "description": str?, "spec": {...}}``
where ``spec`` follows ``specs.SPEC_SCHEMA``.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import yaml

from .errors import InvalidInput
from .specs import SPEC_SCHEMA

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


def _describe(error: jsonschema.ValidationError) -> tuple[str, str]:
    path = ".".join(str(p) for p in error.absolute_path)
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        name = f"{path}.{extra[0]}" if path else extra[0]
        return name, f"unknown field {extra[0]!r}"
    return path or "document", error.message


def validate_template_spec(spec: Any) -> dict[str, Any]:
    """Refuse a spec that does not follow the schema, naming the field."""
    errors = sorted(
        jsonschema.Draft202012Validator(SPEC_SCHEMA).iter_errors(spec), key=lambda e: e.path
    )
    if errors:
        fields: dict[str, list[str]] = {}
        for error in errors:
            name, message = _describe(error)
            fields.setdefault(f"spec.{name}", []).append(message)
        first = next(iter(fields.items()))
        raise InvalidInput(f"{first[0]}: {first[1][0]}", fields)
    return spec


def _line_of(node: yaml.Node | None, path: list[Any]) -> int | None:
    """1-based line of the YAML node at ``path`` (or of its deepest parent)."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in path:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if k.value == part), None)
            key = next((k for k, _ in node.value if k.value == part), None)
            if match is None:
                return line
            line = (key or match).start_mark.line + 1
            node = match
        elif (
            isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value)
        ):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def parse_template_document(text: str, fmt: str) -> dict[str, Any]:
    """Parse and validate an imported template. Errors name the field and line."""
    node = None
    try:
        if fmt == "json":
            data = json.loads(text)
        else:
            node = yaml.compose(text, Loader=yaml.SafeLoader)
            data = yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"line {exc.lineno}: invalid JSON: {exc.msg}", {"document": [str(exc)]}
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        raise InvalidInput(f"{where}invalid YAML: {exc}", {"document": [str(exc)]}) from None
    validator = jsonschema.Draft202012Validator(DOCUMENT_SCHEMA)
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        fields: dict[str, list[str]] = {}
        for error in errors:
            name, message = _describe(error)
            path = list(error.absolute_path)
            if error.validator == "additionalProperties":
                path.append(name.rsplit(".", 1)[-1])
            line = _line_of(node, path) if node is not None else _json_line(text, path)
            fields.setdefault(name, []).append(f"line {line}: {message}" if line else message)
        first = next(iter(fields.items()))
        raise InvalidInput(f"{first[0]}: {first[1][0]}", fields)
    return data


def _json_line(text: str, path: list[Any]) -> int | None:
    """Best effort: the line of the last key of ``path`` in a JSON text."""
    keys = [p for p in path if isinstance(p, str)]
    if not keys:
        return None
    needle = json.dumps(keys[-1]) + ":"
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line.replace(" :", ":"):
            return number
    return None


def export_template_document(*, name: str, description: str, spec: dict[str, Any], fmt: str) -> str:
    document = {"name": name, "description": description, "spec": spec}
    if fmt == "json":
        return json.dumps(document, indent=2, sort_keys=False) + "\n"
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True)
