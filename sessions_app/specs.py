"""The launch spec: the fields a session is created from, as the API, the
launch dialog and session templates share them.

Per-role specs: the top-level ``image`` and ``resources`` apply to every
kernel; ``roles.main`` and ``roles.sub`` override them for main1 and for the
sub kernels (a role's ``resources`` override the common ones key by key), and
``roles.sub.replicas`` is the number of sub kernels (``cluster_size`` =
replicas + 1 unless given).

Merging a template with launch overrides (``merge_spec``), field by field:

- a top-level field given at launch replaces the template's;
- except the mappings ``resources`` and ``env``, merged key by key: an
  override of ``mem`` keeps the template's ``cpu``; an env var set at launch
  is added to the template's (or replaces the one of that name);
- ``roles`` merges per role the same way (``image`` / ``replicas`` replaced,
  ``resources`` merged key by key);
- lists (``mounts``, ``depends_on``) are replaced whole, never appended to;
- a field given as null (or not given) keeps the template's value.
"""

from __future__ import annotations

import copy
import reprlib
from typing import Any

import jsonschema

from agent import protocol
from bai_common.jsonlimits import lone_surrogate_at

# Field name -> JSON schema. Unknown fields are refused with their name. Every
# string, number, list and mapping is bounded here, where a spec enters (the
# API, template import), so nothing unbounded reaches the database or a pass.
# ``x-errors`` words a failed check for users: validator -> message, formatted
# with ``value`` (the bad value) and ``key`` (its name inside a mapping).
# No NUL: PostgreSQL cannot store it. (Line breaks are allowed, so Python's
# ``$``, which also matches before a final line break, lets nothing through.)
# Lone surrogates, which UTF-8 cannot encode, are refused by ``spec_errors``
# anywhere in a spec: a pattern for them is one that API tools cannot use.
NO_NUL = "^[^\\x00]*$"
INVALID_UNICODE = "holds invalid Unicode (a lone surrogate)"
MAX_CLUSTER_SIZE = 256
MAX_BATCH_TIMEOUT = 366 * 86400  # seconds
MAX_ENV_VARS = 128
MAX_ENV_VALUE = 8192
MAX_LIST = 64


def _text(max_length: int, **extra: Any) -> dict[str, Any]:
    words = {
        "maxLength": f"at most {max_length} characters",
        "pattern": "must not contain a NUL character",
    }
    return {
        "type": "string",
        "maxLength": max_length,
        "pattern": NO_NUL,
        "x-errors": words,
        **extra,
    }


