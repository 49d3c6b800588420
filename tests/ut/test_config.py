"""Typed configuration: bad inputs give clear errors; valid ones round-trip."""

from __future__ import annotations

import pytest

from vllm_ascend_ext.config import (
    AscendExtConfig,
    AscendExtConfigError,
    SfaConfig,
    parse_config,
    schema_rows,
    to_dict,
)

BAD = [
    # (additional_config, substrings the message must contain)
    ({"ascend_ext": {"mixed_splt": "on"}}, ["unknown key 'mixed_splt'", "did you mean 'mixed_split'"]),
    ({"ascend_ext": {"mixedsplit": "on"}}, ["'mixedsplit'", "mixed_split"]),
    ({"ascend_ext": {"zzz": 1}}, ["unknown key 'zzz'", "allowed keys: layer_ops, mixed_split, moe_dispatch, sfa, weight_nz"]),
    ({"ascend_ext": {"weight_nz": "on"}}, ["ascend_ext.weight_nz", "invalid value 'on'", "'auto', 'off'"]),
    ({"ascend_ext": {"weight_nz": False}}, ["ascend_ext.weight_nz", "expected a str", "False (bool)"]),
    ({"ascend_ext": {"mixed_split": True}}, ["ascend_ext.mixed_split", "expected a str", "True (bool)"]),
    ({"ascend_ext": {"mixed_split": "false"}}, ["invalid value 'false'", "'auto', 'on', 'off'"]),
    ({"ascend_ext": {"mixed_split": "On"}}, ["invalid value 'On'", "did you mean 'on'"]),
    ({"ascend_ext": {"mixed_split": 1}}, ["expected a str", "1 (int)"]),
    ({"ascend_ext": {"mixed_split": None}}, ["expected a str", "None (NoneType)"]),
    ({"ascend_ext": {"sfa": "prolog_v3"}}, ["ascend_ext.sfa", "expected an object", "str"]),
    ({"ascend_ext": {"sfa": {"preprocess": "prolog"}}}, ["ascend_ext.sfa.preprocess", "did you mean 'prolog_v3'"]),
    ({"ascend_ext": {"sfa": {"prepocess": "auto"}}}, ["ascend_ext.sfa", "unknown key 'prepocess'", "did you mean 'preprocess'"]),
    ({"ascend_ext": {"sfa": {"preprocess": False}}}, ["expected a str", "False (bool)"]),
    ({"ascend_ext": ["mixed_split"]}, ["ascend_ext: expected an object", "list"]),
    ({"ascend_ext": "on"}, ["ascend_ext: expected an object", "str"]),
    ({"ascend_ext": {1: "on"}}, ["keys must be strings"]),
    ("ascend_ext", ["additional_config: expected an object"]),
]


@pytest.mark.parametrize("raw,needles", BAD)
def test_bad_input_names_key_value_and_allowed(raw, needles):
    with pytest.raises(AscendExtConfigError) as info:
        parse_config(raw)
    for needle in needles:
        assert needle in str(info.value), str(info.value)


@pytest.mark.parametrize("raw,expected", [
    (None, AscendExtConfig()),
    ({}, AscendExtConfig()),
    ({"other_plugin": {"x": 1}, "kv_transfer": 3}, AscendExtConfig()),  # not ours: untouched
    ({"ascend_ext": {}}, AscendExtConfig()),
    ({"ascend_ext": {"mixed_split": "off"}}, AscendExtConfig(mixed_split="off")),
    ({"ascend_ext": {"weight_nz": "off"}}, AscendExtConfig(weight_nz="off")),
    ({"ascend_ext": {"mixed_split": "on", "sfa": {"preprocess": "native"}}},
     AscendExtConfig(mixed_split="on", sfa=SfaConfig(preprocess="native"))),
])
def test_valid_configs_parse_and_round_trip(raw, expected):
    cfg = parse_config(raw)
    assert cfg == expected
    assert parse_config({"ascend_ext": to_dict(cfg)}) == cfg


def test_config_is_frozen_and_defaults_documented():
    cfg = parse_config(None)
    with pytest.raises(AttributeError):
        cfg.mixed_split = "on"  # type: ignore[misc]
    assert cfg.mixed_split == "auto" and cfg.sfa.preprocess == "auto" and cfg.weight_nz == "auto"
    assert cfg.layer_ops == "fused" and cfg.moe_dispatch == "auto"
    names = [r[0] for r in schema_rows()]
    assert names == ["ascend_ext.mixed_split", "ascend_ext.weight_nz", "ascend_ext.layer_ops",
                     "ascend_ext.moe_dispatch", "ascend_ext.sfa.preprocess"]
