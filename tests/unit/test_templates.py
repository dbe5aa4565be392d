"""Session templates without a database: merging launch overrides field by
field, parsing YAML/JSON documents with errors that name the field and the
line, and export → import round trips that change nothing."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sessions_app.errors import InvalidInput
from sessions_app.specs import merge_spec
from sessions_app.templates import (
    export_template_document,
    parse_template_document,
    validate_template_spec,
)

BASE = {
    "image": "bai-kernel/python:3.12",
    "type": "batch",
    "resources": {"cpu": "2", "mem": "4g"},
    "env": {"MODE": "train", "SEED": "1"},
    "mounts": ["data", "models"],
    "startup_command": "python train.py",
    "roles": {
        "main": {"resources": {"cpu": "4"}},
        "sub": {"image": "bai-kernel/worker:1", "replicas": 2, "resources": {"mem": "2g"}},
    },
}


# --- merge_spec --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, expected_changes",
    [
        pytest.param(
            {"resources": {"mem": "8g"}},
            {"resources": {"cpu": "2", "mem": "8g"}},
            id="an override of memory only keeps the cpu",
        ),
        pytest.param(
            {"env": {"SEED": "2", "EXTRA": "x"}},
            {"env": {"MODE": "train", "SEED": "2", "EXTRA": "x"}},
            id="env is merged by name",
        ),
        pytest.param(
            {"mounts": ["scratch"]}, {"mounts": ["scratch"]}, id="a list is replaced whole"
        ),
        pytest.param({"mounts": []}, {"mounts": []}, id="an empty list clears the list"),
        pytest.param({"image": "other:1"}, {"image": "other:1"}, id="a scalar is replaced"),
        pytest.param({"startup_command": None}, {}, id="null keeps the template's value"),
        pytest.param(
            {"roles": {"sub": {"replicas": 5}}},
            {
                "roles": {
                    "main": {"resources": {"cpu": "4"}},
                    "sub": {
                        "image": "bai-kernel/worker:1",
                        "replicas": 5,
                        "resources": {"mem": "2g"},
                    },
                }
            },
            id="a role field is replaced and the rest of the role kept",
        ),
        pytest.param(
            {"roles": {"sub": {"resources": {"cpu": "1"}}}},
            {
                "roles": {
                    "main": {"resources": {"cpu": "4"}},
                    "sub": {
                        "image": "bai-kernel/worker:1",
                        "replicas": 2,
                        "resources": {"mem": "2g", "cpu": "1"},
                    },
                }
            },
            id="role resources are merged by slot",
        ),
        pytest.param(
            {"depends_on": ["a"], "cluster_size": 3},
            {"depends_on": ["a"], "cluster_size": 3},
            id="fields the template lacks are added",
        ),
    ],
)
def test_merging_overrides_changes_only_what_was_given(overrides, expected_changes):
    merged = merge_spec(BASE, overrides)
    assert merged == {**BASE, **expected_changes}


def test_merging_never_changes_the_template():
    before = json.loads(json.dumps(BASE))
    merged = merge_spec(BASE, {"resources": {"mem": "1g"}, "roles": {"main": {"image": "x"}}})
    merged["env"]["NEW"] = "1"
    merged["roles"]["sub"]["resources"]["cpu"] = "9"
    assert before == BASE


def test_a_malformed_role_override_is_left_for_validation_to_refuse():
    merged = merge_spec(BASE, {"roles": {"sub": 3}})
    assert merged["roles"]["sub"] == 3


# --- validation and import errors --------------------------------------------------------------

TYPO = """\
name: train
description: nightly training
spec:
  image: bai-kernel/python:3.12
  type: batch
  resorces:
    cpu: 2
  startup_command: python train.py