_NAME_WORDS = {
    "maxLength": "{value!r}: the name is too long",
    "pattern": "{value!r}: a name must not hold a NUL character",
}
_SLOT_VALUE = {
    "type": ["string", "number"],
    "maxLength": 64,
    "pattern": NO_NUL,
    "x-errors": {
        "type": "{key}: {value!r} is not a number",
        "pattern": "{key}: {value!r} is not a number",
    },
}
_SLOTS = {
    "type": "object",
    "maxProperties": 32,
    "propertyNames": {"maxLength": 64, "pattern": NO_NUL, "x-errors": _NAME_WORDS},
    "additionalProperties": _SLOT_VALUE,
    "x-errors": {"type": 'must be an object like {{"cpu": 1, "mem": "1g"}}'},
}
_ROLE = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "image": _text(255, minLength=1),
        "resources": _SLOTS,
        "replicas": {"type": "integer", "minimum": 0, "maximum": MAX_CLUSTER_SIZE - 1},
    },
}
ROLE_PROPERTIES: dict[str, Any] = _ROLE["properties"]
SPEC_PROPERTIES: dict[str, Any] = {
    "name": {
        **_text(64),
        "x-errors": {
            "type": "use up to 64 letters, digits, '.', '_' or '-', starting with a letter or digit",
            "maxLength": "use up to 64 letters, digits, '.', '_' or '-', starting with a letter or digit",
            "pattern": "use up to 64 letters, digits, '.', '_' or '-', starting with a letter or digit",
        },
    },
    "image": _text(255, minLength=1),
    "type": {"enum": ["interactive", "batch", "inference", "system"]},
    "cluster_mode": {"enum": ["single-node", "multi-node"]},
    "cluster_size": {
        "type": "integer",
        "minimum": 1,
        "maximum": MAX_CLUSTER_SIZE,
        "x-errors": {
            "type": "{value!r} is not a whole number",
            "minimum": "must be at least 1 (got {value})",
            "maximum": f"at most {MAX_CLUSTER_SIZE} containers (got {{value}})",
        },
    },
    "resources": _SLOTS,
    "resource_group": _text(64),
    "mounts": {
        "type": "array",
        "maxItems": MAX_LIST,
        "items": {
            # A folder name, or "owner/name" for a folder shared with the user.
            **_text(215),
            "x-errors": {
                "type": "{value!r} is not a folder name (a path outside your folders is never mounted)"
            },
        },
        "x-errors": {"type": "must be a list of folder names"},
    },
    "env": {
        "type": "object",
        "maxProperties": MAX_ENV_VARS,
        "propertyNames": {"maxLength": 256, "pattern": NO_NUL, "x-errors": _NAME_WORDS},
        "additionalProperties": {
            **_text(MAX_ENV_VALUE),
            "x-errors": {
                "type": "{key}: the value must be a string",
                "maxLength": f"{{key}}: the value is longer than {MAX_ENV_VALUE} characters",
                "pattern": "{key}: the value holds a NUL character",
            },
        },
        "x-errors": {
            "type": "must be an object of NAME: value",
            "maxProperties": f"at most {MAX_ENV_VARS} variables",
        },
    },
    "startup_command": _text(65536),
    "depends_on": {
        "type": "array",
        "maxItems": MAX_LIST,
        "items": _text(64),
        "x-errors": {"type": "must be a list of session ids"},
    },
    "starts_at": {"type": ["string", "null"], "maxLength": 64, "pattern": NO_NUL},
    "batch_timeout": {
        "type": ["number", "null"],
        "exclusiveMinimum": 0,
        "maximum": MAX_BATCH_TIMEOUT,
        "x-errors": {
            "type": "must be a positive number of seconds",
            "exclusiveMinimum": "must be a positive number of seconds",
            "maximum": f"must be at most {MAX_BATCH_TIMEOUT} seconds (366 days)",
        },
    },
    "roles": {
        "type": "object",
        "additionalProperties": False,
        "properties": {"main": _ROLE, "sub": _ROLE},
    },
    # The user's own service ports of main1 ("preopen"); launch.py judges their meaning.
    "ports": {
        "type": "array",
        "maxItems": 4,
        "items": {
            "type": "integer",
            "minimum": 1024,
            "maximum": 65535,
            "x-errors": {
                "type": "{value!r} is not a port number",
                "minimum": "{value}: a port must be from 1024 to 65535",
                "maximum": "{value}: a port must be from 1024 to 65535",
            },
        },
        "x-errors": {"type": "must be a list of port numbers", "maxItems": "at most 4 ports"},
    },
}
SPEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": SPEC_PROPERTIES,
}
# A template's own fields. Its name becomes a file name on export
# (Content-Disposition), so no control character may hide in it.
TEMPLATE_NAME: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": 64,
    # Python's ``$`` also matches before a final line break: the service
    # (``templates.validate_template_fields``) checks the whole name, and
    # lone surrogates, too.
    "pattern": "^[^\\x00-\\x1f\\x7f]*$",
    "x-errors": {
        "minLength": "is required",
        "maxLength": "at most 64 characters",
        "pattern": "must not contain line breaks, tabs or other control characters",
    },
}
TEMPLATE_DESCRIPTION: dict[str, Any] = _text(255)
# A launch: a spec, plus the template it starts from and (admins only) the
# agents it is pinned to.
LAUNCH_PROPERTIES: dict[str, Any] = {
    **SPEC_PROPERTIES,
    "template": {"type": ["string", "integer"], "maxLength": 32, "minimum": 1},
    "agents": {
        "type": "array",
        "maxItems": MAX_LIST,
        "items": _text(64, minLength=1),
        "x-errors": {"type": "must be a list of agent ids"},
    },
}
LAUNCH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": LAUNCH_PROPERTIES,
}

# A code run (``POST /sessions/{id}/execute/``, ``sessions_app.execution``). Code
# and commands may hold any text (a NUL too: they are never stored); their utf-8
# size is the service's to judge against ``BAI_EXEC_MAX_CODE``.
EXEC_MODES = list(protocol.EXEC_MODES)
RUN_ID_PATTERN = "^[A-Za-z0-9_-]+$"
_MODE_WORDS = f"must be one of {', '.join(EXEC_MODES)}"
_COMMAND_WORDS = f"at most {protocol.EXEC_COMMAND_MAX} characters"
EXECUTE_PROPERTIES: dict[str, Any] = {
    "mode": {
        "type": "string",
        "enum": EXEC_MODES,
        "x-errors": {"type": _MODE_WORDS, "enum": _MODE_WORDS},
    },
    "code": {
        "type": "string",
        "maxLength": protocol.EXEC_CODE_MAX,
        "x-errors": {
            "type": "must be a string",
            "maxLength": f"at most {protocol.EXEC_CODE_MAX} characters",
        },
    },
    "run_id": {
        "type": ["string", "null"],
        "minLength": 1,
        "maxLength": protocol.RUN_ID_MAX,
        "pattern": RUN_ID_PATTERN,
        "x-errors": {
            "type": "must be a run id (a string) or null",
            "minLength": "must not be empty",
            "maxLength": f"at most {protocol.RUN_ID_MAX} characters",
            "pattern": "use letters, digits, '_' and '-' only",
        },
    },
    "options": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "build": {
                "type": "string",
                "maxLength": protocol.EXEC_COMMAND_MAX,
                "x-errors": {
                    "type": "must be a shell command (a string)",
                    "maxLength": _COMMAND_WORDS,
                },
            },
            "exec": {
                "type": "string",
                "maxLength": protocol.EXEC_COMMAND_MAX,
                "x-errors": {
                    "type": "must be a shell command (a string)",
                    "maxLength": _COMMAND_WORDS,
                },
            },
            "timeout": {
                "type": "number",
                "minimum": 0,
                "maximum": protocol.EXEC_TIMEOUT_MAX,
                "x-errors": {
                    "type": "must be a number of seconds (0: no limit)",
                    "minimum": "must be a number of seconds (0: no limit)",
                    "maximum": f"at most {protocol.EXEC_TIMEOUT_MAX:.0f} seconds (a day)",
                },
            },
            "cursor_pos": {
                "type": "integer",
                "minimum": 0,
                "maximum": protocol.EXEC_CODE_MAX,
                "x-errors": {
                    "type": "must be a whole number (a position in the code)",
                    "minimum": "must be a position in the code (0 or more)",
                    "maximum": "must be a position in the code",
                },
            },
        },
        "x-errors": {"type": 'must be an object like {{"timeout": 60}}'},
    },
}
EXECUTE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["mode"],
    "properties": EXECUTE_PROPERTIES,
}


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80


