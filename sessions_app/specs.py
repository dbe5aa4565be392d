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
from typing import Any

# Field name -> JSON schema. Unknown fields are refused with their name.
_SLOTS = {
    "type": "object",
    "additionalProperties": {"type": ["string", "number"]},
}
_ROLE = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "image": {"type": "string", "minLength": 1},
        "resources": _SLOTS,
        "replicas": {"type": "integer", "minimum": 0},
    },
}
ROLE_PROPERTIES: dict[str, Any] = _ROLE["properties"]
SPEC_PROPERTIES: dict[str, Any] = {
    "name": {"type": "string"},
    "image": {"type": "string", "minLength": 1},
    "type": {"enum": ["interactive", "batch", "inference", "system"]},
    "cluster_mode": {"enum": ["single-node", "multi-node"]},
    "cluster_size": {"type": "integer"},
    "resources": _SLOTS,
    "resource_group": {"type": "string"},
    "mounts": {"type": "array", "items": {"type": "string"}},
    "env": {"type": "object", "additionalProperties": {"type": "string"}},
    "startup_command": {"type": "string"},
    "depends_on": {"type": "array", "items": {"type": "string"}},
    "starts_at": {"type": ["string", "null"]},
    "batch_timeout": {"type": ["number", "null"], "minimum": 0},
    "roles": {
        "type": "object",
        "additionalProperties": False,
        "properties": {"main": _ROLE, "sub": _ROLE},
    },
}
SPEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": SPEC_PROPERTIES,
}
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
