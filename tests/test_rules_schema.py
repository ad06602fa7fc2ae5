"""The JSON Schema for editors stays in sync with the rule model and accepts what the agent does."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "docs" / "rules.schema.json"


def test_shipped_schema_is_current_and_valid(sloguard_bin):
    generated = subprocess.run([sloguard_bin, "rules", "schema"], capture_output=True, text=True,
                               check=True, timeout=60).stdout
    assert json.loads(generated) == json.loads(SHIPPED.read_text()), (
        "docs/rules.schema.json is stale: regenerate it with `sloguard rules schema`")
    jsonschema.Draft202012Validator.check_schema(json.loads(generated))


def test_schema_accepts_the_shipped_rules_and_rejects_mistakes():
    schema = json.loads(SHIPPED.read_text())
    shipped = [*(ROOT / "rules").glob("*.yaml"), *(ROOT / "docs" / "rules-examples").glob("*.yaml")]
    for path in shipped:
        jsonschema.validate(yaml.safe_load(path.read_text()), schema)
    good = {"groups": [{"name": "g", "rules": [
        {"alert": "A", "expr": "m", "field": "v", "window": "1m30s", "for": 5}]}]}
    jsonschema.validate(good, schema)
    validator = jsonschema.Draft202012Validator(schema)
    for mistake in ({"window": "soon"}, {"severity": "urgent"}, {"colour": "red"},
                    {"alert": "has space"}):
        rule = {**good["groups"][0]["rules"][0], **mistake}
        assert list(validator.iter_errors({"groups": [{"name": "g", "rules": [rule]}]})), mistake