class _Shown:
    """A bad value as a message shows it: cut short (it may be 60 KB of text)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return _SHORT.repr(self.value)

    def __str__(self) -> str:
        text = str(self.value)
        return text if len(text) <= 80 else repr(self)


def error_message(error: jsonschema.ValidationError) -> str:
    """A failed schema check in users' words (``x-errors``), else the validator's,
    with the bad value cut short."""
    template = (error.schema.get("x-errors") or {}).get(error.validator)
    if template is None:
        message = str(error.message)
        whole = repr(error.instance)
        if len(whole) > 80 and message.startswith(whole):
            message = repr(_Shown(error.instance)) + message[len(whole) :]
        return message
    key = error.absolute_path[-1] if error.absolute_path else ""
    return str(template).format(value=_Shown(error.instance), key=_Shown(key))


def spec_errors(spec: Any, schema: dict[str, Any] = LAUNCH_SCHEMA) -> dict[str, list[str]]:
    """The shape errors of a launch spec, keyed by the field a user knows:
    the top-level field (``resources``, ``env``), or under ``roles`` the role's
    field (``roles.sub.replicas``); an unknown field by its own name."""
    errors: dict[str, list[str]] = {}
    validator = jsonschema.Draft202012Validator(schema)
    for error in sorted(validator.iter_errors(spec), key=lambda e: [str(p) for p in e.path]):
        path = [str(p) for p in error.absolute_path]
        if error.validator == "additionalProperties" and not path:
            for name in sorted(set(spec) - set(schema["properties"])):
                errors.setdefault(name, []).append("unknown field")
            continue
        if error.validator == "required" and not path:
            for name in schema["required"]:
                if name not in spec:
                    errors.setdefault(name, []).append("is required")
            continue
        errors.setdefault(_field(path), []).append(error_message(error))
    if not errors and (where := lone_surrogate_at(spec)) is not None:
        errors[_field([str(p) for p in where])] = [INVALID_UNICODE]
    return errors


# Fields whose errors name their inner field too: ``roles.sub.replicas``, ``options.timeout``.
_NESTED_FIELDS = {"roles": 3, "options": 2}


def _field(path: list[str]) -> str:
    if not path:
        return "spec"
    return ".".join(path[: _NESTED_FIELDS.get(path[0], 1)])


MERGED_MAPPINGS = ("resources", "env")


def merge_spec(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A template's spec with launch overrides applied (see module docstring)."""
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if value is None:
            continue
        if key in MERGED_MAPPINGS and isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        elif key == "roles" and isinstance(value, dict) and isinstance(merged.get("roles"), dict):
            roles = merged["roles"]
            for role, role_spec in value.items():
                current = roles.get(role)
                if not isinstance(role_spec, dict) or not isinstance(current, dict):
                    roles[role] = copy.deepcopy(role_spec)  # validation judges it
                    continue
                combined = {**current, **{k: v for k, v in role_spec.items() if v is not None}}
                if isinstance(current.get("resources"), dict) and isinstance(
                    role_spec.get("resources"), dict
                ):
                    combined["resources"] = {**current["resources"], **role_spec["resources"]}
                roles[role] = copy.deepcopy(combined)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def openapi_schema(schema: Any) -> Any:
    """The same schema for the API's documentation (OpenAPI 3.1, whose schemas
    are JSON Schema 2020-12 like these: every bound is documented as it is
    enforced). The users' words (``x-errors``) stay server-side: they reach
    users in the error responses, and a mapping with a ``pattern`` key inside
    a schema reads as a regular expression to tools."""
    if isinstance(schema, list):
        return [openapi_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    return {key: openapi_schema(value) for key, value in schema.items() if key != "x-errors"}
