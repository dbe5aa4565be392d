"""Session templates without a database: merging launch overrides field by
field, parsing YAML/JSON documents with errors that name the field and the
line, and export → import round trips that change nothing."""

from __future__ import annotations

import json
import time

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


# --- hostile documents: refused with the field and the line, at bounded cost --------------------

DEEP = 20_000


@pytest.mark.parametrize(
    "text, fmt, field, words",
    [
        pytest.param(
            'name: t\nspec: !!python/object/apply:os.system ["ls"]\n',
            "yaml",
            "spec",
            "line 2: the tag !!python/object/apply:os.system is not allowed",
            id="a python tag",
        ),
        pytest.param(
            "name: t\nspec:\n  ? !!python/name:os.system\n  : 1\n",
            "yaml",
            "spec",
            "line 3: the tag !!python/name:os.system",
            id="a python tag on a key",
        ),
        pytest.param(
            "name: !secret t\nspec: {}\n", "yaml", "name", "the tag !secret", id="a local tag"
        ),
        pytest.param(
            "name: t\nspec:\n  env: !!binary aGVsbG8=\n",
            "yaml",
            "spec.env",
            "!!binary",
            id="binary",
        ),
        pytest.param(
            "name: t\nspec:\n  cluster_size: !!int two\n",
            "yaml",
            "spec.cluster_size",
            "line 3: 'two' is not a valid int",
            id="an int tag on a word",
        ),
        pytest.param(
            "name: t\nspec:\n  ? [a]\n  : 1\n",
            "yaml",
            "spec",
            "a key must be a plain value",
            id="a list as a key",
        ),
        pytest.param(
            "name: t\nspec:\n  cluster_size: " + "9" * 5000 + "\n",
            "yaml",
            "spec.cluster_size",
            "line 3: a number of 5000 digits; at most 300",
            id="a 5,000-digit integer",
        ),
        pytest.param(
            '{"name": "t",\n "spec": {"cluster_size": ' + "9" * 5000 + "}}",
            "json",
            "spec.cluster_size",
            "line 2: a number of 5000 digits",
            id="a 5,000-digit JSON integer",
        ),
        pytest.param(
            "name: t\nspec:\n  batch_timeout: .inf\n",
            "yaml",
            "spec.batch_timeout",
            "line 3: .inf is not a finite number",
            id=".inf",
        ),
        pytest.param(
            "name: t\nspec:\n  resources: {cpu: .nan}\n",
            "yaml",
            "spec.resources.cpu",
            ".nan is not a finite number",
            id=".nan",
        ),
        pytest.param(
            "name: t\nspec:\n  batch_timeout: 1.0e+309\n",
            "yaml",
            "spec.batch_timeout",
            "1.0e+309 is not a finite number",
            id="a YAML float beyond range",
        ),
        pytest.param(
            '{"name": "t", "spec": {"batch_timeout": NaN}}',
            "json",
            "spec.batch_timeout",
            "line 1: NaN is not a number",
            id="NaN",
        ),
        pytest.param(
            '{"name": "t", "spec": {"resources": {"cpu": -Infinity}}}',
            "json",
            "spec.resources.cpu",
            "-Infinity is not a number",
            id="-Infinity",
        ),
        pytest.param(
            '{"name": "t",\n "spec": {"batch_timeout": 1e309}}',
            "json",
            "spec.batch_timeout",
            "line 2: 1e309 is out of range",
            id="1e309",
        ),
        pytest.param(
            "name: t\nspec:\n  env: " + "[" * DEEP + "]" * DEEP + "\n",
            "yaml",
            "document",
            "line 3: nested deeper than 32 levels",
            id="20,000-deep YAML",
        ),
        pytest.param(
            "- " * DEEP + "x\n",
            "yaml",
            "document",
            "nested deeper than 32",
            id="20,000-deep YAML blocks",
        ),
        pytest.param(
            '{"name": "t", "spec": {"env": ' + "[" * DEEP + "]" * DEEP + "}}",
            "json",
            "document",
            "line 1: nested deeper than 32 levels",
            id="20,000-deep JSON",
        ),
        pytest.param(
            'name: "a\\r\\nb"\nspec: {}\n',
            "yaml",
            "name",
            "line 1: must not contain line breaks",
            id="CR/LF in the name",
        ),
        pytest.param(
            'name: "ab\\n"\nspec: {}\n',
            "yaml",
            "name",
            "must not contain line breaks",
            id="a final newline in the name",
        ),
        pytest.param(
            'name: t\ndescription: "\\0"\nspec: {}\n',
            "yaml",
            "description",
            "NUL",
            id="NUL in the description",
        ),
        pytest.param(
            'name: t\nspec:\n  env: {A: "x\\0"}\n',
            "yaml",
            "spec.env.A",
            "line 3: A: the value holds a NUL",
            id="NUL in env",
        ),
        pytest.param(
            '{"name": "t", "spec": {"env": {"A\\u0000": "x"}}}',
            "json",
            "spec.env",
            "a name must not hold a NUL",
            id="NUL in an env name",
        ),
        pytest.param(
            '{"name": "t", "spec": {"startup_command": "ls\\u0000"}}',
            "json",
            "spec.startup_command",
            "must not contain a NUL character",
            id="NUL in the start command",
        ),
        pytest.param(
            '{"name": "t", "spec": {"startup_command": "ls \\ud800"}}',
            "json",
            "spec.startup_command",
            "invalid Unicode",
            id="a lone surrogate in the start command",
        ),
        pytest.param(
            "name: t\nspec: {}\n\ud800",
            "yaml",
            "document",
            "lone surrogate",
            id="a lone surrogate in the text",
        ),
        pytest.param("x" * 70_000, "yaml", "document", "at most 65536 characters", id="too long"),
    ],
)
def test_a_hostile_document_is_refused_naming_the_field(text, fmt, field, words):
    error = refusal(text, fmt)
    assert field in error.fields, error.fields
    assert words in " ".join(error.fields[field]), error.fields