"""


def refusal(text: str, fmt: str = "yaml") -> InvalidInput:
    with pytest.raises(InvalidInput) as error:
        parse_template_document(text, fmt)
    return error.value


def test_a_yaml_typo_in_a_field_name_is_refused_with_the_name_and_its_line():
    error = refusal(TYPO)
    assert error.fields == {
        "spec.resorces": ["line 6: unknown field 'resorces' (did you mean 'resources'?)"]
    }
    assert error.message == (
        "spec.resorces: line 6: unknown field 'resorces' (did you mean 'resources'?)"
    )


def test_a_typo_inside_a_role_names_the_full_path_and_line():
    text = "name: t\nspec:\n  image: x\n  roles:\n    sub:\n      replica: 2\n"
    error = refusal(text)
    assert error.fields == {
        "spec.roles.sub.replica": ["line 6: unknown field 'replica' (did you mean 'replicas'?)"]
    }


def test_a_json_typo_is_refused_with_the_name_and_its_line():
    text = json.dumps(
        {"name": "t", "spec": {"image": "x", "roles": {"main": {"imgae": "y"}}}}, indent=2
    )
    error = refusal(text, "json")
    (message,) = error.fields["spec.roles.main.imgae"]
    assert message == "line 7: unknown field 'imgae' (did you mean 'image'?)"


def test_a_wrongly_typed_value_names_the_field_and_line():
    text = "name: t\nspec:\n  image: x\n  cluster_size: two\n"
    error = refusal(text)
    assert list(error.fields) == ["spec.cluster_size"]
    assert error.fields["spec.cluster_size"][0].startswith("line 4: 'two' is not a whole number")


def test_a_missing_name_is_refused():
    error = refusal("spec:\n  image: x\n")
    assert error.fields == {"name": ["line 1: is required"]}


def test_a_key_given_twice_is_refused_with_its_line():
    error = refusal("name: t\nspec:\n  image: x\n  image: y\n")
    assert error.fields == {"spec.image": ["line 4: given twice"]}
    error = refusal('{"name": "t",\n "spec": {"image": "x"},\n "name": "u"}', "json")
    assert error.fields == {"name": ["line 3: given twice"]}


def test_broken_yaml_and_json_say_where():
    assert refusal("name: t\nspec: [\n").message.startswith("line 3: invalid YAML")
    assert refusal('{"name": "t",\n', "json").message.startswith("line 2: invalid JSON")


def test_yaml_aliases_are_refused():
    text = "name: t\nspec:\n  env: &e {A: '1'}\n  resources: *e\n"
    assert "anchors and aliases" in refusal(text).message


def test_an_unquoted_yaml_date_stays_a_string():
    text = "name: t\nspec:\n  image: x\n  starts_at: 2030-01-07T09:00:00Z\n"
    assert parse_template_document(text, "yaml")["spec"]["starts_at"] == "2030-01-07T09:00:00Z"


def test_a_document_that_is_not_a_mapping_is_refused():
    assert "document" in refusal("- a\n- b\n").fields


def test_a_spec_is_validated_naming_the_field():
    with pytest.raises(InvalidInput) as error:
        validate_template_spec({"image": "x", "envv": {}})
    assert error.value.fields == {"spec.envv": ["unknown field 'envv' (did you mean 'env'?)"]}


def test_a_spec_whose_amounts_do_not_read_is_refused_naming_the_roles_resources():
    spec = {
        "resources": {"cpu": "1", "mem": "2g"},
        "roles": {"sub": {"resources": {"mem": "2 gigs", "cpu": "-1"}}},
    }
    with pytest.raises(InvalidInput) as error:
        validate_template_spec(spec)
    assert error.value.fields == {
        "spec.roles.sub.resources": [
            "mem: '2 gigs' is not a size (use bytes or a binary unit, e.g. 512m, 4g, 1.5GiB)",
            "cpu: must not be negative (got '-1')",
        ]
    }


def test_a_spec_with_a_slot_this_installation_lacks_is_kept_for_the_launch_to_judge():
    spec = {"resources": {"cpu": 2, "mem": "4g", "tpu.device": "1"}}
    assert validate_template_spec(spec) == spec


# --- round trips -------------------------------------------------------------------------------

TRICKY = {
    "name": "train-ü",
    "image": "bai-kernel/python:3.12",
    "type": "batch",
    "cluster_mode": "multi-node",
    "cluster_size": 3,
    "resources": {"cpu": 2, "mem": "4g", "cuda.shares": "0.5"},
    "resource_group": "gpu",
    "mounts": ["data"],
    "env": {"YES": "yes", "NUM": "1.0", "NULL": "null", "DATE": "2030-01-01", "EMPTY": ""},
    "startup_command": "set -e\npython train.py --epochs 3\n",
    "depends_on": [],
    "starts_at": "2030-01-07T09:00:00+00:00",
    "batch_timeout": 3600,
    "roles": {
        "sub": {"replicas": 2, "image": "bai-kernel/worker:1", "resources": {"mem": "2g"}},
        "main": {"resources": {"cpu": 4}},
    },
}


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_export_then_import_changes_nothing(fmt):
    text = export_template_document(name="t", description="d: x", spec=TRICKY, fmt=fmt)
    document = parse_template_document(text, fmt)
    assert document == {"name": "t", "description": "d: x", "spec": TRICKY}
    again = export_template_document(
        name=document["name"], description=document["description"], spec=document["spec"], fmt=fmt
    )
    assert again == text


def test_the_export_lists_fields_in_the_launch_dialogs_order():
    text = export_template_document(name="t", description="", spec=TRICKY, fmt="yaml")
    spec = yaml.safe_load(text)["spec"]
    assert list(spec)[:3] == ["name", "image", "type"]
    assert list(spec["roles"]) == ["main", "sub"]
    assert list(spec["roles"]["sub"]) == ["image", "resources", "replicas"]


# Valid specs hold no NUL (the schema refuses it) and no lone surrogate.
_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20
)
_specs = st.fixed_dictionaries(
    {},
    optional={
        "image": _text.filter(bool),
        "env": st.dictionaries(_text, _text, max_size=4),
        "resources": st.dictionaries(_text, st.one_of(_text, st.integers(0, 10**12)), max_size=3),
        "mounts": st.lists(_text, max_size=3),
        "startup_command": _text,
        "cluster_size": st.integers(1, 64),
    },
)


@settings(max_examples=300, deadline=None)
@given(spec=_specs, description=_text, fmt=st.sampled_from(["yaml", "json"]))
@example(spec={"env": {"A": "x\u2028y"}}, description="\x85", fmt="yaml")
def test_any_valid_spec_survives_a_round_trip(spec, description, fmt):
    text = export_template_document(name="t", description=description, spec=spec, fmt=fmt)
    assert parse_template_document(text, fmt) == {
        "name": "t",
        "description": description,
        "spec": spec,
    }