def _refused_within(seconds: float, text: str, fmt: str = "yaml") -> InvalidInput:
    # CPU time of this process, not wall time: a busy machine must not fail the bound.
    started = time.process_time()
    error = refusal(text, fmt)
    assert time.process_time() - started < seconds
    return error


FORTY_KB = 40 * 1024


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("[" * FORTY_KB, id="brackets"),
        pytest.param("{a: " * (FORTY_KB // 4), id="flow mappings"),
        pytest.param("- " * (FORTY_KB // 2), id="block sequences"),
        pytest.param("".join(" " * i + "a:\n" for i in range(280)), id="indentation"),
        pytest.param("[" + ",".join(["1"] * (FORTY_KB // 2)) + "]", id="20,000 numbers"),
        pytest.param("[" + ",".join(["1.5e3"] * (FORTY_KB // 6)) + "]", id="7,000 floats"),
        pytest.param(
            "name: t\nspec:\n  env:\n" + "".join(f"    K{i}: v\n" for i in range(3200)),
            id="3,200 keys",
        ),
    ],
)
def test_a_40_kb_hostile_yaml_is_refused_in_well_under_a_second(text):
    # 24 s of CPU before the depth bound; the bound here is generous for a shared 2-core machine.
    assert len(text) <= FORTY_KB + 1024
    _refused_within(2.0, text)


def test_a_deep_json_document_is_refused_before_it_is_decoded():
    _refused_within(2.0, "[" * 60_000 + "]" * 5_000, "json")


@pytest.mark.parametrize("text", ["?", "{? : 1}", "- ?\n"])
def test_an_empty_key_is_an_unknown_field_not_a_crash(text):
    assert refusal(text).fields


def test_every_key_is_a_name_even_one_yaml_would_read_as_a_boolean_or_a_number():
    text = 'name: t\nspec:\n  env: {ON: "1", 1: "2", null: "3"}\n'
    env = parse_template_document(text, "yaml")["spec"]["env"]
    assert env == {"ON": "1", "1": "2", "null": "3"}


def test_refusals_cut_a_long_bad_value_short():
    error = refusal("[" + ",".join(["1"] * 20_000) + "]")
    assert len(error.message) < 300
